package datapath

import (
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// TestFlushMap: a flush deletes every entry of a map of per-connection
// state and counts them; the maps the agent writes, and names of no map,
// are refused before anything is deleted.
func TestFlushMap(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	for i := range uint32(50) {
		if err := d.objs.ShuntTcNat.Put(podtcTcNatKey{Saddr: i + 1, Proto: 6}, podtcTcNatValue{}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := d.FlushMap("shunt_tc_nat")
	if err != nil || res.Removed != 50 || res.Map != "shunt_tc_nat" || res.Effect == "" {
		t.Fatalf("FlushMap(shunt_tc_nat) = %+v, %v; want 50 removed, with its effect", res, err)
	}
	if n, err := countKeys(d.objs.ShuntTcNat); err != nil || n != 0 {
		t.Errorf("shunt_tc_nat holds %d entries after the flush (%v)", n, err)
	}
	if res, err := d.FlushMap("shunt_tc_nat"); err != nil || res.Removed != 0 {
		t.Errorf("flushing an empty map: %+v, %v; want 0 removed", res, err)
	}

	if err := d.objs.ShuntEndpoints.Put(podtcEndpointKey{Ip4: 7}, podtcEndpointInfo{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.FlushMap("shunt_endpoints"); err == nil || !strings.Contains(err.Error(), "shunt sync") || !strings.Contains(err.Error(), "shunt_ct_new") {
		t.Errorf("FlushMap(shunt_endpoints): %v; want a refusal naming shunt sync and the maps that are flushed", err)
	}
	if n, _ := countKeys(d.objs.ShuntEndpoints); n != 1 {
		t.Errorf("a refused flush left shunt_endpoints with %d entries, want its 1", n)
	}
	if _, err := d.FlushMap("shunt_nosuch"); err == nil || !strings.Contains(err.Error(), "shunt map list") {
		t.Errorf("FlushMap(shunt_nosuch): %v; want an error naming shunt map list", err)
	}
}

// TestFlushGroupsAreFlushable: every map `shunt map flush` names in a
// group is one FlushMap empties, and every such map is in a group.
func TestFlushGroupsAreFlushable(t *testing.T) {
	inGroup := map[string]bool{}
	for group, names := range dpinfo.FlushGroups {
		for _, name := range names {
			inGroup[name] = true
			if md, ok := describe(name); !ok || md.flushed == "" {
				t.Errorf("flush group %s names %s, which FlushMap refuses", group, name)
			}
		}
	}
	for _, name := range flushable() {
		if !inGroup[name] {
			t.Errorf("%s can be flushed but is in no flush group", name)
		}
	}
}
