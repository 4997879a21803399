package datapath

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// TestLayoutOfThisBuild: every pinned map of the objects has a
// layout, and the layouts read from BTF put fields where the C header does
// (nested structs flattened, a scalar key as one unnamed field).
func TestLayoutOfThisBuild(t *testing.T) {
	specs, err := loadSpecs()
	if err != nil {
		t.Fatal(err)
	}
	layouts := map[string]mapLayout{}
	for _, spec := range specs.list(true) {
		for name, ms := range spec.Maps {
			if ms.Pinning != ebpf.PinByName {
				continue
			}
			l, err := layoutOfSpec(ms)
			if err != nil {
				t.Fatal(err)
			}
			if prev, ok := layouts[name]; ok && !slices.Equal(prev.Value, l.Value) {
				t.Errorf("%s has two layouts in one build: %+v and %+v", name, prev, l)
			}
			layouts[name] = l
		}
	}
	for _, md := range mapTable {
		if _, ok := layouts[md.name]; !ok && !slices.Contains(unpinnedMaps, md.name) {
			t.Errorf("pinned map %s has no layout", md.name)
		}
	}
	want := map[string][]field{
		"shunt_ct value": {{Name: "last_seen_ns", Size: 8}, {Name: "created_ns", Offset: 8, Size: 8},
			{Name: "flags", Offset: 16, Size: 4}, {Name: "rule_id", Offset: 20, Size: 4}},
		"shunt_backends key": {{Size: 4}},
	}
	got := map[string][]field{"shunt_ct value": layouts["shunt_ct"].Value, "shunt_backends key": layouts["shunt_backends"].Key}
	for what, w := range want {
		if !slices.Equal(got[what], w) {
			t.Errorf("%s: got %+v, want %+v", what, got[what], w)
		}
	}
	fieldAt := func(fs []field, name string) field {
		i := slices.IndexFunc(fs, func(f field) bool { return f.Name == name })
		if i < 0 {
			t.Fatalf("no field %s in %+v", name, fs)
		}
		return fs[i]
	}
	if f := fieldAt(layouts["shunt_endpoints"].Value, "node_mac"); f.Offset != 14 || f.Size != 6 {
		t.Errorf("shunt_endpoints node_mac: %+v, want offset 14 size 6", f)
	}
	if f := fieldAt(layouts["shunt_accel_socks"].Value, "peer.local_port"); f.Offset != 16 || f.Size != 2 {
		t.Errorf("shunt_accel_socks peer.local_port: %+v, want offset 16 size 2 (struct sock_key nested at 0)", f)
	}
}

// TestFlatten: unions and anonymous members, arrays of structs and
// bitfields become flat fields with their bytes.
func TestFlatten(t *testing.T) {
	u8 := &btf.Int{Name: "u8", Size: 1}
	u16 := &btf.Int{Name: "u16", Size: 2}
	u32 := &btf.Int{Name: "u32", Size: 4}
	pair := &btf.Struct{Name: "pair", Size: 4, Members: []btf.Member{{Name: "a", Type: u16}, {Name: "b", Type: u16, Offset: 16}}}
	v := &btf.Struct{Name: "v", Size: 16, Members: []btf.Member{
		{Name: "", Type: &btf.Union{Size: 4, Members: []btf.Member{{Name: "whole", Type: u32}, {Name: "bytes", Type: &btf.Array{Type: u8, Nelems: 4}}}}},
		{Name: "pairs", Type: &btf.Array{Type: pair, Nelems: 2}, Offset: 32},
		{Name: "lo", Type: u32, Offset: 96, BitfieldSize: 3},
		{Name: "hi", Type: u32, Offset: 99, BitfieldSize: 13},
	}}
	got, err := fieldsOf(&btf.Typedef{Name: "v_t", Type: v}, 16)
	if err != nil {
		t.Fatal(err)
	}
	want := []field{
		{Name: "whole", Size: 4}, {Name: "bytes", Size: 4},
		{Name: "pairs[0].a", Offset: 4, Size: 2}, {Name: "pairs[0].b", Offset: 6, Size: 2},
		{Name: "pairs[1].a", Offset: 8, Size: 2}, {Name: "pairs[1].b", Offset: 10, Size: 2},
		{Name: "lo", Offset: 12, Size: 1, BitOffset: 96, Bits: 3}, {Name: "hi", Offset: 12, Size: 2, BitOffset: 99, Bits: 13},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

// TestLayoutIncompatibilities: what a later build may do to a pinned
// layout (add fields in padding or reserved bytes, drop a field, rename
// padding) and what it may not (move or resize a field, put a new field on
// bytes that held data, change the map's type or sizes).
func TestLayoutIncompatibilities(t *testing.T) {
	pinned := mapLayout{Type: "Hash", KeySize: 4, ValueSize: 16, Key: []field{{Size: 4}},
		Value: []field{{Name: "id", Size: 4}, {Name: "flags", Offset: 4, Size: 2}, {Name: "pad", Offset: 6, Size: 2}, {Name: "count", Offset: 8, Size: 4}}}
	with := func(value ...field) mapLayout {
		l := pinned
		l.Value = value
		return l
	}
	id, flags, pad, count := pinned.Value[0], pinned.Value[1], pinned.Value[2], pinned.Value[3]
	for _, c := range []struct {
		name  string
		build mapLayout
		want  []string // substrings of the one problem; nil: compatible
	}{
		{"identical", pinned, nil},
		{"new field in trailing padding", with(id, flags, pad, count, field{Name: "extra", Offset: 12, Size: 4}), nil},
		{"new field in a reserved field", with(id, flags, field{Name: "proto", Offset: 6, Size: 1}, field{Name: "pad2", Offset: 7, Size: 1}, count), nil},
		{"field dropped, its bytes unused", with(id, pad, count), nil},
		{"field dropped, padding kept under a new name", with(id, flags, field{Name: "reserved", Offset: 6, Size: 2}, count), nil},
		{"field moved", with(id, field{Name: "flags", Offset: 6, Size: 2}, field{Name: "pad", Offset: 4, Size: 2}, count),
			[]string{"m value field flags: pinned at offset 4 size 2, this build has it at offset 6 size 2"}},
		{"field grown", with(id, field{Name: "flags", Offset: 4, Size: 4}, count),
			[]string{"m value field flags", "offset 4 size 2", "offset 4 size 4"}},
		{"new field on a dropped field's bytes", with(id, flags, pad, field{Name: "total", Offset: 8, Size: 4}),
			[]string{"m value field total (offset 8 size 4) is new and takes bytes of the pinned field count (offset 8 size 4)"}},
		{"type changed", func() mapLayout { l := pinned; l.Type = "LRUHash"; return l }(),
			[]string{"m: pinned as a Hash", "this build's is a LRUHash"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := incompatibilities("m", pinned, c.build)
			if c.want == nil {
				if len(got) > 0 {
					t.Errorf("compatible layout refused: %q", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("want one problem containing %q, got %q", c.want, got)
			}
			for _, w := range c.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("problem %q does not say %q", got[0], w)
				}
			}
		})
	}
}

// pinnedState is what a refused start must leave alone: the pins and the
// maps behind them, and the layout file.
type pinnedState struct {
	maps   map[string]ebpf.MapID
	layout []byte
}

func readPinnedState(t *testing.T, pinDir, layoutFile string) pinnedState {
	t.Helper()
	s := pinnedState{maps: map[string]ebpf.MapID{}}
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, e.Name()), nil)
		if err != nil {
			t.Fatalf("pin %s: %v", e.Name(), err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		s.maps[e.Name()], _ = info.ID()
	}
	s.layout, _ = os.ReadFile(layoutFile)
	return s
}

func (s pinnedState) equal(o pinnedState) bool {
	return bytes.Equal(s.layout, o.layout) && maps.Equal(s.maps, o.maps)
}

// openAndClose opens a datapath on pinDir recording layouts in layoutFile,
// closes it (the pins stay, as when an agent stops) and returns its notes.
func openAndClose(t *testing.T, pinDir, layoutFile string) (notes, warnings []string) {
	t.Helper()
	d, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, LayoutFile: layoutFile}))
	if err != nil {
		t.Fatal(err)
	}
	notes, warnings = d.LayoutNotes()
	d.Close()
	return notes, warnings
}

func readLayouts(t *testing.T, layoutFile string) mapLayouts {
	t.Helper()
	var l mapLayouts
	data, err := os.ReadFile(layoutFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func writeLayouts(t *testing.T, layoutFile string, l mapLayouts) {
	t.Helper()
	data, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(layoutFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOpenRecordsAndAdoptsLayouts: the first start records every pinned
// map's layout; a restart of the same build adopts them without a note and
// leaves the file as it is.
func TestOpenRecordsAndAdoptsLayouts(t *testing.T) {
	requireBPF(t)
	pinDir, layoutFile := testPinDir(t), filepath.Join(t.TempDir(), "map-layout.json")
	openAndClose(t, pinDir, layoutFile)
	first := readPinnedState(t, pinDir, layoutFile)
	if l := readLayouts(t, layoutFile); len(l.Maps) != len(first.maps) {
		t.Errorf("layouts recorded for %d maps, %d are pinned", len(l.Maps), len(first.maps))
	}
	notes, warnings := openAndClose(t, pinDir, layoutFile)
	if len(notes)+len(warnings) > 0 {
		t.Errorf("restart of the same build: notes %q, warnings %q; want none", notes, warnings)
	}
	if !first.equal(readPinnedState(t, pinDir, layoutFile)) {
		t.Error("a restart of the same build replaced pinned maps or rewrote the layout file")
	}
}

// TestOpenRefusesIncompatibleLayout: pins recorded with two fields of
// shunt_ct's value swapped (same sizes: cilium/ebpf alone would adopt
// them) are refused with a message naming the map, the field, both places
// and what to do, and nothing is changed: not the pinned maps, not the
// file, and a map missing from the pins is not created.
func TestOpenRefusesIncompatibleLayout(t *testing.T) {
	requireBPF(t)
	pinDir, layoutFile := testPinDir(t), filepath.Join(t.TempDir(), "map-layout.json")
	openAndClose(t, pinDir, layoutFile)
	l := readLayouts(t, layoutFile)
	ct := l.Maps["shunt_ct"]
	ct.Value = []field{{Name: "last_seen_ns", Size: 8}, {Name: "created_ns", Offset: 8, Size: 8},
		{Name: "rule_id", Offset: 16, Size: 4}, {Name: "flags", Offset: 20, Size: 4}}
	l.Maps["shunt_ct"] = ct
	writeLayouts(t, layoutFile, l)
	if err := os.Remove(filepath.Join(pinDir, "shunt_policy")); err != nil {
		t.Fatal(err)
	}
	before := readPinnedState(t, pinDir, layoutFile)

	_, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, LayoutFile: layoutFile}))
	if err == nil {
		t.Fatal("opened pins of an incompatible layout")
	}
	for _, want := range []string{"shunt_ct value field flags: pinned at offset 20 size 4, this build has it at offset 16 size 4",
		"shunt_ct value field rule_id: pinned at offset 16 size 4, this build has it at offset 20 size 4",
		"Nothing was changed", "run the previous shunt build", "shunt uninstall"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal does not say %q:\n%v", want, err)
		}
	}
	if err := CheckPinnedLayouts(pinDir, layoutFile); err == nil || !strings.Contains(err.Error(), "shunt_ct value field flags") {
		t.Errorf("CheckPinnedLayouts: %v, want the same refusal", err)
	}
	if !before.equal(readPinnedState(t, pinDir, layoutFile)) {
		t.Error("a refused start changed the pins or the layout file")
	}
}

// TestOpenAdoptsCompatibleLayout: pins of a build whose shunt_ct value had
// rule_id's bytes reserved, and a recorded map this build does not have,
// are adopted; the file then holds this build's layout and still the other
// map's. A map that is new to this build (neither pinned nor recorded) is
// created.
func TestOpenAdoptsCompatibleLayout(t *testing.T) {
	requireBPF(t)
	pinDir, layoutFile := testPinDir(t), filepath.Join(t.TempDir(), "map-layout.json")
	openAndClose(t, pinDir, layoutFile)
	l := readLayouts(t, layoutFile)
	ct := l.Maps["shunt_ct"]
	ct.Value = slices.Clone(ct.Value)
	ct.Value[3] = field{Name: "reserved", Offset: 20, Size: 4}
	l.Maps["shunt_ct"] = ct
	l.Maps["shunt_retired"] = mapLayout{Type: "Hash", KeySize: 4, ValueSize: 4, Key: []field{{Size: 4}}, Value: []field{{Size: 4}}}
	delete(l.Maps, "shunt_backends")
	writeLayouts(t, layoutFile, l)
	if err := os.Remove(filepath.Join(pinDir, "shunt_backends")); err != nil {
		t.Fatal(err)
	}
	ctBefore := readPinnedState(t, pinDir, layoutFile).maps["shunt_ct"]

	notes, warnings := openAndClose(t, pinDir, layoutFile)
	if len(notes)+len(warnings) > 0 {
		t.Errorf("notes %q, warnings %q; want none (every pinned map has a recorded layout)", notes, warnings)
	}
	after := readPinnedState(t, pinDir, layoutFile)
	if after.maps["shunt_ct"] != ctBefore {
		t.Error("shunt_ct was replaced, not adopted")
	}
	if after.maps["shunt_backends"] == 0 {
		t.Error("the new map shunt_backends was not created")
	}
	got := readLayouts(t, layoutFile)
	if f := got.Maps["shunt_ct"].Value[3]; f.Name != "rule_id" {
		t.Errorf("shunt_ct's recorded value ends with %+v, want this build's rule_id", f)
	}
	if _, ok := got.Maps["shunt_backends"]; !ok {
		t.Error("the new map's layout was not recorded")
	}
	if _, ok := got.Maps["shunt_retired"]; !ok {
		t.Error("the layout of a pinned map this build does not have was dropped")
	}
}

// TestOpenWithoutLayoutFile: pins of a build that recorded no layout are
// checked against the BTF the kernel keeps with each map, and refused when
// it differs; a map created without BTF is adopted unchecked with a
// warning naming it. Either way the layouts are then recorded.
func TestOpenWithoutLayoutFile(t *testing.T) {
	requireBPF(t)
	pinDir, layoutFile := testPinDir(t), filepath.Join(t.TempDir(), "map-layout.json")
	openAndClose(t, pinDir, "")
	specs, err := loadSpecs()
	if err != nil {
		t.Fatal(err)
	}
	backends := specs.sockAddr.Maps["shunt_backends"].Copy()
	repin := func(ms *ebpf.MapSpec) {
		t.Helper()
		pin := filepath.Join(pinDir, ms.Name)
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Pin(pin); err != nil {
			t.Fatal(err)
		}
	}

	// An older build whose backend value had port and proto swapped.
	swapped := backends.Copy()
	u8, u16, u32 := &btf.Int{Name: "u8", Size: 1}, &btf.Int{Name: "u16", Size: 2}, &btf.Int{Name: "u32", Size: 4}
	swapped.Value = &btf.Struct{Name: "backend_value", Size: 8, Members: []btf.Member{
		{Name: "ip", Type: u32}, {Name: "proto", Type: u8, Offset: 32}, {Name: "pad", Type: u8, Offset: 40}, {Name: "port", Type: u16, Offset: 48}}}
	repin(swapped)
	_, err = Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, LayoutFile: layoutFile}))
	if err == nil || !strings.Contains(err.Error(), "shunt_backends value field port: pinned at offset 6 size 2, this build has it at offset 4 size 2") {
		t.Fatalf("pins whose BTF differs: %v, want a refusal naming shunt_backends' port", err)
	}
	if _, err := os.Stat(layoutFile); err == nil {
		t.Error("a refused start wrote the layout file")
	}

	// The same map without BTF: nothing to check it against.
	plain := backends.Copy()
	plain.Key, plain.Value = nil, nil
	repin(plain)
	notes, warnings := openAndClose(t, pinDir, layoutFile)
	if len(warnings) != 1 || !strings.HasSuffix(warnings[0], "adopted without a layout check: shunt_backends") {
		t.Errorf("warnings %q, want one naming shunt_backends alone as adopted unchecked", warnings)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "checked against the BTF the kernel keeps") || !strings.Contains(notes[0], "shunt_ct") {
		t.Errorf("notes %q, want one saying the other maps were checked against their BTF", notes)
	}
	if l := readLayouts(t, layoutFile); len(l.Maps["shunt_backends"].Value) == 0 {
		t.Error("layouts not recorded after adopting pins without a layout file")
	}
}

// unpinnedMaps are the maps no later agent reads again: a ring buffer, the
// tables of one run of an iterator or one packet, a program array filled
// at load.
var unpinnedMaps = []string{"shunt_flows", "shunt_gone_backends", "shunt_overlay_wire", "shunt_encap_scratch"}
