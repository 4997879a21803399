package datapath

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/shuntnet/shunt/internal/dpinfo"
)

// The names Go prints for the values of the C enums in bpf/include/shunt.h.
// Those of shunt_reason and shunt_direction are in internal/dpinfo, which
// the CLI uses without linking the datapath; each of its constants is
// checked here against bpf2go's, so a value that moves in C fails the
// build. The others are in this file: each table is indexed (or keyed) by
// the constants bpf2go generates from the enum, so a name cannot slide
// onto another value; the tables of the enums that end in a _MAX value are
// checked against it at compile time, so a value added in C without a name
// fails the build. TestEnumNames checks every enum of shunt.h against the
// compiled objects: each value has a name of its own, or the enum is listed
// with the reason Go never prints it.

// Flow event fields (enum flow_verdict, flow_event_type, flow_point).
var (
	flowVerdictNames = [...]string{
		podtcFlowVerdictFLOW_FORWARDED:        "FORWARDED",
		podtcFlowVerdictFLOW_DROPPED:          "DROPPED",
		podtcFlowVerdictFLOW_TRANSLATED:       "TRANSLATED",
		podtcFlowVerdictFLOW_REDIRECTED_PROXY: "REDIRECTED",
	}
	flowEventNames = [...]string{
		podtcFlowEventTypeFLOW_EV_PACKET:      "packet",
		podtcFlowEventTypeFLOW_EV_CONN_NEW:    "new",
		podtcFlowEventTypeFLOW_EV_CONN_END:    "end",
		podtcFlowEventTypeFLOW_EV_DROP:        "drop",
		podtcFlowEventTypeFLOW_EV_SOCK:        "socket",
		podtcFlowEventTypeFLOW_EV_CONN_ANSWER: "answer",
		podtcFlowEventTypeFLOW_EV_ICMP_ERROR:  "icmp-error",
	}
	// An ICMP error event's codes (enum flow_icmp_error), by kind: RFC
	// 792's and RFC 1812's names.
	icmpErrorCodeNames = map[podtcFlowIcmpError][]string{
		podtcFlowIcmpErrorFLOW_ICMP_DEST_UNREACH: {"net-unreachable", "host-unreachable", "protocol-unreachable",
			"port-unreachable", "fragmentation-needed", "source-route-failed", "net-unknown", "host-unknown",
			"source-host-isolated", "net-prohibited", "host-prohibited", "net-unreachable-for-tos",
			"host-unreachable-for-tos", "administratively-prohibited", "host-precedence-violation", "precedence-cutoff"},
		podtcFlowIcmpErrorFLOW_ICMP_TIME_EXCEEDED:     {"ttl-exceeded", "reassembly-time-exceeded"},
		podtcFlowIcmpErrorFLOW_ICMP_PARAMETER_PROBLEM: {"parameter-problem", "missing-option", "bad-length"},
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

// icmpErrorName names the ICMP error an icmp-error event's byte holds
// (enum flow_icmp_error): its code's name, or the kind and number of a
// code without one; "" for 0, an event whose packet no longer showed its
// ICMP header where the program read it (encapsulated meanwhile).
func icmpErrorName(b uint8) string {
	if b == 0 {
		return ""
	}
	kind := podtcFlowIcmpError(b) & podtcFlowIcmpErrorFLOW_ICMP_KIND_MASK
	code := int(podtcFlowIcmpError(b) & podtcFlowIcmpErrorFLOW_ICMP_CODE_MASK)
	names, ok := icmpErrorCodeNames[kind]
	switch {
	case !ok:
		return fmt.Sprintf("icmp-error-%#x", b)
	case code < len(names):
		return names[code]
	default:
		return fmt.Sprintf("%s-code-%d", names[0], code)
	}
}

// Each table covers its enum exactly (the _MAX value is one past the last):
// a value added in C without a name here, or a stale name, fails to compile.
const (
	_ = uint(len(flowVerdictNames)-int(podtcFlowVerdictFLOW_VERDICT_MAX)) + uint(int(podtcFlowVerdictFLOW_VERDICT_MAX)-len(flowVerdictNames))
	_ = uint(len(flowEventNames)-int(podtcFlowEventTypeFLOW_EV_MAX)) + uint(int(podtcFlowEventTypeFLOW_EV_MAX)-len(flowEventNames))
	_ = uint(len(flowPointNames)-int(podtcFlowPointFLOW_POINT_MAX)) + uint(int(podtcFlowPointFLOW_POINT_MAX)-len(flowPointNames))
)

// dpinfo's reasons and directions are the C enums' values: a pair that
// differs indexes past the one element of sameAsC, and the build fails on
// that line.
type sameAsC [1]struct{}

var (
	_ = sameAsC{}[dpinfo.ReasonForwarded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_FORWARDED)]
	_ = sameAsC{}[dpinfo.ReasonToStack^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_TO_STACK)]
	_ = sameAsC{}[dpinfo.ReasonNotIPv4^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_NOT_IPV4)]
	_ = sameAsC{}[dpinfo.ReasonInvalidPacket^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_INVALID_PACKET)]
	_ = sameAsC{}[dpinfo.ReasonTTLExceeded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_TTL_EXCEEDED)]
	_ = sameAsC{}[dpinfo.ReasonRedirectFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_REDIRECT_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonServiceNoBackend^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SERVICE_NO_BACKEND)]
	_ = sameAsC{}[dpinfo.ReasonServiceXlate^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SERVICE_XLATE)]
	_ = sameAsC{}[dpinfo.ReasonPolicyDenied^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_POLICY_DENIED)]
	_ = sameAsC{}[dpinfo.ReasonPolicyNotAllowed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_POLICY_NOT_ALLOWED)]
	_ = sameAsC{}[dpinfo.ReasonCTFull^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_CT_FULL)]
	_ = sameAsC{}[dpinfo.ReasonSpoofed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SPOOFED)]
	_ = sameAsC{}[dpinfo.ReasonNATInsertFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_NAT_INSERT_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonAffinityInsertFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_AFFINITY_INSERT_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonSockXlate^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_XLATE)]
	_ = sameAsC{}[dpinfo.ReasonSockRefused^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_REFUSED)]
	_ = sameAsC{}[dpinfo.ReasonSockPassed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_PASSED)]
	_ = sameAsC{}[dpinfo.ReasonSockRestored^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_RESTORED)]
	_ = sameAsC{}[dpinfo.ReasonRevNATInsertFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_REVNAT_INSERT_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonSockStorageFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_STORAGE_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonSockToProxy^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_TO_PROXY)]
	_ = sameAsC{}[dpinfo.ReasonProxyAdmitted^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_ADMITTED)]
	_ = sameAsC{}[dpinfo.ReasonProxyOriginFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_ORIGIN_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonProxyOriginAnswered^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_ORIGIN_ANSWERED)]
	_ = sameAsC{}[dpinfo.ReasonAccelAdded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_ADDED)]
	_ = sameAsC{}[dpinfo.ReasonAccelInsertFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_INSERT_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonAccelRedirected^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_REDIRECTED)]
	_ = sameAsC{}[dpinfo.ReasonAccelPassed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_PASSED)]
	_ = sameAsC{}[dpinfo.ReasonAccelEnded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_ENDED)]
	_ = sameAsC{}[dpinfo.ReasonAccelForeignNetns^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_FOREIGN_NETNS)]
	_ = sameAsC{}[dpinfo.ReasonSockForeignNetns^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_SOCK_FOREIGN_NETNS)]
	_ = sameAsC{}[dpinfo.ReasonToTunnel^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_TO_TUNNEL)]
	_ = sameAsC{}[dpinfo.ReasonTunnelSpoofed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_TUNNEL_SPOOFED)]
	_ = sameAsC{}[dpinfo.ReasonTunnelKeyFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_TUNNEL_KEY_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonCTPromoteFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_CT_PROMOTE_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonFIBLookupFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_FIB_LOOKUP_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonMasqueraded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_MASQUERADED)]
	_ = sameAsC{}[dpinfo.ReasonMasqPortExhausted^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_MASQ_PORT_EXHAUSTED)]
	_ = sameAsC{}[dpinfo.ReasonMasqInsertFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_MASQ_INSERT_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonUnmasqueraded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_UNMASQUERADED)]
	_ = sameAsC{}[dpinfo.ReasonARPSpoofed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ARP_SPOOFED)]
	_ = sameAsC{}[dpinfo.ReasonFragNeeded^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_FRAG_NEEDED)]
	_ = sameAsC{}[dpinfo.ReasonProxyIdentity^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_IDENTITY)]
	_ = sameAsC{}[dpinfo.ReasonAccelCongested^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_CONGESTED)]
	_ = sameAsC{}[dpinfo.ReasonAccelUntracked^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_ACCEL_UNTRACKED)]
	_ = sameAsC{}[dpinfo.ReasonNodePortXlate^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_NODEPORT_XLATE)]
	_ = sameAsC{}[dpinfo.ReasonNodePortReply^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_NODEPORT_REPLY)]
	_ = sameAsC{}[dpinfo.ReasonLBSourceDenied^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_LB_SOURCE_DENIED)]
	_ = sameAsC{}[dpinfo.ReasonProxySteered^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_STEERED)]
	_ = sameAsC{}[dpinfo.ReasonProxySteerFailed^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_STEER_FAILED)]
	_ = sameAsC{}[dpinfo.ReasonDSREncap^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_DSR_ENCAP)]
	_ = sameAsC{}[dpinfo.ReasonDSRDecap^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_DSR_DECAP)]
	_ = sameAsC{}[dpinfo.ReasonDSRTooBig^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_DSR_TOO_BIG)]
	_ = sameAsC{}[dpinfo.ReasonDSRGSODecap^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_DSR_GSO_DECAP)]
	_ = sameAsC{}[dpinfo.ReasonProxyUpstreamReply^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_PROXY_UPSTREAM_REPLY)]
	_ = sameAsC{}[dpinfo.ReasonDSRUnknownNode^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_DSR_UNKNOWN_NODE)]
	_ = sameAsC{}[dpinfo.ReasonNATEntryLost^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_NAT_ENTRY_LOST)]
	_ = sameAsC{}[dpinfo.ReasonNodePortEntryMissing^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_NODEPORT_ENTRY_MISSING)]
	_ = sameAsC{}[dpinfo.ReasonMax^dpinfo.Reason(podtcShuntReasonSHUNT_REASON_MAX)]
	_ = sameAsC{}[dpinfo.DirFromPod^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_FROM_POD)]
	_ = sameAsC{}[dpinfo.DirToPod^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_TO_POD)]
	_ = sameAsC{}[dpinfo.DirConnect^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_CONNECT)]
	_ = sameAsC{}[dpinfo.DirSendmsg^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_SENDMSG)]
	_ = sameAsC{}[dpinfo.DirRecvmsg^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_RECVMSG)]
	_ = sameAsC{}[dpinfo.DirGetpeername^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_GETPEERNAME)]
	_ = sameAsC{}[dpinfo.DirGetsockopt^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_GETSOCKOPT)]
	_ = sameAsC{}[dpinfo.DirSockmsg^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_SOCKMSG)]
	_ = sameAsC{}[dpinfo.DirFromOverlay^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_FROM_OVERLAY)]
	_ = sameAsC{}[dpinfo.DirToUplink^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_TO_UPLINK)]
	_ = sameAsC{}[dpinfo.DirFromUplink^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_FROM_UPLINK)]
	_ = sameAsC{}[dpinfo.DirToOverlay^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_TO_OVERLAY)]
	_ = sameAsC{}[dpinfo.DirMax^dpinfo.Direction(podtcShuntDirectionSHUNT_DIR_MAX)]
)

// Flag names (enum endpoint_flags, enum ct_flags), one per bit.
var (
	endpointFlagNames = map[podtcEndpointFlags]string{
		podtcEndpointFlagsENDPOINT_F_INGRESS_ISOLATED: "ingress-isolated",
		podtcEndpointFlagsENDPOINT_F_EGRESS_ISOLATED:  "egress-isolated",
		podtcEndpointFlagsENDPOINT_F_INGRESS_RULES:    "ingress-rules",
		podtcEndpointFlagsENDPOINT_F_EGRESS_RULES:     "egress-rules",
		podtcEndpointFlagsENDPOINT_F_OWN_PROXY:        "own-proxy",
	}
	ctFlagNames = map[podtcCtFlags]string{
		podtcCtFlagsCT_F_ORIG_IS_A:      "opened-by-a",
		podtcCtFlagsCT_F_REPLY_SEEN:     "reply-seen",
		podtcCtFlagsCT_F_FIN_A:          "fin-a",
		podtcCtFlagsCT_F_FIN_B:          "fin-b",
		podtcCtFlagsCT_F_RST:            "rst",
		podtcCtFlagsCT_F_PROXY_UPSTREAM: "proxy-upstream",
		podtcCtFlagsCT_F_NO_TC_NAT:      "no-tc-nat",
		podtcCtFlagsCT_F_ANSWER:         "recorded-from-answer",
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

// proxyOriginByTC: tc filed the original destination (a pod's own proxy
// taking a client from off the node), not the socket hook.
const proxyOriginByTC = uint16(podtcProxyOriginFlagsPROXY_ORIGIN_F_TC)
