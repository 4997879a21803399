package datapath

// Layout compatibility of pinned maps. A restarted or upgraded agent adopts
// the maps pinned by the one before it, entries and all. cilium/ebpf refuses
// a pinned map whose type or key/value sizes differ, but a change that keeps
// the sizes (a field moved, padding given a meaning) would be adopted and
// read wrongly. So the layout of every pinned map's key and value (field
// names, offsets and sizes, from the BTF of the objects) is recorded when the
// maps are created, and compared with this build's before anything is
// loaded: same → adopt; compatible (every field of both keeps its place, new
// fields only take bytes that were padding or reserved) → adopt and record the
// new layout; otherwise refuse, naming the map, the field and both places.

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/shuntnet/shunt/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// countersMap holds counters only: a pinned one of another layout is
// replaced (replaceOldCounters), not refused.
const countersMap = "shunt_metrics"

// mapLayouts is the layout file: every pinned map's layout, by map name.
type mapLayouts struct {
	Maps map[string]mapLayout `json:"maps"`
}

// mapLayout is the shape of one map's key and value.
type mapLayout struct {
	Type      string  `json:"type"`
	KeySize   uint32  `json:"keySize"`
	ValueSize uint32  `json:"valueSize"`
	Key       []field `json:"key"`
	Value     []field `json:"value"`
}

// field is one scalar (or array of scalars) of a key or value, nested
// structs and unions flattened into dotted names ("a.b", "c[2].d"); a key or
// value that is a plain scalar is one field named "".
type field struct {
	Name   string `json:"name"`
	Offset uint32 `json:"offset"` // bytes from the start of the key or value
	Size   uint32 `json:"size"`   // bytes
	// A bitfield: its first bit (from the start of the key or value) and
	// width; Offset and Size are the bytes holding it.
	BitOffset uint32 `json:"bitOffset,omitempty"`
	Bits      uint32 `json:"bits,omitempty"`
}

// bitRange is where the field lies, in bits: [start, end).
func (f field) bitRange() (start, end uint32) {
	if f.Bits > 0 {
		return f.BitOffset, f.BitOffset + f.Bits
	}
	return 8 * f.Offset, 8 * (f.Offset + f.Size)
}

func (f field) place() string {
	if f.Bits > 0 {
		return fmt.Sprintf("bits %d-%d", f.BitOffset, f.BitOffset+f.Bits-1)
	}
	return fmt.Sprintf("offset %d size %d", f.Offset, f.Size)
}

// reservedName matches fields that hold nothing yet (padding made explicit,
// room kept for later): a later build may give their bytes a meaning.
var reservedName = regexp.MustCompile(`^_*(pad|padding|reserved|rsvd|unused)[0-9_]*$`)

func (f field) reserved() bool {
	return reservedName.MatchString(f.Name[strings.LastIndexAny(f.Name, ".")+1:])
}

// layoutOfSpec is the layout a map spec gives its key and value.
func layoutOfSpec(ms *ebpf.MapSpec) (mapLayout, error) {
	l := mapLayout{Type: ms.Type.String(), KeySize: ms.KeySize, ValueSize: ms.ValueSize}
	var err error
	if l.Key, err = fieldsOf(ms.Key, ms.KeySize); err != nil {
		return l, fmt.Errorf("layout of %s's key: %w", ms.Name, err)
	}
	if l.Value, err = fieldsOf(ms.Value, ms.ValueSize); err != nil {
		return l, fmt.Errorf("layout of %s's value: %w", ms.Name, err)
	}
	return l, nil
}

// fieldsOf flattens a key or value type; without a type (a map declared by
// sizes only) it is one opaque field of size bytes.
func fieldsOf(t btf.Type, size uint32) ([]field, error) {
	if t == nil {
		if size == 0 {
			return nil, nil
		}
		return []field{{Offset: 0, Size: size}}, nil
	}
	var out []field
	err := flatten(t, "", 0, &out)
	return out, err
}

// flatten appends the scalar fields of t, which starts at bit base.
func flatten(t btf.Type, name string, base uint32, out *[]field) error {
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		return flattenMembers(v.Members, name, base, out)
	case *btf.Union:
		return flattenMembers(v.Members, name, base, out)
	case *btf.Array:
		elem := btf.UnderlyingType(v.Type)
		switch elem.(type) {
		case *btf.Struct, *btf.Union, *btf.Array:
			size, err := btf.Sizeof(elem)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			for i := range v.Nelems {
				if err := flatten(elem, fmt.Sprintf("%s[%d]", name, i), base+8*i*uint32(size), out); err != nil {
					return err
				}
			}
			return nil
		}
	}
	size, err := btf.Sizeof(t)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	*out = append(*out, field{Name: name, Offset: base / 8, Size: uint32(size)})
	return nil
}

func flattenMembers(members []btf.Member, name string, base uint32, out *[]field) error {
	for _, m := range members {
		n := m.Name
		if name != "" && n != "" {
			n = name + "." + n
		} else if n == "" {
			n = name // an anonymous struct or union: its members belong to the outer one
		}
		at := base + uint32(m.Offset)
		if m.BitfieldSize > 0 {
			first, end := at/8, (at+uint32(m.BitfieldSize)+7)/8
			*out = append(*out, field{Name: n, Offset: first, Size: end - first, BitOffset: at, Bits: uint32(m.BitfieldSize)})
			continue
		}
		if err := flatten(m.Type, n, at, out); err != nil {
			return err
		}
	}
	return nil
}

// incompatibilities lists why maps of layout old cannot be read as layout
// new, one line per problem; none when they can.
func incompatibilities(name string, old, new mapLayout) []string {
	var out []string
	if old.Type != new.Type || old.KeySize != new.KeySize || old.ValueSize != new.ValueSize {
		out = append(out, fmt.Sprintf("%s: pinned as a %s with %d-byte keys and %d-byte values, this build's is a %s with %d-byte keys and %d-byte values",
			name, old.Type, old.KeySize, old.ValueSize, new.Type, new.KeySize, new.ValueSize))
		return out
	}
	out = append(out, fieldIncompatibilities(name+" key", old.Key, new.Key)...)
	return append(out, fieldIncompatibilities(name+" value", old.Value, new.Value)...)
}

func fieldIncompatibilities(what string, old, new []field) []string {
	var out []string
	named := func(f field) string {
		if f.Name == "" {
			return what
		}
		return what + " field " + f.Name
	}
	oldByName := map[string]field{}
	for _, f := range old {
		oldByName[f.Name] = f
	}
	for _, f := range new {
		if f.reserved() {
			continue // this build does not read it: it may lie anywhere
		}
		if o, ok := oldByName[f.Name]; ok {
			if o.Offset != f.Offset || o.Size != f.Size || o.BitOffset != f.BitOffset || o.Bits != f.Bits {
				out = append(out, fmt.Sprintf("%s: pinned at %s, this build has it at %s", named(f), o.place(), f.place()))
			}
			continue
		}
		// A new field: it must take only bytes the pinned layout left
		// unused or reserved, or it would read another field's data.
		start, end := f.bitRange()
		for _, o := range old {
			oldStart, oldEnd := o.bitRange()
			if oldStart < end && start < oldEnd && !o.reserved() {
				out = append(out, fmt.Sprintf("%s (%s) is new and takes bytes of the pinned %s (%s)",
					named(f), f.place(), strings.TrimPrefix(named(o), what+" "), o.place()))
				break
			}
		}
	}
	return out
}

// layoutCheck is what checkLayouts found: the layouts to record once the
// maps are loaded and how the pinned maps were checked.
type layoutCheck struct {
	record   mapLayouts
	read     []byte   // the layout file as read (nil: none)
	notes    []string // how maps without a recorded layout were checked, counters replaced
	warnings []string // maps adopted unchecked
	replace  []string // pinned maps to unpin first: counters of another layout
}

// checkLayouts compares the maps pinned under pinDir with the pinned maps of
// specs (this build's), before anything is created, pinned or attached, and
// refuses maps this build would read wrongly. The pinned layouts come from
// layoutFile, or, for maps it does not list (pins of a build that recorded
// none), from the BTF the kernel keeps with each map; a map with neither is
// adopted unchecked, and the notes say so.
func checkLayouts(pinDir, layoutFile string, specs ...*ebpf.CollectionSpec) (*layoutCheck, error) {
	c := &layoutCheck{record: mapLayouts{Maps: map[string]mapLayout{}}}
	var recorded mapLayouts
	if layoutFile != "" {
		data, err := os.ReadFile(layoutFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("reading the pinned maps' layouts: %w", err)
		default:
			if err := json.Unmarshal(data, &recorded); err != nil {
				return nil, fmt.Errorf("reading the pinned maps' layouts from %s: %w; if it is damaged, remove it: "+
					"the maps pinned under %s are then checked against the BTF the kernel keeps for them", layoutFile, err, pinDir)
			}
			c.read = data
		}
	}
	// Maps this build no longer has keep their record: their pins stay
	// for a build that has them.
	maps.Copy(c.record.Maps, recorded.Maps)

	var problems, fromBTF, unchecked []string
	seen := map[string]bool{}
	for _, spec := range specs {
		for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
			ms := spec.Maps[name]
			if ms.Pinning != ebpf.PinByName || seen[name] {
				continue // not pinned, or shared with an earlier spec
			}
			seen[name] = true
			want, err := layoutOfSpec(ms)
			if err != nil {
				return nil, err
			}
			c.record.Maps[name] = want
			old, how, err := pinnedLayout(filepath.Join(pinDir, name), ms, recorded)
			if err != nil {
				return nil, err
			}
			var p []string
			switch how {
			case pinNone:
				continue
			case pinIncompatible:
				p = []string{fmt.Sprintf("%s: %v", name, old.mismatch)}
			case pinFromBTF:
				fromBTF = append(fromBTF, name)
				p = incompatibilities(name, old.layout, want)
			case pinUnchecked:
				unchecked = append(unchecked, name)
			case pinRecorded:
				p = incompatibilities(name, old.layout, want)
			}
			if len(p) > 0 && name == countersMap {
				c.replace = append(c.replace, name)
				c.notes = append(c.notes, fmt.Sprintf("%s is of another layout (%s): replaced, its counts start again from zero", name, strings.Join(p, "; ")))
				continue
			}
			problems = append(problems, p...)
		}
	}
	if len(problems) > 0 {
		return nil, &LayoutError{PinDir: pinDir, Problems: problems, Uninstall: "shunt uninstall"}
	}
	if len(fromBTF) > 0 {
		c.notes = append(c.notes, fmt.Sprintf("no recorded layout for %d pinned maps (pins of an older shunt build): checked against the BTF the kernel keeps for each: %s",
			len(fromBTF), strings.Join(fromBTF, ", ")))
	}
	if len(unchecked) > 0 {
		c.warnings = append(c.warnings, fmt.Sprintf("%d pinned maps have neither a recorded layout nor BTF in the kernel: adopted without a layout check: %s",
			len(unchecked), strings.Join(unchecked, ", ")))
	}
	return c, nil
}

// LayoutError refuses pinned maps this build would read wrongly.
type LayoutError struct {
	PinDir   string
	Problems []string // one per field (or map) that differs, naming both places
	// Uninstall is the command that removes the instance's datapath, for
	// the advice (the caller knows the instance's name).
	Uninstall string
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("the maps pinned under %s were made by a shunt build of another layout, which this build would read wrongly:\n  %s\n"+
		"Nothing was changed. To keep the node's connections, run the previous shunt build; to move to this one, "+
		"run `%s` (it removes the datapath and drops the node's connections) and start again",
		e.PinDir, strings.Join(e.Problems, "\n  "), e.Uninstall)
}

// How a pinned map's layout is known.
type pinSource int

const (
	pinNone         pinSource = iota // nothing to compare: a new map, or one of sizes only
	pinRecorded                      // the layout file
	pinFromBTF                       // the pinned map's own BTF
	pinUnchecked                     // neither: unknown
	pinIncompatible                  // type, sizes or flags differ: no need to look further
)

type pinnedMap struct {
	layout   mapLayout
	mismatch error
}

// pinnedLayout finds the layout of the map pinned at pin, if any.
func pinnedLayout(pin string, ms *ebpf.MapSpec, recorded mapLayouts) (pinnedMap, pinSource, error) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return pinnedMap{}, pinNone, nil
	}
	if err != nil {
		return pinnedMap{}, 0, fmt.Errorf("opening pinned map %s: %w", pin, err)
	}
	defer m.Close()
	if isConnTable(ms.Name) && m.MaxEntries() != ms.MaxEntries {
		// Of another size: resized at Open (tablesize.go), entries kept.
		ms = ms.Copy()
		ms.MaxEntries = m.MaxEntries()
	}
	if err := ms.Compatible(m); err != nil {
		return pinnedMap{mismatch: err}, pinIncompatible, nil
	}
	if l, ok := recorded.Maps[ms.Name]; ok {
		return pinnedMap{layout: l}, pinRecorded, nil
	}
	if (ms.Key == nil && ms.Value == nil) || ms.Type == ebpf.HashOfMaps || ms.Type == ebpf.ArrayOfMaps {
		// Declared by sizes only (a sockhash), or a map of maps (a number
		// to a map, which the kernel keeps no value type for): there are
		// no fields, and the sizes were just checked.
		return pinnedMap{}, pinNone, nil
	}
	l, ok, err := layoutFromKernelBTF(m)
	if err != nil {
		return pinnedMap{}, 0, fmt.Errorf("reading the BTF of pinned map %s: %w", pin, err)
	}
	if !ok {
		return pinnedMap{}, pinUnchecked, nil
	}
	return pinnedMap{layout: l}, pinFromBTF, nil
}

// layoutFromKernelBTF reads a map's layout from the BTF it was created with
// (false: it was created without).
func layoutFromKernelBTF(m *ebpf.Map) (mapLayout, bool, error) {
	info, err := objInfo(m)
	if err != nil {
		return mapLayout{}, false, err
	}
	if info.BTFID == 0 || (info.BTFKeyTypeID == 0 && info.BTFValueTypeID == 0) {
		return mapLayout{}, false, nil
	}
	h, err := btf.NewHandleFromID(btf.ID(info.BTFID))
	if err != nil {
		return mapLayout{}, false, err
	}
	defer h.Close()
	spec, err := h.Spec(nil)
	if err != nil {
		return mapLayout{}, false, err
	}
	typeOf := func(id uint32) (btf.Type, error) {
		if id == 0 {
			return nil, nil // declared by size only
		}
		return spec.TypeByID(btf.TypeID(id))
	}
	ms := &ebpf.MapSpec{Name: unix.ByteSliceToString(info.Name[:]), Type: m.Type(), KeySize: m.KeySize(), ValueSize: m.ValueSize()}
	if ms.Key, err = typeOf(info.BTFKeyTypeID); err != nil {
		return mapLayout{}, false, err
	}
	if ms.Value, err = typeOf(info.BTFValueTypeID); err != nil {
		return mapLayout{}, false, err
	}
	l, err := layoutOfSpec(ms)
	return l, err == nil, err
}

// bpfMapInfo is the kernel's struct bpf_map_info (uapi/linux/bpf.h) up to
// map_extra: cilium/ebpf's MapInfo leaves out the key and value type IDs.
type bpfMapInfo struct {
	Type, ID, KeySize, ValueSize, MaxEntries, MapFlags uint32
	Name                                               [16]byte
	Ifindex, BTFVmlinuxValueTypeID                     uint32
	NetnsDev, NetnsIno                                 uint64
	BTFID, BTFKeyTypeID, BTFValueTypeID, BTFVmlinuxID  uint32
	MapExtra                                           uint64
}

func objInfo(m *ebpf.Map) (bpfMapInfo, error) {
	var info bpfMapInfo
	attr := struct {
		fd, infoLen uint32
		info        uint64
	}{fd: uint32(m.FD()), infoLen: uint32(unsafe.Sizeof(info)), info: uint64(uintptr(unsafe.Pointer(&info)))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return info, fmt.Errorf("BPF_OBJ_GET_INFO_BY_FD: %w", errno)
	}
	return info, nil
}

// recordLayouts writes the layout file unless it holds these layouts
// already.
func (c *layoutCheck) recordLayouts(layoutFile string) error {
	if layoutFile == "" {
		return nil
	}
	data, err := json.MarshalIndent(c.record, "", " ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if string(data) == string(c.read) {
		return nil
	}
	if err := atomicfile.Write(layoutFile, data); err != nil {
		return fmt.Errorf("recording the pinned maps' layouts: %w", err)
	}
	return nil
}

// CheckPinnedLayouts refuses, as Open does, maps pinned under pinDir whose
// layouts this build would read wrongly; it changes nothing, so an agent
// can call it before it sets anything else up.
func CheckPinnedLayouts(pinDir, layoutFile string) error {
	specs, err := loadSpecs()
	if err != nil {
		return err
	}
	_, err = checkLayouts(pinDir, layoutFile, specs.list(true)...)
	return err
}
