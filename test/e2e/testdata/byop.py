#!/usr/bin/env python3
"""A third-party transparent proxy, as sidecars run behind iptables REDIRECT:
it learns where each connection was going with getsockopt(SOL_IP,
SO_ORIGINAL_DST), connects there itself with SO_MARK set so shunt does not
redirect it back, logs the original destination, and relays bytes.

usage: byop.py LISTEN_PORT MARK LOGFILE
"""
import socket
import struct
import sys
import threading

SO_ORIGINAL_DST = 80
SO_MARK = 36


def relay(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def handle(conn, mark, log):
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, = struct.unpack("!H", raw[2:4])
    ip = socket.inet_ntoa(raw[4:8])
    up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    up.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
    up.connect((ip, port))
    with open(log, "a") as f:
        f.write(f"orig={ip}:{port} upstream={up.getpeername()[0]}:{up.getpeername()[1]}\n")
    threading.Thread(target=relay, args=(conn, up), daemon=True).start()
    relay(up, conn)


def main():
    port, mark, log = int(sys.argv[1]), int(sys.argv[2], 0), sys.argv[3]
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn, mark, log), daemon=True).start()


if __name__ == "__main__":
    main()
