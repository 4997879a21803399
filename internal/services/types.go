package services

import "net/netip"

// Frontend is what a client dials: a service address, port and protocol.
// It is the one key of a service port everywhere (compute, datapath,
// flow names).
type Frontend struct {
	VIP   netip.Addr
	Port  uint16
	Proto uint8 // 6 TCP, 17 UDP
}

// Port is the desired state of one service port: what a connect to its
// frontend may be translated to.
type Port struct {
	Frontend
	Name            string // "ns/svc:port", for dumps, errors and flows
	AffinityTimeout uint32 // seconds; 0: no session affinity
	Backends        []Backend
}

// Backend is one endpoint address of a service port.
type Backend struct {
	IP   netip.Addr
	Port uint16
}
