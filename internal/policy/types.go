package policy

import (
	"cmp"
	"net/netip"
)

// What policy computes for the datapath. The numbers below are the C
// side's (enum shunt_identity, enum policy_verdict, POLICY_PREFIX_* in
// bpf/include/shunt.h); internal/datapath checks at compile time that they
// still are, so compute needs no import of the datapath.

// Reserved identities.
const (
	IdentityAny   uint32 = 0 // in policy keys: any peer
	IdentityHost  uint32 = 1 // the node's own addresses
	IdentityWorld uint32 = 2 // anything the ipcache does not know
	// IdentityRemoteNode is another node's own traffic through the
	// overlay (from its pod-network address).
	IdentityRemoteNode uint32 = 6
	FirstPodIdentity   uint32 = 256
	FirstCIDRIdentity  uint32 = 1 << 24
)

// Verdict is what a policy entry says.
type Verdict uint8

const (
	VerdictNone  Verdict = 0 // no rule matched (never stored)
	VerdictAllow Verdict = 1
	VerdictDeny  Verdict = 2
)

func (v Verdict) String() string {
	switch v {
	case VerdictAllow:
		return "allow"
	case VerdictDeny:
		return "deny"
	}
	return "none"
}

// PrefixIdentity maps an address prefix to an identity (the ipcache and
// the CIDR identities).
type PrefixIdentity struct {
	Prefix   netip.Prefix
	Identity uint32
	// Tunnel is the underlay address of the node hosting this prefix;
	// invalid when it is not behind the overlay (local pods, node
	// addresses, world, and every CIDR identity).
	Tunnel netip.Addr
}

// Key is where a policy entry applies: one local pod, one direction, one
// peer identity (IdentityAny: every peer), a protocol (0: all) and a
// destination port prefix (PortBits of Port count; 0: all ports).
type Key struct {
	Endpoint netip.Addr
	Egress   bool
	Identity uint32
	Proto    uint8
	Port     uint16
	PortBits uint8
}

// Entry is one desired policy map entry.
type Entry struct {
	Key
	Verdict Verdict
	RuleID  uint32 // names the deciding rule in traces and flows
}

// State is the whole desired content of the policy maps.
type State struct {
	IPCache        []PrefixIdentity // pods and node addresses
	CIDRIdentities []PrefixIdentity // prefixes policies name
	Entries        []Entry
}

// Canonical masks the port bits beyond the prefix and drops the port of an
// any-protocol key, so equal entries compare equal (the kernel ignores
// those bits too).
func (k Key) Canonical() Key {
	if k.Proto == 0 {
		k.Port, k.PortBits = 0, 0
		return k
	}
	if k.PortBits > 16 {
		k.PortBits = 16
	}
	k.Port &= ^uint16(0) << (16 - k.PortBits)
	if k.PortBits == 0 {
		k.Port = 0
	}
	return k
}

// Compare orders policy keys (pod, direction, identity, protocol, port):
// -1, 0 or +1, for sorting.
func (k Key) Compare(o Key) int {
	egress := func(k Key) int {
		if k.Egress {
			return 1
		}
		return 0
	}
	return cmp.Or(k.Endpoint.Compare(o.Endpoint), cmp.Compare(egress(k), egress(o)), cmp.Compare(k.Identity, o.Identity),
		cmp.Compare(k.Proto, o.Proto), cmp.Compare(k.Port, o.Port), cmp.Compare(k.PortBits, o.PortBits))
}

// Prefix lengths of policy keys in the LPM trie, for code that evaluates
// entries as the trie does: the fixed part (endpoint, direction, identity)
// and then the protocol; port bits come after.
const (
	PrefixFixed = 72
	PrefixProto = 80
)
