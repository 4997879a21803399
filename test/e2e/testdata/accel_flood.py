#!/usr/bin/env python3
"""A fast writer against a slow reader, for socket acceleration's backpressure
(test/e2e/accel_flood_test.go).

  read PORT SLOW_S          accept one connection, read slowly (16 KiB every
                            10 ms) for SLOW_S seconds, then drain it fast to EOF;
                            print {"bytes", "crc"} of what arrived
  relay PORT TARGET_PORT    accept one connection, connect to 127.0.0.1:TARGET_PORT
                            and copy both ways with 64 KiB reads and blocking
                            writes (a userspace proxy on the pod's loopback)
  write HOST PORT TOTAL MODE SLOW_S
                            send TOTAL bytes in 64 KiB writes, MODE "block" (a
                            blocking socket) or "nonblock" (EAGAIN waits in
                            select); print {"bytes", "crc", "errors",
                            "sent_while_slow"}: sent_while_slow is what the
                            socket had taken half way through the reader's
                            slow phase, which backpressure must bound

Every chunk starts with its sequence number, so a reordering changes the CRC.
"""
import errno, json, select, socket, struct, sys, threading, time, zlib

CHUNK = 64 << 10
PATTERN = bytes((i * 7 + 3) & 0xFF for i in range(CHUNK))


def chunk(i):
    return struct.pack("<Q", i) + PATTERN[8:]


def listen(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4)
    print("listening", flush=True)
    return s


def read(port, slow):
    c, _ = listen(port).accept()
    crc, n = 0, 0
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    end = time.monotonic() + slow
    while time.monotonic() < end:
        got = c.recv_into(view[:16 << 10])
        if not got:
            break
        crc, n = zlib.crc32(view[:got], crc), n + got
        time.sleep(0.01)
    while True:
        got = c.recv_into(view)
        if not got:
            break
        crc, n = zlib.crc32(view[:got], crc), n + got
    print(json.dumps({"bytes": n, "crc": crc}), flush=True)


def relay(port, target):
    c, _ = listen(port).accept()
    u = socket.create_connection(("127.0.0.1", target))
    errors, quirks = [], []

    def copy(src, dst, name):
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        try:
            while True:
                try:
                    got = src.recv_into(view)
                except BlockingIOError:
                    # A blocking recv must not say EAGAIN; an accelerated
                    # one does when the peer's FIN wakes it (see the test).
                    quirks.append("relay %s: blocking recv returned EAGAIN" % name)
                    select.select([src], [], [], 10)
                    continue
                if not got:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(view[:got])
        except OSError as e:
            errors.append("relay %s: %s" % (name, e))

    back = threading.Thread(target=copy, args=(u, c, "reader->writer"))
    back.start()
    copy(c, u, "writer->reader")
    back.join()
    print(json.dumps({"errors": errors, "quirks": quirks}), flush=True)


def write(host, port, total, mode, slow):
    s = socket.create_connection((host, port))
    sent, crc, errors = 0, 0, []
    progress = {}
    # Half way through the reader's slow phase: how much did the socket take?
    timer = threading.Timer(slow / 2, lambda: progress.setdefault("sent", sent))
    timer.start()
    if mode == "nonblock":
        s.setblocking(False)
    i = 0
    try:
        while sent < total:
            data = memoryview(chunk(i))
            crc = zlib.crc32(data, crc)
            i += 1
            while data:
                try:
                    n = s.send(data)
                except BlockingIOError:
                    select.select([], [s], [], 10)
                    continue
                data, sent = data[n:], sent + n
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        errors.append("send after %d bytes: %s (errno %s)" % (sent, e.strerror, errno.errorcode.get(e.errno, e.errno)))
    timer.cancel()
    print(json.dumps({"bytes": sent, "crc": crc, "errors": errors, "sent_while_slow": progress.get("sent", sent)}), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "read":
        read(int(a[1]), float(a[2]))
    elif a[0] == "relay":
        relay(int(a[1]), int(a[2]))
    elif a[0] == "write":
        write(a[1], int(a[2]), int(a[3]), a[4], float(a[5]))
    else:
        sys.exit("usage: see the docstring")
