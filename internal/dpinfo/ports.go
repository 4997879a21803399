package dpinfo

import (
	"fmt"
	"strconv"
	"strings"
)

// PortRange is an inclusive range of ports.
type PortRange struct{ Min, Max uint16 }

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// Overlaps says whether two ranges share a port.
func (r PortRange) Overlaps(o PortRange) bool { return r.Min <= o.Max && o.Min <= r.Max }

// DefaultMasqPorts are the source ports masqueraded flows get: above
// Linux's default ephemeral range (net.ipv4.ip_local_port_range 32768-60999),
// so a connection of the node's own never has a port the table hands out
// and its replies are never taken for a pod's. That leaves 4536 ports per
// destination address, port and protocol: what bounds the concurrent flows
// from this node's pods to one outside server (a closed TCP connection
// gives its port up a second later, bpf/lib/masq.h).
var DefaultMasqPorts = PortRange{Min: 61000, Max: 65535}

// ParsePortRange reads "MIN-MAX".
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	min, err1 := strconv.ParseUint(lo, 10, 16)
	max, err2 := strconv.ParseUint(hi, 10, 16)
	if !ok || err1 != nil || err2 != nil || min == 0 || min > max {
		return PortRange{}, fmt.Errorf("port range %q: give MIN-MAX, 1 <= MIN <= MAX <= 65535, e.g. %s", s, DefaultMasqPorts)
	}
	return PortRange{Min: uint16(min), Max: uint16(max)}, nil
}
