#!/usr/bin/env python3
"""Both ends of the awkward socket cases sockmap users hit, for
accel_cases_test.go. Every client case checks what it received itself and
prints one JSON object: {"errors": [...], ...details}; an empty error list
means the bytes (and the way they arrived) were right.

usage:
  accel_peer.py server PORT          threaded server; each connection starts
                                     with a header line naming its mode
  accel_peer.py dier PORT            accepts connections and reads forever,
                                     after printing "pid N" (the test kills it)
  accel_peer.py client HOST PORT CASE [ARGS...]
"""
import hashlib
import json
import os
import random
import resource
import select
import socket
import struct
import sys
import tempfile
import threading
import time

SO_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", 18)
MSG = 16  # size of one framed "tick" message


def pattern(n):
    """Deterministic bytes both ends can compute: no checksum exchange
    needed to know what should have arrived."""
    return random.Random(n).randbytes(n)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def raise_nofile():
    # 1000+ held connections need more descriptors than a 1024 soft limit.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def recv_eof(s):
    buf = bytearray()
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            return bytes(buf)
        buf += chunk


def read_line(s):
    # One byte at a time: nothing after the header may be consumed here.
    line = bytearray()
    while not line.endswith(b"\n"):
        c = s.recv(1)
        if not c:
            break
        line += c
    return line.decode().strip()


# ---------------------------------------------------------------- server


def handle(conn):
    try:
        words = read_line(conn).split()
        if not words:
            return
        mode, args = words[0], words[1:]
        if mode == "ping":  # readiness: `shunt lab probe --send 'ping\n'`
            conn.sendall(b"pong\n")
        elif mode == "echo":
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    break
                conn.sendall(data)
        elif mode == "sha":  # sha N: read exactly N bytes, answer their checksum
            data = recv_exact(conn, int(args[0]))
            conn.sendall(("%d %s\n" % (len(data), sha(data))).encode())
            recv_eof(conn)
        elif mode == "src":  # src N send|sendfile: send pattern(N), then close
            n = int(args[0])
            if args[1] == "sendfile":
                with tempfile.TemporaryFile() as f:
                    f.write(pattern(n))
                    f.flush()
                    off = 0
                    while off < n:
                        off += os.sendfile(conn.fileno(), f.fileno(), off, n - off)
            else:
                conn.sendall(pattern(n))
        elif mode == "half":  # read to EOF, answer, close
            data = recv_eof(conn)
            conn.sendall(("%d %s\n" % (len(data), sha(data))).encode())
        elif mode == "lowat":  # lowat L: blocking reads with SO_RCVLOWAT L to EOF
            conn.setsockopt(socket.SOL_SOCKET, SO_RCVLOWAT, int(args[0]))
            sizes = []
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                sizes.append(len(data))
            conn.sendall((json.dumps(sizes) + "\n").encode())
        elif mode == "tick":  # tick COUNT INTERVAL: spaced fixed-size messages
            for i in range(int(args[0])):
                time.sleep(float(args[1]))
                conn.sendall(("tick-%010d\n" % i).encode())
            recv_eof(conn)
        elif mode == "rst":  # rst N: read N bytes, then abort (RST, not FIN)
            recv_exact(conn, int(args[0]))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif mode == "rr":  # one request line, one reply line, then wait for EOF
            req = read_line(conn)
            conn.sendall(("ok %s\n" % req).encode())
            recv_eof(conn)
    except OSError:
        pass
    finally:
        conn.close()


def server(port, each):
    raise_nofile()
    threading.stack_size(256 << 10)  # 1000+ threads at once
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(4096)
    print("pid %d" % os.getpid(), flush=True)
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=each, args=(conn,), daemon=True).start()


def discard(conn):
    try:
        while conn.recv(1 << 20):
            pass
    except OSError:
        pass


# ---------------------------------------------------------------- clients


def dial(host, port, header, timeout=10):
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall((header + "\n").encode())
    return s


def case_sizes(host, port, out):
    """1 B and 8 MiB each way through an echo: the 8 MiB is read by a
    second thread while it is being sent, or both ends would fill up."""
    for n in (1, 8 << 20):
        s = dial(host, port, "echo")
        data = pattern(n)
        got = {}

        def reader():
            got["data"] = recv_exact(s, n)

        t = threading.Thread(target=reader)
        t.start()
        s.sendall(data)
        t.join()
        if got["data"] != data:
            out["errors"].append("echo of %d bytes: got %d bytes, sha %s, want %s" % (
                n, len(got["data"]), sha(got["data"]), sha(data)))
        s.close()
        # server -> client alone, with no send of ours in flight.
        s = dial(host, port, "src %d send" % n)
        back = recv_eof(s)
        if back != pattern(n):
            out["errors"].append("%d bytes from the server: got %d bytes" % (n, len(back)))
        s.close()


def case_more(host, port, out):
    """Pieces with MSG_MORE (the kernel may hold them back) and then the
    rest without it; then a non-blocking socket with a 4 KiB send buffer,
    sending 256 KiB at a time and carrying on from whatever each send took.
    On the stack those sends are partial; accelerated, tcp_bpf hands the
    send-buffer charge back as soon as the bytes sit in the peer's queue,
    so they usually go whole ("partial_sends" says how many were not)."""
    n = 1 << 20
    data = pattern(n)
    s = dial(host, port, "sha %d" % n)
    pieces = [1, 7, 100, 1000, 4096, 65536, 3]
    off = 0
    for p in pieces:
        s.send(data[off:off + p], socket.MSG_MORE)
        off += p
    s.sendall(data[off:])
    want = "%d %s" % (n, sha(data))
    if (got := s.makefile().readline().strip()) != want:
        out["errors"].append("MSG_MORE pieces: server got %r, want %r" % (got, want))
    s.close()

    s = dial(host, port, "sha %d" % n)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    s.setblocking(False)
    off, partial = 0, 0
    deadline = time.time() + 10
    while off < n and time.time() < deadline:
        select.select([], [s], [], 1)
        try:
            k = s.send(data[off:off + 256 * 1024])
        except BlockingIOError:
            continue
        partial += k < min(256 * 1024, n - off)
        off += k
    s.setblocking(True)
    s.settimeout(10)
    got = s.makefile().readline().strip()
    if got != want:
        out["errors"].append("non-blocking partial sends: server got %r, want %r (sent %d)" % (got, want, off))
    out["partial_sends"] = partial
    s.close()


def case_sendfile(host, port, out):
    """os.sendfile (splice of page-cache pages) both ways."""
    n = 4 << 20
    data = pattern(n)
    s = dial(host, port, "sha %d" % n)
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        off = 0
        while off < n:
            off += os.sendfile(s.fileno(), f.fileno(), off, n - off)
    want = "%d %s" % (n, sha(data))
    if (got := s.makefile().readline().strip()) != want:
        out["errors"].append("sendfile to the server: it got %r, want %r" % (got, want))
    s.close()
    s = dial(host, port, "src %d sendfile" % n)
    back = recv_eof(s)
    if back != data:
        out["errors"].append("sendfile from the server: got %d bytes, sha %s, want %s" % (len(back), sha(back), sha(data)))
    s.close()


def case_half(host, port, out):
    """shutdown(SHUT_WR) right after the data: the server must see all of it
    and then EOF, and its reply must still come back on the open half."""
    n = 300000
    data = pattern(n)
    s = dial(host, port, "half")
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    reply = recv_eof(s).decode().strip()
    want = "%d %s" % (n, sha(data))
    if reply != want:
        out["errors"].append("half-close: server answered %r, want %r" % (reply, want))
    s.close()


def case_lowat(host, port, out):
    """40 sends of 50 bytes, 5 ms apart, to a receiver with SO_RCVLOWAT
    1000: each blocking recv must wait for 1000 bytes (TCP's contract),
    except the one that ends at EOF. The data ends with shutdown(SHUT_WR)
    because TCP wakes a sleeping reader only once SO_RCVLOWAT bytes are
    queued (tcp_data_ready), so a tail under 1000 would never be read."""
    s = dial(host, port, "lowat 1000")
    for i in range(40):
        s.sendall(b"x" * 50)
        time.sleep(0.005)
    s.shutdown(socket.SHUT_WR)
    sizes = json.loads(s.makefile().readline())
    out["sizes"] = sizes
    if sum(sizes) != 2000 or any(k < 1000 for k in sizes[:-1]):
        out["errors"].append("SO_RCVLOWAT 1000: recv sizes %s, want each but the last >= 1000" % sizes)
    s.close()


def case_poll(host, port, out):
    """20 messages 30 ms apart: select and epoll, each with a 2 s timeout,
    must wake for every one (a missed wake-up shows as a timeout)."""
    for how in ("epoll", "select"):
        s = dial(host, port, "tick 20 0.03")
        s.setblocking(False)
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLIN)
        buf, wakes, slow = bytearray(), 0, 0
        while len(buf) < 20 * MSG:
            t0 = time.time()
            ready = ep.poll(2) if how == "epoll" else select.select([s], [], [], 2)[0]
            if not ready:
                out["errors"].append("%s: no wake-up within 2 s after %d bytes" % (how, len(buf)))
                break
            wakes += 1
            slow += time.time() - t0 > 0.5
            try:
                chunk = s.recv(4096)
            except BlockingIOError:
                continue  # a wake-up without data: allowed, not counted as one
            if not chunk:
                out["errors"].append("%s: EOF after %d bytes" % (how, len(buf)))
                break
            buf += chunk
        want = b"".join(b"tick-%010d\n" % i for i in range(20))
        if bytes(buf) != want and not out["errors"]:
            out["errors"].append("%s: got %r" % (how, bytes(buf)[:80]))
        if slow:
            out["errors"].append("%s: %d wake-ups took over 0.5 s for a message sent every 30 ms" % (how, slow))
        out[how + "_wakes"] = wakes
        ep.close()
        s.close()


def case_rst(host, port, out):
    """The server aborts (SO_LINGER 0) after reading 1000 bytes: a client
    blocked in recv, with a 10 s timeout, must see ECONNRESET or EOF at
    once rather than time out."""
    s = dial(host, port, "rst 1000")
    s.sendall(b"y" * 1000)
    t0 = time.time()
    try:
        r = s.recv(100)
        out["result"] = "eof" if not r else "data"
    except socket.timeout:
        out["result"] = "timeout"
    except OSError as e:
        out["result"] = e.__class__.__name__
    out["seconds"] = round(time.time() - t0, 3)
    if out["result"] not in ("eof", "ConnectionResetError") or out["seconds"] > 2:
        out["errors"].append("aborted server: client recv gave %s after %.3f s" % (out["result"], out["seconds"]))
    s.close()


def case_die(host, port, out):
    """Against `dier`: one connection blocked in recv, one sending all the
    time. Prints "started" once both run; the test then kills the server.
    Both must end (error or EOF) well before their 10 s timeouts."""
    res = {}

    def reader():
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"r")
        try:
            r = s.recv(100)
            res["reader"] = "eof" if not r else "data"
        except socket.timeout:
            res["reader"] = "timeout"
        except OSError as e:
            res["reader"] = e.__class__.__name__
        res["reader_at"] = time.time()

    def writer():
        s = socket.create_connection((host, port), timeout=10)
        chunk = b"w" * 65536
        try:
            while True:
                s.sendall(chunk)
        except socket.timeout:
            res["writer"] = "timeout"
        except OSError as e:
            res["writer"] = e.__class__.__name__
        res["writer_at"] = time.time()

    ts = [threading.Thread(target=f) for f in (reader, writer)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    print("started", flush=True)
    for t in ts:
        t.join()
    out.update(res)
    out["done_at"] = time.time()
    for k in ("reader", "writer"):
        if res.get(k) == "timeout":
            out["errors"].append("%s hung until its timeout after the server died" % k)


def case_many(host, port, out, n):
    """n connections held at once (the test looks at the sockhash while
    they are), one request/response on each, then all closed."""
    raise_nofile()
    socks = []
    for i in range(n):
        socks.append(dial(host, port, "rr"))
    print("held %d" % len(socks), flush=True)
    sys.stdin.readline()  # the test has looked
    bad = 0
    for i, s in enumerate(socks):
        s.sendall(b"req-%d\n" % i)
    for i, s in enumerate(socks):
        if s.makefile().readline() != "ok req-%d\n" % i:
            bad += 1
    for s in socks:
        s.close()
    if bad:
        out["errors"].append("%d of %d held connections answered wrongly" % (bad, n))
    out["held"] = n


def case_churn(host, port, out, n):
    """n short connections one after the other: connect, one
    request/response, close."""
    bad = 0
    for i in range(n):
        s = dial(host, port, "rr")
        s.sendall(b"c-%d\n" % i)
        if s.makefile().readline() != "ok c-%d\n" % i:
            bad += 1
        s.close()
    if bad:
        out["errors"].append("%d of %d short connections answered wrongly" % (bad, n))
    out["connections"] = n


CASES = {
    "sizes": case_sizes, "more": case_more, "sendfile": case_sendfile, "half": case_half,
    "lowat": case_lowat, "poll": case_poll, "rst": case_rst, "die": case_die,
}


def main():
    role = sys.argv[1]
    if role == "server":
        server(int(sys.argv[2]), handle)
    elif role == "dier":
        server(int(sys.argv[2]), discard)
    else:
        host, port, case, args = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
        out = {"errors": []}
        try:
            if case == "many":
                case_many(host, port, out, int(args[0]))
            elif case == "churn":
                case_churn(host, port, out, int(args[0]))
            else:
                CASES[case](host, port, out)
        except OSError as e:
            out["errors"].append("%s: %r" % (case, e))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
