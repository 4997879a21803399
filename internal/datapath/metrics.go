package datapath

import "fmt"

// metricsIndex is the shunt_metrics slot of a (reason, direction) counter.
func metricsIndex(reason, direction int) uint32 {
	return uint32(reason*int(podtcShuntMetricsLayoutSHUNT_METRICS_DIRECTIONS) + direction)
}

// Counter is one (reason, direction) packet/byte counter, summed over CPUs.
// For a socket hook (direction connect, sendmsg, recvmsg or getpeername)
// Packets counts the hook's calls and Bytes stays 0; the tc directions
// (from-pod, to-pod, from-overlay, to-uplink, from-uplink) count packets and bytes.
type Counter struct {
	Reason    string `json:"reason"`
	Direction string `json:"direction"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// SocketHook says whether the counter is a socket hook's, which counts calls,
// not packets, and no bytes.
func (c Counter) SocketHook() bool {
	return c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_FROM_POD] &&
		c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_TO_POD] &&
		c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_FROM_OVERLAY] &&
		c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_TO_UPLINK] &&
		c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_FROM_UPLINK] &&
		c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_TO_OVERLAY]
}

// Counters reads shunt_metrics, which the tc programs and the socket hooks
// share; counters that never moved are left out.
func (d *Datapath) Counters() ([]Counter, error) {
	var out []Counter
	for r, reason := range reasonNames {
		for dir, direction := range directionNames {
			idx := metricsIndex(r, dir)
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
