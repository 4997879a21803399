// Package dpinfo holds what the datapath reports, in types that import
// nothing of the kernel: the reasons and directions of its counters and
// flows (the values of bpf/include/shunt.h's enums, with the names Go
// prints), the counters themselves, the description and decoded rows of
// its maps, protocol names and port ranges. The CLI and the agent's API
// use them without linking cilium/ebpf or internal/datapath, the way
// Cilium keeps pkg/maps/lbmap's types apart from the map code.
//
// internal/datapath checks at compile time that every constant here is
// the value bpf2go generated from the C enum (internal/datapath/enums.go),
// and TestEnumNames that every value of the enums has a name.
package dpinfo

// FlowModeDefaultReports says what the default flow sampling reports, for
// every help text and error that names it. bpf/lib/flow_events.h's
// flow_wanted decides: every event but FLOW_EV_PACKET.
const FlowModeDefaultReports = "drops, connection starts and ends, service translations, ICMP errors about connections"

// FlowModeChoices names the --flow-sampling values and what each reports.
const FlowModeChoices = "off, default (" + FlowModeDefaultReports + ") or all (every packet)"
