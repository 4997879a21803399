#!/usr/bin/env python3
"""Conntrack table pressure: idle established connections, and a SYN flood.
Used by the e2e test TestSYNFloodKeepsEstablished and by bench/run ctflood.

  ctflood.py pods
      prints the lab pods: server (ctflood.py serve 7000), client, flooder.
  ctflood.py policy
      prints NetworkPolicies that admit new connections to the server
      from the flooder only, and none to the client: a held connection
      whose conntrack entry is lost is refused both ways (one admitted
      either way would be recorded again from its next packet).
  ctflood.py serve PORT
      a TCP server that answers every read with "ok" and sends nothing
      else: no keepalive probes (Go's, as in `shunt lab serve`, come every
      15 s and would open a lost connection again from the server's side,
      hiding what a flood did to conntrack).
  ctflood.py hold HOST PORT N
      opens N TCP connections to HOST:PORT and exchanges one message on
      each, prints {"held": N} and then, for every line read from stdin
      ("check"), exchanges one more message on every connection at once and
      prints {"ok": K, "failed": N-K} (a connection whose reply does not
      come within 3 s failed). Ends at the end of stdin.
  ctflood.py flood HOST PORTS COUNT
      sends COUNT TCP SYNs from raw sockets (CAP_NET_RAW) to HOST, to the
      comma-separated PORTS in turn, from source ports 1024-65535 in turn,
      so every SYN is a new connection until the tuples wrap; one sender
      per CPU, each with its own source ports. Nothing answers the SYN-ACKs
      (the kernel resets them), nothing is ever established. Prints
      {"sent": COUNT, "seconds": S, "rate": SYN/s, "cpus": senders}.
"""
import errno
import json
import multiprocessing
import os
import select
import socket
import socketserver
import struct
import sys
import time

CHECK_TIMEOUT = 3.0


def exchange_all(conns, timeout):
    """Sends one message on every connection; returns how many answered."""
    pending = {}
    for c in conns:
        try:
            c.send(b"ping")
            pending[c.fileno()] = c
        except OSError:
            pass
    ok = 0
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(list(pending.values()), [], [], left)
        for c in ready:
            del pending[c.fileno()]
            try:
                if c.recv(4096):
                    ok += 1
            except OSError:
                pass
    return ok


def hold(host, port, n):
    conns = []
    for _ in range(n):
        c = socket.create_connection((host, port), timeout=5)
        c.setblocking(True)
        conns.append(c)
    if exchange_all(conns, CHECK_TIMEOUT) != n:
        print(json.dumps({"error": "not every connection answered before the flood"}), flush=True)
        sys.exit(1)
    print(json.dumps({"held": n}), flush=True)
    for _ in sys.stdin:
        ok = exchange_all(conns, CHECK_TIMEOUT)
        print(json.dumps({"ok": ok, "failed": n - ok}), flush=True)


PODS = """\
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers: [{name: serve, command: ["python3", "%s", "serve", "7000"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers: [{name: idle, command: ["sleep", "infinity"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: flooder, labels: {app: flooder}}
spec:
  containers: [{name: idle, command: ["sleep", "infinity"]}]
"""

POLICY = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-flooder}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: flooder}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: nothing-into-client}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Ingress]
"""


def serve(port):
    class Answer(socketserver.BaseRequestHandler):
        def handle(self):
            while self.request.recv(4096):
                self.request.sendall(b"ok")

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 1024  # the holder connects all at once (the default, 5, drops its handshakes)

    with Server(("0.0.0.0", port), Answer) as srv:
        srv.serve_forever()


def checksum_sum(data):
    """The one's complement sum of 16-bit words, folded, not inverted."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def flood_worker(args):
    """One CPU's share of the flood: source ports first + k * step."""
    host, ports, count, cpu, first, step = args
    os.sched_setaffinity(0, {cpu})
    dst = socket.inet_aton(host)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((host, 9))
    src = socket.inet_aton(probe.getsockname()[0])
    probe.close()
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it hears every TCP packet: drop them
    seq = 0x5EED
    # Per destination port, the checksum sum with source port 0; a source
    # port adds itself to it (one's complement), so no packet is summed whole.
    bases = []
    for p in ports:
        hdr = struct.pack("!HHIIBBHHH", 0, p, seq, 0, 5 << 4, 0x02, 64240, 0, 0)
        pseudo = src + dst + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(hdr))
        bases.append((p, checksum_sum(pseudo + hdr)))
    pack = struct.Struct("!HHIIBBHHH").pack
    sendto = raw.sendto
    addr = (host, 0)
    sport = first
    sent = 0
    start = time.monotonic()
    while sent < count:
        for p, base in bases:
            if sent == count:
                break
            s = base + sport
            s = (s & 0xFFFF) + (s >> 16)
            try:
                sendto(pack(sport, p, seq, 0, 5 << 4, 0x02, 64240, ~s & 0xFFFF, 0), addr)
            except OSError as e:  # ENOBUFS: the device queue is full, try again
                if e.errno != errno.ENOBUFS:
                    raise
                continue
            sent += 1
        sport += step
        if sport > 65535:
            sport = first
    return sent, time.monotonic() - start


def flood(host, ports, count):
    # One sender per CPU: BPF's LRU maps evict per CPU (each CPU keeps
    # its own lists of free and recently added entries), so a flood from
    # one CPU can miss entries another CPU added; a real flood uses them all.
    cpus = sorted(os.sched_getaffinity(0))
    n = len(cpus)
    jobs = [(host, ports, count // n + (1 if i < count % n else 0), cpu, 1024 + i, n) for i, cpu in enumerate(cpus)]
    with multiprocessing.Pool(n) as pool:
        results = pool.map(flood_worker, jobs)
    sent = sum(r[0] for r in results)
    seconds = max(r[1] for r in results)
    print(json.dumps({"sent": sent, "seconds": round(seconds, 3), "rate": round(sent / seconds), "cpus": n}), flush=True)


def main():
    if sys.argv[1:] == ["pods"]:
        print(PODS % os.path.abspath(__file__), end="")
    elif sys.argv[1:] == ["policy"]:
        print(POLICY, end="")
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 5 and sys.argv[1] == "hold":
        hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) == 5 and sys.argv[1] == "flood":
        flood(sys.argv[2], [int(p) for p in sys.argv[3].split(",")], int(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
