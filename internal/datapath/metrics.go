package datapath

import "fmt"

// Reason names, one for each value of enum shunt_reason in
// bpf/include/shunt.h, as the counters, metrics and flows print them.
var reasonNames = [...]string{
	podtcShuntReasonSHUNT_REASON_FORWARDED:              "forwarded",
	podtcShuntReasonSHUNT_REASON_TO_STACK:               "to-stack",
	podtcShuntReasonSHUNT_REASON_NOT_IPV4:               "not-ipv4",
	podtcShuntReasonSHUNT_REASON_INVALID_PACKET:         "invalid-packet",
	podtcShuntReasonSHUNT_REASON_TTL_EXCEEDED:           "ttl-exceeded",
	podtcShuntReasonSHUNT_REASON_REDIRECT_FAILED:        "redirect-failed",
	podtcShuntReasonSHUNT_REASON_SERVICE_NO_BACKEND:     "service-no-backend",
	podtcShuntReasonSHUNT_REASON_SERVICE_XLATE:          "service-translated",
	podtcShuntReasonSHUNT_REASON_POLICY_DENIED:          "policy-denied",
	podtcShuntReasonSHUNT_REASON_POLICY_NOT_ALLOWED:     "policy-not-allowed",
	podtcShuntReasonSHUNT_REASON_CT_FULL:                "ct-full",
	podtcShuntReasonSHUNT_REASON_SPOOFED:                "spoofed",
	podtcShuntReasonSHUNT_REASON_NAT_INSERT_FAILED:      "nat-insert-failed",
	podtcShuntReasonSHUNT_REASON_AFFINITY_INSERT_FAILED: "affinity-insert-failed",
	podtcShuntReasonSHUNT_REASON_SOCK_XLATE:             "sock-translated",
	podtcShuntReasonSHUNT_REASON_SOCK_REFUSED:           "sock-refused",
	podtcShuntReasonSHUNT_REASON_SOCK_PASSED:            "sock-passed",
	podtcShuntReasonSHUNT_REASON_SOCK_RESTORED:          "sock-restored",
	podtcShuntReasonSHUNT_REASON_REVNAT_INSERT_FAILED:   "revnat-insert-failed",
	podtcShuntReasonSHUNT_REASON_SOCK_STORAGE_FAILED:    "sock-storage-failed",
}

// The names must cover the enum exactly: a reason added in C without a
// name here (or a stale name) fails to compile.
const _ = uint(len(reasonNames)-int(podtcShuntReasonSHUNT_REASON_MAX)) + uint(int(podtcShuntReasonSHUNT_REASON_MAX)-len(reasonNames))

// insertFailures are the reasons that say a program could not record an
// entry in a map (the packet or call may still have gone on).
var insertFailures = [...]podtcShuntReason{
	podtcShuntReasonSHUNT_REASON_CT_FULL, podtcShuntReasonSHUNT_REASON_NAT_INSERT_FAILED,
	podtcShuntReasonSHUNT_REASON_AFFINITY_INSERT_FAILED, podtcShuntReasonSHUNT_REASON_REVNAT_INSERT_FAILED,
	podtcShuntReasonSHUNT_REASON_SOCK_STORAGE_FAILED,
}

// InsertFailed says whether a reason is a map insert that failed: worth
// showing even on a flow that went on.
func InsertFailed(reason string) bool {
	for _, r := range insertFailures {
		if reasonNames[r] == reason {
			return true
		}
	}
	return false
}

// Direction names (enum shunt_direction): a direction of the tc programs on
// a pod's veth, or a socket hook.
var directionNames = [...]string{
	podtcShuntDirectionSHUNT_DIR_FROM_POD:    "from-pod",
	podtcShuntDirectionSHUNT_DIR_TO_POD:      "to-pod",
	podtcShuntDirectionSHUNT_DIR_CONNECT:     "connect",
	podtcShuntDirectionSHUNT_DIR_SENDMSG:     "sendmsg",
	podtcShuntDirectionSHUNT_DIR_RECVMSG:     "recvmsg",
	podtcShuntDirectionSHUNT_DIR_GETPEERNAME: "getpeername",
}

const _ = uint(len(directionNames)-int(podtcShuntDirectionSHUNT_DIR_MAX)) + uint(int(podtcShuntDirectionSHUNT_DIR_MAX)-len(directionNames))

// metricsIndex is the shunt_metrics slot of a (reason, direction) counter.
func metricsIndex(reason, direction int) uint32 {
	return uint32(reason*int(podtcShuntMetricsLayoutSHUNT_METRICS_DIRECTIONS) + direction)
}

// Counter is one (reason, direction) packet/byte counter, summed over CPUs.
// For a socket hook (direction connect, sendmsg, recvmsg or getpeername)
// Packets counts the hook's calls and Bytes stays 0.
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
		c.Direction != directionNames[podtcShuntDirectionSHUNT_DIR_TO_POD]
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
