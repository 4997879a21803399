package datapath

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// The names Go prints for the values of the C enums in bpf/include/shunt.h,
// all in this file. Each table is indexed (or keyed) by the constants bpf2go
// generates from the enum, so a name cannot slide onto another value; the
// tables of the enums that end in a _MAX value are checked against it at
// compile time, so a value added in C without a name fails the build.
// TestEnumNames checks every enum of shunt.h against the compiled objects:
// each value has a name of its own, or the enum is listed with the reason Go
// never prints it.

// Reason names (enum shunt_reason), as the counters, metrics and flows
// print them.
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
	podtcShuntReasonSHUNT_REASON_SOCK_TO_PROXY:          "sock-to-proxy",
	podtcShuntReasonSHUNT_REASON_PROXY_ADMITTED:         "proxy-admitted",
	podtcShuntReasonSHUNT_REASON_PROXY_ORIGIN_FAILED:    "proxy-origin-failed",
	podtcShuntReasonSHUNT_REASON_PROXY_ORIGIN_ANSWERED:  "proxy-origin-answered",
	podtcShuntReasonSHUNT_REASON_ACCEL_ADDED:            "accel-added",
	podtcShuntReasonSHUNT_REASON_ACCEL_INSERT_FAILED:    "accel-insert-failed",
	podtcShuntReasonSHUNT_REASON_ACCEL_REDIRECTED:       "accel-redirected",
	podtcShuntReasonSHUNT_REASON_ACCEL_PASSED:           "accel-passed",
	podtcShuntReasonSHUNT_REASON_ACCEL_ENDED:            "accel-ended",
	podtcShuntReasonSHUNT_REASON_ACCEL_FOREIGN_NETNS:    "accel-foreign-netns",
	podtcShuntReasonSHUNT_REASON_SOCK_FOREIGN_NETNS:     "sock-foreign-netns",
	podtcShuntReasonSHUNT_REASON_TO_TUNNEL:              "to-tunnel",
	podtcShuntReasonSHUNT_REASON_TUNNEL_SPOOFED:         "tunnel-spoofed",
	podtcShuntReasonSHUNT_REASON_TUNNEL_KEY_FAILED:      "tunnel-key-failed",
	podtcShuntReasonSHUNT_REASON_CT_PROMOTE_FAILED:      "ct-promote-failed",
	podtcShuntReasonSHUNT_REASON_FIB_LOOKUP_FAILED:      "fib-lookup-failed",
	podtcShuntReasonSHUNT_REASON_MASQUERADED:            "masqueraded",
	podtcShuntReasonSHUNT_REASON_MASQ_PORT_EXHAUSTED:    "masq-port-exhausted",
	podtcShuntReasonSHUNT_REASON_MASQ_INSERT_FAILED:     "masq-insert-failed",
	podtcShuntReasonSHUNT_REASON_UNMASQUERADED:          "unmasqueraded",
	podtcShuntReasonSHUNT_REASON_ARP_SPOOFED:            "arp-spoofed",
	podtcShuntReasonSHUNT_REASON_FRAG_NEEDED:            "frag-needed",
	podtcShuntReasonSHUNT_REASON_PROXY_IDENTITY:         "proxy-identity",
}

// Direction names (enum shunt_direction): a direction of the tc programs on
// a pod's veth or on the overlay device, or a socket hook.
var directionNames = [...]string{
	podtcShuntDirectionSHUNT_DIR_FROM_POD:     "from-pod",
	podtcShuntDirectionSHUNT_DIR_TO_POD:       "to-pod",
	podtcShuntDirectionSHUNT_DIR_CONNECT:      "connect",
	podtcShuntDirectionSHUNT_DIR_SENDMSG:      "sendmsg",
	podtcShuntDirectionSHUNT_DIR_RECVMSG:      "recvmsg",
	podtcShuntDirectionSHUNT_DIR_GETPEERNAME:  "getpeername",
	podtcShuntDirectionSHUNT_DIR_GETSOCKOPT:   "getsockopt",
	podtcShuntDirectionSHUNT_DIR_SOCKMSG:      "sockmsg",
	podtcShuntDirectionSHUNT_DIR_FROM_OVERLAY: "from-overlay",
	podtcShuntDirectionSHUNT_DIR_TO_UPLINK:    "to-uplink",
	podtcShuntDirectionSHUNT_DIR_FROM_UPLINK:  "from-uplink",
	podtcShuntDirectionSHUNT_DIR_TO_OVERLAY:   "to-overlay",
}

// Flow event fields (enum flow_verdict, flow_event_type, flow_point).
var (
	flowVerdictNames = [...]string{
		podtcFlowVerdictFLOW_FORWARDED:        "FORWARDED",
		podtcFlowVerdictFLOW_DROPPED:          "DROPPED",
		podtcFlowVerdictFLOW_TRANSLATED:       "TRANSLATED",
		podtcFlowVerdictFLOW_REDIRECTED_PROXY: "REDIRECTED",
	}
	flowEventNames = [...]string{
		podtcFlowEventTypeFLOW_EV_PACKET:   "packet",
		podtcFlowEventTypeFLOW_EV_CONN_NEW: "new",
		podtcFlowEventTypeFLOW_EV_CONN_END: "end",
		podtcFlowEventTypeFLOW_EV_DROP:     "drop",
		podtcFlowEventTypeFLOW_EV_SOCK:     "socket",
	}
	flowPointNames = [...]string{
		podtcFlowPointFLOW_POINT_FROM_POD:     "from-pod",
		podtcFlowPointFLOW_POINT_TO_POD:       "to-pod",
		podtcFlowPointFLOW_POINT_SOCK:         "socket",
		podtcFlowPointFLOW_POINT_FROM_OVERLAY: "from-overlay",
		podtcFlowPointFLOW_POINT_TO_UPLINK:    "to-uplink",
		podtcFlowPointFLOW_POINT_FROM_UPLINK:  "from-uplink",
	}
)

// Each table covers its enum exactly (the _MAX value is one past the last):
// a value added in C without a name here, or a stale name, fails to compile.
const (
	_ = uint(len(reasonNames)-int(podtcShuntReasonSHUNT_REASON_MAX)) + uint(int(podtcShuntReasonSHUNT_REASON_MAX)-len(reasonNames))
	_ = uint(len(directionNames)-int(podtcShuntDirectionSHUNT_DIR_MAX)) + uint(int(podtcShuntDirectionSHUNT_DIR_MAX)-len(directionNames))
	_ = uint(len(flowVerdictNames)-int(podtcFlowVerdictFLOW_VERDICT_MAX)) + uint(int(podtcFlowVerdictFLOW_VERDICT_MAX)-len(flowVerdictNames))
	_ = uint(len(flowEventNames)-int(podtcFlowEventTypeFLOW_EV_MAX)) + uint(int(podtcFlowEventTypeFLOW_EV_MAX)-len(flowEventNames))
	_ = uint(len(flowPointNames)-int(podtcFlowPointFLOW_POINT_MAX)) + uint(int(podtcFlowPointFLOW_POINT_MAX)-len(flowPointNames))
)

// Flag names (enum endpoint_flags, enum ct_flags), one per bit.
var (
	endpointFlagNames = map[podtcEndpointFlags]string{
		podtcEndpointFlagsENDPOINT_F_INGRESS_ISOLATED: "ingress-isolated",
		podtcEndpointFlagsENDPOINT_F_EGRESS_ISOLATED:  "egress-isolated",
		podtcEndpointFlagsENDPOINT_F_INGRESS_RULES:    "ingress-rules",
		podtcEndpointFlagsENDPOINT_F_EGRESS_RULES:     "egress-rules",
	}
	ctFlagNames = map[podtcCtFlags]string{
		podtcCtFlagsCT_F_ORIG_IS_A:  "opened-by-a",
		podtcCtFlagsCT_F_REPLY_SEEN: "reply-seen",
		podtcCtFlagsCT_F_FIN_A:      "fin-a",
		podtcCtFlagsCT_F_FIN_B:      "fin-b",
		podtcCtFlagsCT_F_RST:        "rst",
	}
)

// flagsText names the bits set in f, sorted, comma-separated; a bit
// without a name shows as its number.
func flagsText[F ~uint32](f uint32, names map[F]string) string {
	var out []string
	for bit := uint32(1); bit != 0; bit <<= 1 {
		if f&bit == 0 {
			continue
		}
		if name, ok := names[F(bit)]; ok {
			out = append(out, name)
		} else {
			out = append(out, fmt.Sprintf("%#x", bit))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// name is names[i], or i as a number when the table has no name for it.
func name(names []string, i uint8) string {
	if int(i) < len(names) {
		return names[i]
	}
	return fmt.Sprint(i)
}

// insertFailures are the reasons that say a program could not record an
// entry in a map (the packet or call may still have gone on).
var insertFailures = [...]podtcShuntReason{
	podtcShuntReasonSHUNT_REASON_CT_FULL, podtcShuntReasonSHUNT_REASON_NAT_INSERT_FAILED,
	podtcShuntReasonSHUNT_REASON_AFFINITY_INSERT_FAILED, podtcShuntReasonSHUNT_REASON_REVNAT_INSERT_FAILED,
	podtcShuntReasonSHUNT_REASON_SOCK_STORAGE_FAILED, podtcShuntReasonSHUNT_REASON_PROXY_ORIGIN_FAILED,
	podtcShuntReasonSHUNT_REASON_ACCEL_INSERT_FAILED, podtcShuntReasonSHUNT_REASON_CT_PROMOTE_FAILED,
	podtcShuntReasonSHUNT_REASON_MASQ_INSERT_FAILED,
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

// enumValues reads a C enum of bpf/include/shunt.h, value name -> value,
// from the compiled objects' BTF, for the test that checks Go names every
// value.
func enumValues(enum string) (map[string]uint64, error) {
	specs, err := objectSpecs()
	if err != nil {
		return nil, err
	}
	for _, spec := range specs {
		var e *btf.Enum
		if err := spec.Types.TypeByName(enum, &e); errors.Is(err, btf.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("reading enum %s: %w", enum, err)
		}
		out := map[string]uint64{}
		for _, v := range e.Values {
			out[v.Name] = v.Value
		}
		return out, nil
	}
	return nil, fmt.Errorf("enum %s is in none of the BPF objects' BTF (a program must use it as a type)", enum)
}

// objectSpecs are the collection specs of every BPF object of the datapath:
// those Open loads and the socket iterator (sockdestroy.go).
func objectSpecs() ([]*ebpf.CollectionSpec, error) {
	specs, err := loadSpecs()
	if err != nil {
		return nil, err
	}
	destroy, err := loadSockdestroy()
	if err != nil {
		return nil, err
	}
	return append(specs.list(true), destroy), nil
}
