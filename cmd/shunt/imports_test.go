package main

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// kernelPackages are what the commands below must not link: the BPF
// library and the kernel-facing datapath. What they need of the datapath's
// reports is in internal/dpinfo.
var kernelPackages = []string{"github.com/cilium/ebpf", "github.com/shuntnet/shunt/internal/datapath"}

// TestCommandsLinkNoKernelCode: shunt (the CLI), shunt-cni and shunt-proxy
// talk to the agent or set up interfaces; none loads or reads BPF objects,
// so none may depend, even through another package, on cilium/ebpf or
// internal/datapath. A failure names the chain of imports that pulls one in.
func TestCommandsLinkNoKernelCode(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list the imports with")
	}
	for _, cmd := range []string{"github.com/shuntnet/shunt/cmd/shunt", "github.com/shuntnet/shunt/cmd/shunt-cni",
		"github.com/shuntnet/shunt/cmd/shunt-proxy"} {
		imports := listImports(t, cmd)
		if len(imports) == 0 || imports[cmd] == nil {
			t.Fatalf("go list -deps %s listed no imports of %s", cmd, cmd)
		}
		for _, bad := range kernelPackages {
			if chain := importChain(imports, cmd, bad); chain != nil {
				t.Errorf("%s depends on %s: %s", cmd, bad, strings.Join(chain, " -> "))
			}
		}
	}
}

// listImports is every package pkg depends on, with its direct imports.
func listImports(t *testing.T, pkg string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr.String())
	}
	imports := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			imports[f[0]] = append([]string{}, f[1:]...)
		}
	}
	return imports
}

// importChain is the shortest chain of imports from `from` to a package
// that is bad or under it (bad/...), or nil when there is none.
func importChain(imports map[string][]string, from, bad string) []string {
	matches := func(p string) bool { return p == bad || strings.HasPrefix(p, bad+"/") }
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if matches(p) {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

func TestImportChain(t *testing.T) {
	imports := map[string][]string{"cmd": {"api", "fmt"}, "api": {"dp"}, "dp": {"ebpf/link"}, "fmt": nil}
	if got := strings.Join(importChain(imports, "cmd", "ebpf"), " -> "); got != "cmd -> api -> dp -> ebpf/link" {
		t.Errorf("chain %q", got)
	}
	if got := importChain(imports, "cmd", "ebp"); got != nil {
		t.Errorf("a prefix that is not a path element matched: %v", got)
	}
}
