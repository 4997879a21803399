package datapath

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestLRUWritesMarkEntriesUsed: every write into an LRU hash of the
// objects goes through lib/lru.h's lru_insert (or lru_restore), which
// marks the entry used: a bare map_update leaves it to be the
// first evicted from a full table, before the flow's next packet comes
// (bench/run nodeport's local collapse, lib/lru.h). A bare write whose
// entry a lookup right after it marks anyway says so with a comment
// "Not lru_insert: ..." on the line before it.
func TestLRUWritesMarkEntriesUsed(t *testing.T) {
	specs, err := loadSpecs()
	if err != nil {
		t.Fatal(err)
	}
	lru := map[string]bool{}
	for _, ns := range specs.named() {
		for name, ms := range ns.spec.Maps {
			if ms.Type == ebpf.LRUHash || ms.Type == ebpf.LRUCPUHash {
				lru[name] = true
			}
		}
	}
	if !lru["shunt_nodeport_nat"] || !lru["shunt_ct"] {
		t.Fatalf("LRU maps of the objects: %v; want shunt_nodeport_nat and shunt_ct among them", lru)
	}
	write := regexp.MustCompile(`\bmap_update\(\s*&(\w+)`)
	checked := 0
	for f, lines := range bpfSources(t) {
		if f == "lru.h" {
			continue
		}
		for i, line := range lines {
			for _, m := range write.FindAllStringSubmatch(line, -1) {
				if !lru[m[1]] {
					continue
				}
				checked++
				if i > 0 && strings.Contains(lines[i-1], "Not lru_insert:") {
					continue
				}
				t.Errorf("%s:%d writes LRU map %s with map_update: use lru_insert (lib/lru.h), "+
					"or say why not in a comment \"Not lru_insert: ...\" on the line before", f, i+1, m[1])
			}
		}
	}
	if checked == 0 {
		t.Error("no bare write of an LRU map found, not even conntrack's promotion: is the pattern still right?")
	}
}

// TestMapWritesReadAsInt: the programs write and delete map entries
// through lib/common.h's map_update and map_delete, which read the result
// as an int. Before Linux 6.4 the kernel gave an error of these helpers to
// the program as a positive 64-bit number (common.h), so a bare
// bpf_map_update_elem(...) < 0 never saw a full table there.
func TestMapWritesReadAsInt(t *testing.T) {
	bare := regexp.MustCompile(`\bbpf_map_(update|delete)_elem\(`)
	for f, lines := range bpfSources(t) {
		if f == "common.h" {
			continue
		}
		for i, line := range lines {
			if bare.MatchString(line) {
				t.Errorf("%s:%d calls %s: use map_update or map_delete (lib/common.h), whose result is negative on an error on every kernel",
					f, i+1, bare.FindString(line))
			}
		}
	}
}

// bpfSources reads the programs' C sources and lib/ headers, by file name.
func bpfSources(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("../../bpf/*.c")
	if err != nil {
		t.Fatal(err)
	}
	headers, _ := filepath.Glob("../../bpf/lib/*.h")
	files = append(files, headers...)
	if len(files) < 10 {
		t.Fatalf("found only %v: run from internal/datapath", files)
	}
	sources := map[string][]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources[filepath.Base(f)] = strings.Split(string(data), "\n")
	}
	return sources
}
