package dpinfo

import "fmt"

// Reason is a value of enum shunt_reason: why a program did what it did,
// as counters, metrics and flows print it.
type Reason uint8

// The values of enum shunt_reason, in its order.
const (
	ReasonForwarded Reason = iota
	ReasonToStack
	ReasonNotIPv4
	ReasonInvalidPacket
	ReasonTTLExceeded
	ReasonRedirectFailed
	ReasonServiceNoBackend
	ReasonServiceXlate
	ReasonPolicyDenied
	ReasonPolicyNotAllowed
	ReasonCTFull
	ReasonSpoofed
	ReasonNATInsertFailed
	ReasonAffinityInsertFailed
	ReasonSockXlate
	ReasonSockRefused
	ReasonSockPassed
	ReasonSockRestored
	ReasonRevNATInsertFailed
	ReasonSockStorageFailed
	ReasonSockToProxy
	ReasonProxyAdmitted
	ReasonProxyOriginFailed
	ReasonProxyOriginAnswered
	ReasonAccelAdded
	ReasonAccelInsertFailed
	ReasonAccelRedirected
	ReasonAccelPassed
	ReasonAccelEnded
	ReasonAccelForeignNetns
	ReasonSockForeignNetns
	ReasonToTunnel
	ReasonTunnelSpoofed
	ReasonTunnelKeyFailed
	ReasonCTPromoteFailed
	ReasonFIBLookupFailed
	ReasonMasqueraded
	ReasonMasqPortExhausted
	ReasonMasqInsertFailed
	ReasonUnmasqueraded
	ReasonARPSpoofed
	ReasonFragNeeded
	ReasonProxyIdentity
	ReasonAccelCongested
	ReasonNodePortXlate
	ReasonNodePortReply
	ReasonLBSourceDenied
	ReasonProxySteered
	ReasonProxySteerFailed
	ReasonDSREncap
	ReasonDSRDecap
	ReasonDSRTooBig
	ReasonDSRGSODecap
	ReasonProxyUpstreamReply
	ReasonDSRUnknownNode
	ReasonNATEntryLost
	ReasonNodePortEntryMissing
	ReasonAccelUntracked
	ReasonIdentityCarried
	ReasonMax // one past the last, SHUNT_REASON_MAX
)

var reasonNames = [...]string{
	ReasonForwarded:            "forwarded",
	ReasonToStack:              "to-stack",
	ReasonNotIPv4:              "not-ipv4",
	ReasonInvalidPacket:        "invalid-packet",
	ReasonTTLExceeded:          "ttl-exceeded",
	ReasonRedirectFailed:       "redirect-failed",
	ReasonServiceNoBackend:     "service-no-backend",
	ReasonServiceXlate:         "service-translated",
	ReasonPolicyDenied:         "policy-denied",
	ReasonPolicyNotAllowed:     "policy-not-allowed",
	ReasonCTFull:               "ct-full",
	ReasonSpoofed:              "spoofed",
	ReasonNATInsertFailed:      "nat-insert-failed",
	ReasonAffinityInsertFailed: "affinity-insert-failed",
	ReasonSockXlate:            "sock-translated",
	ReasonSockRefused:          "sock-refused",
	ReasonSockPassed:           "sock-passed",
	ReasonSockRestored:         "sock-restored",
	ReasonRevNATInsertFailed:   "revnat-insert-failed",
	ReasonSockStorageFailed:    "sock-storage-failed",
	ReasonSockToProxy:          "sock-to-proxy",
	ReasonProxyAdmitted:        "proxy-admitted",
	ReasonProxyOriginFailed:    "proxy-origin-failed",
	ReasonProxyOriginAnswered:  "proxy-origin-answered",
	ReasonAccelAdded:           "accel-added",
	ReasonAccelInsertFailed:    "accel-insert-failed",
	ReasonAccelRedirected:      "accel-redirected",
	ReasonAccelPassed:          "accel-passed",
	ReasonAccelEnded:           "accel-ended",
	ReasonAccelForeignNetns:    "accel-foreign-netns",
	ReasonSockForeignNetns:     "sock-foreign-netns",
	ReasonToTunnel:             "to-tunnel",
	ReasonTunnelSpoofed:        "tunnel-spoofed",
	ReasonTunnelKeyFailed:      "tunnel-key-failed",
	ReasonCTPromoteFailed:      "ct-promote-failed",
	ReasonFIBLookupFailed:      "fib-lookup-failed",
	ReasonMasqueraded:          "masqueraded",
	ReasonMasqPortExhausted:    "masq-port-exhausted",
	ReasonMasqInsertFailed:     "masq-insert-failed",
	ReasonUnmasqueraded:        "unmasqueraded",
	ReasonARPSpoofed:           "arp-spoofed",
	ReasonFragNeeded:           "frag-needed",
	ReasonProxyIdentity:        "proxy-identity",
	ReasonAccelCongested:       "accel-congested",
	ReasonNodePortXlate:        "nodeport-xlate",
	ReasonNodePortReply:        "nodeport-reply",
	ReasonLBSourceDenied:       "lb-source-denied",
	ReasonProxySteered:         "proxy-steered",
	ReasonProxySteerFailed:     "proxy-steer-failed",
	ReasonDSREncap:             "dsr-encap",
	ReasonDSRDecap:             "dsr-decap",
	ReasonDSRTooBig:            "dsr-too-big",
	ReasonDSRGSODecap:          "dsr-gso-decap",
	ReasonProxyUpstreamReply:   "proxy-upstream-reply",
	ReasonDSRUnknownNode:       "dsr-unknown-node",
	ReasonNATEntryLost:         "nat-entry-lost",
	ReasonNodePortEntryMissing: "nodeport-entry-missing",
	ReasonAccelUntracked:       "accel-untracked",
	ReasonIdentityCarried:      "identity-carried",
}

// String is the reason's name, or its number when it has none.
func (r Reason) String() string { return name(reasonNames[:], uint8(r)) }

// insertFailures are the reasons that say a program could not record an
// entry in a map (the packet or call may still have gone on).
var insertFailures = [...]Reason{
	ReasonCTFull, ReasonNATInsertFailed, ReasonAffinityInsertFailed, ReasonRevNATInsertFailed,
	ReasonSockStorageFailed, ReasonProxyOriginFailed, ReasonAccelInsertFailed, ReasonCTPromoteFailed,
	ReasonMasqInsertFailed,
}

// InsertFailed says whether a reason, by name, is a map insert that
// failed: worth showing even on a flow that went on.
func InsertFailed(reason string) bool {
	for _, r := range insertFailures {
		if r.String() == reason {
			return true
		}
	}
	return false
}

// Direction is a value of enum shunt_direction: a direction of the tc
// programs on a pod's veth, the overlay device or the uplink, or a socket
// hook.
type Direction uint8

// The values of enum shunt_direction, in its order.
const (
	DirFromPod Direction = iota
	DirToPod
	DirConnect
	DirSendmsg
	DirRecvmsg
	DirGetpeername
	DirGetsockopt
	DirSockmsg
	DirFromOverlay
	DirToUplink
	DirFromUplink
	DirToOverlay
	DirMax // one past the last, SHUNT_DIR_MAX
)

var directionNames = [...]string{
	DirFromPod:     "from-pod",
	DirToPod:       "to-pod",
	DirConnect:     "connect",
	DirSendmsg:     "sendmsg",
	DirRecvmsg:     "recvmsg",
	DirGetpeername: "getpeername",
	DirGetsockopt:  "getsockopt",
	DirSockmsg:     "sockmsg",
	DirFromOverlay: "from-overlay",
	DirToUplink:    "to-uplink",
	DirFromUplink:  "from-uplink",
	DirToOverlay:   "to-overlay",
}

// String is the direction's name, or its number when it has none.
func (d Direction) String() string { return name(directionNames[:], uint8(d)) }

// Packets says whether the direction is a tc program's, which counts
// packets and bytes; a socket hook counts its calls and no bytes.
func (d Direction) Packets() bool {
	switch d {
	case DirFromPod, DirToPod, DirFromOverlay, DirToUplink, DirFromUplink, DirToOverlay:
		return true
	}
	return false
}

// Each table names every value of its type, up to the _MAX value: a
// constant added without a name, or a name without a constant, fails to
// compile.
const (
	_ = uint(len(reasonNames)-int(ReasonMax)) + uint(int(ReasonMax)-len(reasonNames))
	_ = uint(len(directionNames)-int(DirMax)) + uint(int(DirMax)-len(directionNames))
)

// name is names[i], or i as a number when the table has no name for it.
func name(names []string, i uint8) string {
	if int(i) < len(names) && names[i] != "" {
		return names[i]
	}
	return fmt.Sprint(i) // none, or a value kept unused (reasons 52-59)
}
