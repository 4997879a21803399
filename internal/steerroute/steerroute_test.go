package steerroute

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
)

var testRouting = Routing{Mark: 0x5f000000, Table: 0x5f, Priority: 95}

// TestLastReleaseRemoves: instances claiming the routing in one namespace
// share one rule and one route, which stay while any of them claims it
// and go with the last; a claim made in another namespace neither keeps
// them nor is removed from the wrong one; a rule an older agent made
// without shunt's protocol goes too; releasing twice, or without a
// claim, is a no-op.
func TestLastReleaseRemoves(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and routing rules")
	}
	tag := fmt.Sprintf("%06d", rand.IntN(1000000))
	ns, other := newNetns(t, "srA"+tag), newNetns(t, "srB"+tag)
	var insts []instance.Instance
	for _, n := range []string{"a", "b", "c", "d"} {
		inst, err := instance.New("sr" + n + tag)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(inst.RunDir()) })
		insts = append(insts, inst)
	}
	a, b, c, d := insts[0], insts[1], insts[2], insts[3]
	in := func(path string, fn func() error) {
		t.Helper()
		if err := netnsrun.Do(path, fn); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(path string, inst instance.Instance) {
		t.Helper()
		in(path, func() error { return Claim(inst, testRouting) })
	}
	release := func(path string, inst instance.Instance) {
		t.Helper()
		in(path, func() error { return Release(inst) })
	}

	claim(ns, a)
	claim(ns, b)
	claim(other, c)
	wantRouting(t, ns, 1)
	wantRouting(t, other, 1)
	if rules := ipOut(t, ns, "rule", "show"); !strings.Contains(rules, "fwmark 0x5f000000 lookup 95 proto 83") {
		t.Errorf("rules:\n%s\nwant fwmark 0x5f000000 lookup 95 proto 83 (claimed twice, installed once)", rules)
	}

	release(ns, a)
	wantRouting(t, ns, 1) // b still claims it
	release(ns, b)
	wantRouting(t, ns, 0) // c's claim is another namespace's
	wantRouting(t, other, 1)
	release(ns, b)
	release(ns, d)
	// c's claim released from the wrong namespace: dropped, nothing
	// removed there (its namespace goes with its lab).
	claim(ns, a)
	release(ns, c)
	wantRouting(t, ns, 1)
	wantRouting(t, other, 1)
	if _, err := os.Stat(claimPath(c)); !os.IsNotExist(err) {
		t.Errorf("c's claim outlived its release: %v", err)
	}
	release(ns, a)
	wantRouting(t, ns, 0)

	// An older agent's rule, made without a protocol.
	ip(t, ns, "rule", "add", "fwmark", "0x5f000000", "lookup", "95", "pref", "95")
	claim(ns, d)
	wantRouting(t, ns, 1)
	release(ns, d)
	wantRouting(t, ns, 0)
}

// TestCheckRepairs: the rule or the route removed behind the agent's back
// is named by Check, put back with repair, and left missing without.
func TestCheckRepairs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and routing rules")
	}
	tag := fmt.Sprintf("%06d", rand.IntN(1000000))
	ns := newNetns(t, "srC"+tag)
	inst, err := instance.New("src" + tag)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(inst.RunDir()) })
	check := func(repair bool, want ...string) {
		t.Helper()
		var missing []string
		if err := netnsrun.Do(ns, func() (err error) {
			missing, err = Check(inst, testRouting, repair)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if strings.Join(missing, "; ") != strings.Join(want, "; ") {
			t.Errorf("Check(repair %v) = %q, want %q", repair, missing, want)
		}
	}
	if err := netnsrun.Do(ns, func() error { return Claim(inst, testRouting) }); err != nil {
		t.Fatal(err)
	}
	check(true)
	rule, route := "rule fwmark 0x5f000000 lookup 95 pref 95", "route local 0.0.0.0/0 dev lo table 95"
	ip(t, ns, "rule", "del", "pref", "95")
	check(false, rule)
	check(false, rule) // a dry run leaves it missing
	ip(t, ns, "route", "del", "local", "default", "dev", "lo", "table", "95")
	check(true, rule, route)
	check(false)
	wantRouting(t, ns, 1)
}

// wantRouting checks the namespace holds n (0 or 1) copies of the rule
// and of the local route.
func wantRouting(t *testing.T, ns string, n int) {
	t.Helper()
	rules := strings.Count(ipOut(t, ns, "rule", "show"), "fwmark 0x5f000000 lookup 95")
	routes := strings.Count(ipOut(t, ns, "route", "show", "table", "95"), "local default dev lo")
	if rules != n || routes != n {
		t.Errorf("namespace %s: %d rules and %d local routes for the steering, want %d of each", ns, rules, routes, n)
	}
}

func newNetns(t *testing.T, name string) string {
	t.Helper()
	if err := podnet.CreateNetns(name, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podnet.DeleteNetns(name) })
	return podnet.NetnsPath(name)
}

func ip(t *testing.T, ns string, args ...string) {
	t.Helper()
	ipOut(t, ns, args...)
}

func ipOut(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + ns, "ip"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s in %s: %v: %s", strings.Join(args, " "), ns, err, out)
	}
	return string(out)
}
