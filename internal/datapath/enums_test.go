package datapath

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/policy"
)

// goNames gives, for every enum of bpf/include/shunt.h whose values Go
// prints, Go's name for each of the given values ("" or a bare number: it
// has none).
var goNames = map[string]func(values []uint64) map[uint64]string{
	"shunt_reason":    enum(dpinfo.ReasonMax),
	"shunt_direction": enum(dpinfo.DirMax),
	"flow_verdict":    table(flowVerdictNames[:]),
	"flow_event_type": table(flowEventNames[:]),
	"flow_point":      table(flowPointNames[:]),
	"endpoint_flags":  flags(endpointFlagNames),
	"ct_flags":        flags(ctFlagNames),
	"masq_flags":      flags(masqFlagNames),
	"masq_dir":        table(masqDirNames[:]),
	"policy_verdict":  stringer(func(v uint64) string { return policy.Verdict(v).String() }),
	"flow_mode":       stringer(func(v uint64) string { return FlowMode(v).String() }),
	"shunt_identity":  reservedIdentities,
}

// notPrinted are the enums of shunt.h whose values Go never prints, and why.
var notPrinted = map[string]string{
	"shunt_fwd_mode":       "chosen from Mode (ModeRedirectPeer, ModeRedirect), which has its own names",
	"service_flags":        "bits the agent sets in shunt_services; dumps show the affinity timeout instead",
	"shunt_metrics_layout": "the size of shunt_metrics, no names",
	"nodeport_mode":        "chosen from dpinfo.NodePortMode (snat, dsr, hybrid), which has its own names",
	"accel_sock_flags":     "bits of socket storage, which user space cannot list",
	"affinity_client_kind": "map dump shows the client as an address or a netns cookie, by the kind",
	"proxy_origin_flags":   "one bit, PROXY_ORIGIN_F_TC, which map dump shows as redirectedBy tc (proxyOriginByTC)",
	"flow_icmp_error":      "a kind and a code packed in an icmp-error event's byte: icmpErrorName names the code (TestICMPErrorNames)",
	"shunt_tcp_option":     "the layout of the TCP option carrying an identity, which only the programs write and read (TestCarriedIdentity builds it)",
}

func table(names []string) func([]uint64) map[uint64]string {
	return func([]uint64) map[uint64]string {
		out := map[uint64]string{}
		for i, n := range names {
			out[uint64(i)] = n
		}
		return out
	}
}

// enum names the values of a dpinfo enum, 0 up to max (one past the last).
func enum[E interface {
	~uint8
	String() string
}](max E) func([]uint64) map[uint64]string {
	return func([]uint64) map[uint64]string {
		out := map[uint64]string{}
		for v := range max {
			out[uint64(v)] = v.String()
		}
		return out
	}
}

func flags[F ~uint32](names map[F]string) func([]uint64) map[uint64]string {
	return func([]uint64) map[uint64]string {
		out := map[uint64]string{}
		for bit, n := range names {
			out[uint64(bit)] = n
		}
		return out
	}
}

func stringer(name func(uint64) string) func([]uint64) map[uint64]string {
	return func(values []uint64) map[uint64]string {
		out := map[uint64]string{}
		// A new value that falls to the default case gets the name of
		// another value: the test finds the duplicate.
		for _, v := range values {
			out[v] = name(v)
		}
		return out
	}
}

// reservedIdentities: policy names the reserved identities; the others are
// the wildcard of policy keys and where the numbered ranges start.
func reservedIdentities(values []uint64) map[uint64]string {
	out := map[uint64]string{}
	for _, r := range policy.ReservedIdentities {
		out[uint64(r.ID)] = "reserved:" + r.Reserved
	}
	for v, what := range map[uint32]string{policy.IdentityAny: "any peer",
		policy.FirstPodIdentity: "first pod identity", policy.FirstCIDRIdentity: "first CIDR identity"} {
		if out[uint64(v)] == "" && slices.Contains(values, uint64(v)) {
			out[uint64(v)] = what
		}
	}
	return out
}

// TestEnumNames: every enum of shunt.h either names each of its values in
// Go, exactly the values the compiled objects have, each with a name of its
// own, or is listed with the reason Go never prints it. A value (or an
// enum) added in C without a name fails here, if not already at compile
// time.
func TestEnumNames(t *testing.T) {
	header, err := os.ReadFile("../../bpf/include/shunt.h")
	if err != nil {
		t.Fatal(err)
	}
	var inHeader []string
	for _, m := range regexp.MustCompile(`(?m)^enum (\w+) \{`).FindAllSubmatch(header, -1) {
		inHeader = append(inHeader, string(m[1]))
	}
	if len(inHeader) < 10 {
		t.Fatalf("found only %d enums in shunt.h (%v): has the header's layout changed?", len(inHeader), inHeader)
	}
	for _, enum := range inHeader {
		_, named := goNames[enum]
		_, why := notPrinted[enum]
		if named == why {
			t.Errorf("enum %s: list it in exactly one of goNames (with Go's names for its values) and notPrinted (with why)", enum)
		}
	}
	for enum := range maps.Keys(goNames) {
		if !slices.Contains(inHeader, enum) {
			t.Errorf("goNames names enum %s, which shunt.h does not have", enum)
		}
	}
	for enum := range maps.Keys(notPrinted) {
		if !slices.Contains(inHeader, enum) {
			t.Errorf("notPrinted lists enum %s, which shunt.h does not have", enum)
		}
	}

	for enum, names := range goNames {
		values, err := enumValues(enum)
		if err != nil {
			t.Errorf("%v: anchor it in the BTF (see the _btf_ variables of pod_tc.c) and generate it (-type)", err)
			continue
		}
		var nums []uint64
		byName := map[uint64]string{}
		for cname, v := range values {
			if strings.HasSuffix(cname, "_MAX") {
				continue // one past the last value
			}
			nums = append(nums, v)
			byName[v] = cname
		}
		goName := names(nums)
		seen := map[string]string{}
		for _, v := range nums {
			n := goName[v]
			if n == "" || n == fmt.Sprint(v) {
				t.Errorf("enum %s: %s (%d) has no name in Go", enum, byName[v], v)
				continue
			}
			if other, dup := seen[n]; dup {
				t.Errorf("enum %s: %s and %s are both named %q in Go", enum, other, byName[v], n)
			}
			seen[n] = byName[v]
		}
		for v, n := range goName {
			if _, ok := byName[v]; !ok && n != "" && n != fmt.Sprint(v) { // a bare number: no name (a value kept unused)
				t.Errorf("enum %s: Go names %d %q, a value the C enum does not have", enum, v, n)
			}
		}
	}
}

// TestFlowVerdictsMatch: the verdicts `shunt observe --verdict` accepts are
// the ones flow events carry.
func TestFlowVerdictsMatch(t *testing.T) {
	if !slices.Equal(flows.Verdicts, flowVerdictNames[:]) {
		t.Errorf("flows.Verdicts %v, the datapath's flow verdicts %v", flows.Verdicts, flowVerdictNames)
	}
}

func TestEnumValuesNamesWhatIsMissing(t *testing.T) {
	if _, err := enumValues("no_such_enum"); err == nil || !strings.Contains(err.Error(), "none of the BPF objects") {
		t.Errorf("unknown enum: %v", err)
	}
	v, err := enumValues("shunt_reason")
	if err != nil || v["SHUNT_REASON_CT_FULL"] != uint64(podtcShuntReasonSHUNT_REASON_CT_FULL) {
		t.Errorf("shunt_reason: %v, %v", v, err)
	}
}
