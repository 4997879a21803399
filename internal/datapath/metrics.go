package datapath

import (
	"fmt"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// metricsIndex is the shunt_metrics slot of a (reason, direction) counter.
func metricsIndex(reason, direction int) uint32 {
	return uint32(reason*int(podtcShuntMetricsLayoutSHUNT_METRICS_DIRECTIONS) + direction)
}

// Counters reads shunt_metrics, which the tc programs and the socket hooks
// share; counters that never moved are left out.
func (d *Datapath) Counters() ([]dpinfo.Counter, error) {
	var out []dpinfo.Counter
	for r := range dpinfo.ReasonMax {
		for dir := range dpinfo.DirMax {
			idx := metricsIndex(int(r), int(dir))
			var perCPU []podtcMetricsValue
			if err := d.objs.ShuntMetrics.Lookup(idx, &perCPU); err != nil {
				return nil, fmt.Errorf("reading shunt_metrics[%d]: %w", idx, err)
			}
			c := dpinfo.Counter{Reason: r.String(), Direction: dir.String()}
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
