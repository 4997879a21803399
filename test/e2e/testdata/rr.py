#!/usr/bin/env python3
"""Request/response on one held TCP connection, redis-style: send a
request, read the whole reply, check it, repeat. Against `shunt lab serve
--tcp`, which answers every read with "NAME <bytes read>".

usage: rr.py HOST PORT COUNT INTERVAL_SECONDS
prints JSON: {"sent": N, "ok": N, "error": "..."}
"""
import json
import socket
import sys
import time


def main():
    host, port, count, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    out = {"sent": 0, "ok": 0, "error": ""}
    try:
        s = socket.create_connection((host, port), timeout=3)
        for i in range(count):
            req = ("req-%d" % i).encode()
            s.sendall(req)
            out["sent"] += 1
            reply = s.recv(4096).decode()
            if not reply.endswith(" " + req.decode()):
                out["error"] = "reply %r to %r" % (reply, req)
                break
            out["ok"] += 1
            time.sleep(interval)
        s.close()
    except OSError as e:
        out["error"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
