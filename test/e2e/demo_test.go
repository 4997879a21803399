package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDemo runs scripts/demo.sh, what the README's first command (make
// demo) runs after building, under instance names and a pod CIDR of its
// own, so it runs beside the other tests' labs and a user's demo: every
// step must pass (the script stops at the first command that fails), and
// both labs must go without a trace. It broke once unnoticed (a SIGPIPE
// under pipefail, 1 run in 3) because only a person ran it.
func TestDemo(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"jq", "ss", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the demo needs %s: run scripts/setup.sh", tool)
		}
	}
	one := &lab{t: t, instance: fmt.Sprintf("e2d%05d", rand.IntN(100000)),
		cidr:        fmt.Sprintf("10.%d.%d.0/24", labOctet(), rand.IntN(250)),
		serviceCIDR: fmt.Sprintf("10.%d.%d.0/24", 100+rand.IntN(50), rand.IntN(250))}
	// The two-node lab's name has 8 characters (its nodes are NAMEn2 …);
	// its pod routes live in its nodes' namespaces.
	nodes := &lab{t: t, instance: fmt.Sprintf("e2n%05d", rand.IntN(100000))}
	t.Cleanup(func() {
		for _, l := range []*lab{one, nodes} {
			if out, code := l.shunt("lab", "down"); code != 0 {
				t.Errorf("%s: lab down: exit %d: %s", l.instance, code, out)
			}
		}
		one.assertGone()
		for k := 1; k <= 2; k++ {
			nodes.node(k).assertGone()
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../../scripts/demo.sh")
	cmd.Env = append(os.Environ(), "DEMO_BIN="+binDir, "DEMO_INSTANCE="+one.instance, "DEMO_NODES_INSTANCE="+nodes.instance,
		"DEMO_LAB_FLAGS=--pod-cidr "+one.cidr+" --service-cidr "+one.serviceCIDR)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("scripts/demo.sh: %v in %s", err, time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("scripts/demo.sh failed: %v\n%s", err, out.String())
	}
	// What the demo shows, beyond its commands' exit codes: the canary
	// header's route, the HTTP rule's 403 as a flow, the policy's drop
	// on the other node, and its closing words.
	for _, want := range []string{`{"byPod":{"reviews-v2`, "403", "DROPPED", "The lab stays up."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out.String())
		}
	}
}
