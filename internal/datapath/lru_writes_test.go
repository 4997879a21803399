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
// marks the entry used: a bare bpf_map_update_elem leaves it to be the
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
	files, err := filepath.Glob("../../bpf/*.c")
	if err != nil {
		t.Fatal(err)
	}
	headers, _ := filepath.Glob("../../bpf/lib/*.h")
	files = append(files, headers...)
	if len(files) < 10 {
		t.Fatalf("found only %v: run from internal/datapath", files)
	}
	write := regexp.MustCompile(`bpf_map_update_elem\(\s*&(\w+)`)
	checked := 0
	for _, f := range files {
		if filepath.Base(f) == "lru.h" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i, line := range lines {
			for _, m := range write.FindAllStringSubmatch(line, -1) {
				if !lru[m[1]] {
					continue
				}
				checked++
				if i > 0 && strings.Contains(lines[i-1], "Not lru_insert:") {
					continue
				}
				t.Errorf("%s:%d writes LRU map %s with bpf_map_update_elem: use lru_insert (lib/lru.h), "+
					"or say why not in a comment \"Not lru_insert: ...\" on the line before", filepath.Base(f), i+1, m[1])
			}
		}
	}
	if checked == 0 {
		t.Error("no bare write of an LRU map found, not even conntrack's promotion: is the pattern still right?")
	}
}
