#!/usr/bin/env python3
"""What a pod can forge with the capabilities a container runtime grants by
default (CAP_NET_RAW, no NET_ADMIN), and a capture that shows what arrives.

usage:
  spoof.py capture PORT
      print, once per (protocol, source), every IPv4 packet on eth0 to or
      from PORT (TCP, UDP) or an ICMP echo with id PORT: "seen PROTO SRC DST"
  spoof.py send DST PORT SRC...
      from a raw socket with a hand-built IPv4 header: a TCP SYN, a UDP
      datagram and an ICMP echo request from each SRC to DST, three rounds;
      then "sent"
  spoof.py arp GATEWAY IP...
      ARP frames claiming each IP with this pod's MAC: a gratuitous request,
      an unsolicited reply to the gateway, and a request for the gateway's
      address (which a host answers, learning the sender); then "sent"
"""
import fcntl
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src, dst, proto, payload):
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0x4000, 64, proto, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    hdr = hdr[:10] + struct.pack("!H", checksum(hdr)) + hdr[12:]
    return hdr + payload


def l4_checksum(src, dst, proto, segment):
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, proto, len(segment))
    return checksum(pseudo + segment)


def tcp_syn(src, dst, sport, dport):
    seg = struct.pack("!HHIIBBHHH", sport, dport, 0x5EED0000 | sport, 0, 5 << 4, 0x02, 64240, 0, 0)
    c = l4_checksum(src, dst, socket.IPPROTO_TCP, seg)
    return ipv4(src, dst, socket.IPPROTO_TCP, seg[:16] + struct.pack("!H", c) + seg[18:])


def udp(src, dst, sport, dport, payload=b"shunt-spoof"):
    seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    c = l4_checksum(src, dst, socket.IPPROTO_UDP, seg) or 0xFFFF
    return ipv4(src, dst, socket.IPPROTO_UDP, seg[:6] + struct.pack("!H", c) + seg[8:])


def icmp_echo(src, dst, ident, seq):
    msg = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"shunt-spoof"
    msg = msg[:2] + struct.pack("!H", checksum(msg)) + msg[4:]
    return ipv4(src, dst, socket.IPPROTO_ICMP, msg)


def send(dst, port, sources):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    for rnd in range(3):
        for i, src in enumerate(sources):
            for pkt in (tcp_syn(src, dst, 40000 + 10 * i + rnd, port), udp(src, dst, port, port),
                        icmp_echo(src, dst, port, rnd)):
                s.sendto(pkt, (dst, 0))
        time.sleep(0.1)
    print("sent", flush=True)


def capture(port):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind(("eth0", 0))
    print("capturing", flush=True)
    seen = set()
    while True:
        frame = s.recv(65535)
        if len(frame) < 34 or struct.unpack("!H", frame[12:14])[0] != ETH_P_IP:
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        proto, src, dst = ip[9], socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        l4 = ip[ihl:]
        if len(l4) < 8:
            continue
        if proto in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
            sport, dport = struct.unpack("!HH", l4[:4])
            match = port in (sport, dport)
            name = "tcp" if proto == socket.IPPROTO_TCP else "udp"
        elif proto == socket.IPPROTO_ICMP:
            match = l4[0] in (0, 8) and struct.unpack("!H", l4[4:6])[0] == port
            name = "icmp"
        else:
            continue
        if match and (name, src) not in seen:
            seen.add((name, src))
            print("seen", name, src, dst, flush=True)


def mac_of(sock, ifname):
    # SIOCGIFHWADDR: a lab pod sees the node's /sys, not its own interfaces.
    return fcntl.ioctl(sock.fileno(), 0x8927, struct.pack("256s", ifname.encode()))[18:24]


def arp_frame(eth_dst, op, sha, spa, tha, tpa):
    body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, op, sha, socket.inet_aton(spa), tha,
                       socket.inet_aton(tpa))
    return eth_dst + sha + struct.pack("!H", ETH_P_ARP) + body


def arp(gateway, claims):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    s.bind(("eth0", 0))
    mac, bcast, zero = mac_of(s, "eth0"), b"\xff" * 6, b"\0" * 6
    for _ in range(3):
        for ip in claims:
            s.send(arp_frame(bcast, 1, mac, ip, zero, ip))       # gratuitous request
            s.send(arp_frame(bcast, 2, mac, ip, bcast, gateway))  # unsolicited reply
            s.send(arp_frame(bcast, 1, mac, ip, zero, gateway))  # who has the gateway, tell <ip>
        time.sleep(0.1)
    print("sent", flush=True)


def main(argv):
    if len(argv) >= 3 and argv[1] == "capture":
        capture(int(argv[2]))
    elif len(argv) >= 5 and argv[1] == "send":
        send(argv[2], int(argv[3]), argv[4:])
    elif len(argv) >= 4 and argv[1] == "arp":
        arp(argv[2], argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
