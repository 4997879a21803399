package datapath

import "fmt"

// Reason names mirror enum shunt_reason in bpf/include/shunt.h, in order.
var reasonNames = [...]string{
	"forwarded", "to-stack", "not-ipv4", "invalid-packet", "ttl-exceeded", "redirect-failed",
	"service-no-backend", "service-translated", "policy-denied", "policy-not-allowed", "ct-full", "spoofed",
}

// The names must cover the enum exactly: a reason added in C without a
// name here (or a stale name) fails to compile.
const _ = uint(len(reasonNames)-int(podtcShuntReasonSHUNT_REASON_MAX)) + uint(int(podtcShuntReasonSHUNT_REASON_MAX)-len(reasonNames))

var directionNames = []string{"from-pod", "to-pod"}

// Counter is one (reason, direction) packet/byte counter, summed over CPUs.
type Counter struct {
	Reason    string `json:"reason"`
	Direction string `json:"direction"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// Counters reads shunt_metrics; counters that never moved are left out.
func (d *Datapath) Counters() ([]Counter, error) {
	var out []Counter
	for r, reason := range reasonNames {
		for dir, direction := range directionNames {
			idx := uint32(r*len(directionNames) + dir)
			var perCPU []podtcMetricsValue
			if err := d.objs.ShuntMetrics.Lookup(idx, &perCPU); err != nil {
				return nil, fmt.Errorf("reading shunt_metrics[%d]: %w", idx, err)
			}
			c := Counter{Reason: reason, Direction: direction}
			for _, v := range perCPU {
				c.Packets += v.Packets
				c.Bytes += v.Bytes
			}
			if c.Packets > 0 {
				out = append(out, c)
			}
		}
	}
	return out, nil
}
