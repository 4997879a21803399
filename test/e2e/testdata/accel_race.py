#!/usr/bin/env python3
"""Connection patterns for the socket acceleration race tests, against
`shunt lab serve --tcp` (answers every read with "NAME <bytes read>").

  accel_race.py churn HOST PORT SECONDS
      new connections back to back for SECONDS, each: connect, one
      request, one reply, close. Prints JSON: a list of
      {"start": unix time, "ok": bool, "error": str}.
  accel_race.py reuse HOST PORT SRCPORT
      one connection from SRCPORT (SO_REUSEADDR), one request and reply,
      then a close with SO_LINGER 0 (RST, so no TIME_WAIT keeps the port).
      Prints JSON {"ok": bool, "error": str}.
  accel_race.py loopback SRCPORT PORT TAG COUNT
      in this namespace: a server on 127.0.0.1:PORT and a client bound to
      127.0.0.1:SRCPORT, COUNT round trips of TAG-tagged messages, checking
      every reply is this namespace's. Prints JSON {"ok": N, "error": str}.
"""
import json
import socket
import struct
import sys
import threading
import time


def one(host, port, src=None, timeout=0.5):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        if src:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", src))
        s.connect((host, port))
        s.sendall(b"ping")
        reply = s.recv(4096)
        if not reply.endswith(b" ping"):
            raise OSError("reply %r" % reply)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return True, ""
    except OSError as e:
        return False, str(e)
    finally:
        s.close()


def churn(host, port, seconds):
    out, end = [], time.time() + seconds
    while time.time() < end:
        start = time.time()
        ok, err = one(host, port)
        out.append({"start": start, "ok": ok, "error": err})
    print(json.dumps(out))


def reuse(host, port, src):
    ok, err = one(host, port, src=src, timeout=1.5)
    print(json.dumps({"ok": ok, "error": err}))


def loopback(src, port, tag, count):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)

    def echo():
        c, _ = srv.accept()
        while True:
            b = c.recv(4096)
            if not b:
                break
            c.sendall(tag.encode() + b":" + b)
        c.close()

    threading.Thread(target=echo, daemon=True).start()
    out = {"ok": 0, "error": ""}
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", src))
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", port))
        for i in range(count):
            msg = ("%s-%d" % (tag, i)).encode()
            s.sendall(msg)
            reply = s.recv(4096)
            if reply != tag.encode() + b":" + msg:
                out["error"] = "reply %r to %r" % (reply, msg)
                break
            out["ok"] += 1
            time.sleep(0.05)
    except OSError as e:
        out["error"] = str(e)
    s.close()
    print(json.dumps(out))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "churn":
        churn(args[0], int(args[1]), float(args[2]))
    elif cmd == "reuse":
        reuse(args[0], int(args[1]), int(args[2]))
    elif cmd == "loopback":
        loopback(int(args[0]), int(args[1]), args[2], int(args[3]))
    else:
        sys.exit("unknown command " + cmd)
