package dpinfo

import "fmt"

// MapInfo describes one map of the datapath.
type MapInfo struct {
	Name     string `json:"name"`
	About    string `json:"about"`   // what the map holds
	Type     string `json:"type"`    // cilium/ebpf's name of the map type: Hash, LRUHash, Array, ...
	Entries  int    `json:"entries"` // -1: not countable (ring buffer, socket storage)
	Capacity int    `json:"capacity"`
	Pinned   bool   `json:"pinned"`
	Dumpable bool   `json:"dumpable"`
	WhenFull string `json:"whenFull,omitempty"` // what happens when it is full
}

// The map types whose entries always exist, as MapInfo.Type says them
// (ebpf.Array.String() and ebpf.PerCPUArray.String(); a test of
// internal/datapath holds them to it).
const (
	TypeArray       = "Array"
	TypePerCPUArray = "PerCPUArray"
)

// Fills says whether the map has a fill level: entries that come and go
// (not an array, whose entries always exist, nor a map that cannot count).
func (m MapInfo) Fills() bool {
	return m.Entries >= 0 && m.Capacity > 0 && m.Type != TypeArray && m.Type != TypePerCPUArray
}

// Pressure is a health message when the map is 90% full or more, else "".
func (m MapInfo) Pressure() string {
	if !m.Fills() || m.Entries*10 < m.Capacity*9 {
		return ""
	}
	msg := fmt.Sprintf("map %s is %d%% full (%d of %d)", m.Name, 100*m.Entries/m.Capacity, m.Entries, m.Capacity)
	if m.WhenFull != "" {
		msg += ": " + m.WhenFull
	}
	return msg
}

// Row is one decoded map entry: column name -> value.
type Row map[string]any

// ProtoName names an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case 1:
		return "ICMP"
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// FlushGroups are the sets of maps `shunt map flush` empties together,
// by the name an operator gives: the state the programs keep per
// connection or per client, which they rebuild from the next packets.
// The maps the agent writes from the desired state are in none: emptying
// one would only stop traffic until `shunt sync` wrote it again.
var FlushGroups = map[string][]string{
	"conntrack": {"shunt_ct", "shunt_ct_new"},
	"nat":       {"shunt_tc_nat", "shunt_masq_nat", "shunt_nodeport_nat"},
	"affinity":  {"shunt_affinity"},
}

// MapFlush is what one map's flush removed.
type MapFlush struct {
	Map     string `json:"map"`
	Removed int    `json:"removed"` // entries deleted
	Effect  string `json:"effect"`  // what it does to the traffic
}
