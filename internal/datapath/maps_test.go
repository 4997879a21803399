package datapath

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/dpinfo"
)

// TestMapTable: every map of the BPF objects is described in mapTable
// exactly once, and mapTable describes no map the objects lack. A new map
// without a description fails here.
func TestMapTable(t *testing.T) {
	specs, err := objectSpecs()
	if err != nil {
		t.Fatal(err)
	}
	inObjects := map[string]bool{}
	for _, spec := range specs {
		for name := range spec.Maps {
			if !strings.HasPrefix(name, ".") { // .rodata and friends: global variables
				inObjects[name] = true
			}
		}
	}
	described := map[string]int{}
	for _, md := range mapTable {
		described[md.name]++
		if md.about == "" || md.of == nil {
			t.Errorf("%s: the description needs what the map holds and how to reach it", md.name)
		}
		if md.refuse != "" && md.insertFailed != "" {
			t.Errorf("%s: written by the agent and inserted into by programs?", md.name)
		}
		if md.insertFailed != "" && !dpinfo.InsertFailed(md.insertFailed) {
			t.Errorf("%s: %q is not a reason for a failed insert", md.name, md.insertFailed)
		}
	}
	for name := range inObjects {
		if described[name] != 1 {
			t.Errorf("map %s is described %d times in mapTable, want once", name, described[name])
		}
	}
	for name := range described {
		if !inObjects[name] {
			t.Errorf("mapTable describes %s, which no BPF object has", name)
		}
	}
}

// TestMapTableMatchesKernel: each description reaches the map of its name,
// lists it and dumps it; capacity checks name the map.
func TestMapTableMatchesKernel(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	// Load the socket iterator, so its map is there too.
	if _, err := d.DestroyUDPSockets([]string{""}, []netip.AddrPort{netip.MustParseAddrPort("10.254.0.1:53")}); err != nil {
		t.Logf("socket iterator not loaded, its map is not listed: %v", err)
	}
	infos, err := d.Maps()
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]dpinfo.MapInfo{}
	for _, mi := range infos {
		listed[mi.Name] = mi
	}
	for _, md := range mapTable {
		m := md.of(d)
		if m == nil {
			continue
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		// The kernel keeps the first 15 characters of a map's name.
		if !strings.HasPrefix(md.name, info.Name) || len(info.Name) < min(len(md.name), 15) {
			t.Errorf("%s reaches the map %q", md.name, info.Name)
		}
		mi, ok := listed[md.name]
		if !ok {
			t.Errorf("%s is not listed", md.name)
			continue
		}
		if mi.About != md.about || mi.Dumpable != (md.dump != nil) {
			t.Errorf("%s listed as %+v", md.name, mi)
		}
		if want := !slices.Contains(unpinnedMaps, md.name); mi.Pinned != want {
			t.Errorf("%s: pinned %v, want %v", md.name, mi.Pinned, want)
		}
		if md.dump != nil {
			if _, err := d.DumpMap(md.name, false); err != nil {
				t.Errorf("dumping %s: %v", md.name, err)
			}
		}
	}
	if !slices.IsSortedFunc(infos, func(a, b dpinfo.MapInfo) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("maps are not listed by name")
	}
	if ct := listed["shunt_ct_new"]; !strings.Contains(ct.WhenFull, "least recently used") || !strings.Contains(ct.WhenFull, "ct-full") {
		t.Errorf("shunt_ct_new when full: %q", ct.WhenFull)
	}
	if ct := listed["shunt_ct"]; !strings.Contains(ct.WhenFull, "least recently used") || !strings.Contains(ct.WhenFull, "ct-promote-failed") {
		t.Errorf("shunt_ct when full: %q", ct.WhenFull)
	}
	if _, err := d.DumpMap("shunt_sock_svc", false); err == nil || !strings.Contains(err.Error(), "cannot be listed") {
		t.Errorf("dumping socket storage: %v", err)
	}
	if _, err := d.DumpMap("shunt_nope", false); err == nil || !strings.Contains(err.Error(), "shunt map list") {
		t.Errorf("dumping a map that does not exist: %v", err)
	}
	if err := d.checkFits("shunt_policy", 1<<30); err == nil || !strings.Contains(err.Error(), "shunt_policy is full") ||
		!strings.Contains(err.Error(), policyStays) {
		t.Errorf("capacity check: %v", err)
	}
}

// TestMapInfoTypes: the array types dpinfo.MapInfo.Fills leaves out are
// named as cilium/ebpf names them.
func TestMapInfoTypes(t *testing.T) {
	if ebpf.Array.String() != dpinfo.TypeArray || ebpf.PerCPUArray.String() != dpinfo.TypePerCPUArray {
		t.Errorf("cilium/ebpf names the arrays %q and %q, dpinfo %q and %q",
			ebpf.Array, ebpf.PerCPUArray, dpinfo.TypeArray, dpinfo.TypePerCPUArray)
	}
}
