package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/procstat"
)

// buildBaseline builds the shunt binaries of the commit in
// testdata/upgrade-from (git archive of that commit into a temporary
// directory, go build there) and returns their directory, removed when the
// test ends. It skips the test when the git history is not at hand (a
// source archive, a shallow clone).
func buildBaseline(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("testdata/upgrade-from")
	if err != nil {
		t.Fatal(err)
	}
	var commit string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			commit = line
		}
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: cannot build the baseline commit of testdata/upgrade-from")
	}
	if out, err := exec.Command("git", "-C", "../..", "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("baseline commit %s of testdata/upgrade-from is not in this checkout's git history (%v: %s): fetch it, or unshallow the clone",
			commit, err, strings.TrimSpace(string(out)))
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "src"), filepath.Join(dir, "bin")
	archive := filepath.Join(dir, "src.tar")
	// From the top of the tree: run in test/e2e, git archive would pack
	// only that folder.
	if out, err := exec.Command("git", "-C", "../..", "archive", "-o", archive, commit).CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xf", archive, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("unpacking the baseline: %v\n%s", err, out)
	}
	build := exec.Command("nice", "-n", "10", "go", "build", "-o", bin+"/", "./cmd/shunt", "./cmd/shuntd", "./cmd/shunt-proxy", "./cmd/shunt-cni")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building baseline %s: %v\n%s", commit, err, out)
	}
	t.Logf("baseline %s built in %s", commit, bin)
	return bin
}

// pinnedObjects are the BPF objects behind an instance's pins: each pinned
// map, each pinned link and the program it runs, by pin name. With the tc
// fallback a tc hook's pin is the program its cls_bpf filter runs (the
// filter's record): a program without a link.
type pinnedObjects struct {
	maps  map[string]ebpf.MapID
	links map[string]link.ID
	progs map[string]ebpf.ProgramID
}

func (l *lab) pinned() pinnedObjects {
	l.t.Helper()
	p := pinnedObjects{maps: map[string]ebpf.MapID{}, links: map[string]link.ID{}, progs: map[string]ebpf.ProgramID{}}
	dir := filepath.Join("/sys/fs/bpf", l.instance)
	entries, err := os.ReadDir(dir)
	if err != nil {
		l.t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			l.t.Fatalf("pinned map %s: %v", e.Name(), err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			l.t.Fatal(err)
		}
		p.maps[e.Name()], _ = info.ID()
	}
	links, _ := filepath.Glob(filepath.Join(dir, "links", "*"))
	for _, pin := range links {
		lk, err := link.LoadPinnedLink(pin, nil)
		if prog, perr := ebpf.LoadPinnedProgram(pin, nil); err != nil && perr == nil {
			info, err := prog.Info()
			prog.Close()
			if err != nil {
				l.t.Fatal(err)
			}
			p.progs[filepath.Base(pin)], _ = info.ID()
			continue
		}
		if err != nil {
			l.t.Fatalf("pinned link %s: %v", pin, err)
		}
		info, err := lk.Info()
		lk.Close()
		if err != nil {
			l.t.Fatal(err)
		}
		p.links[filepath.Base(pin)], p.progs[filepath.Base(pin)] = info.ID, info.Program
	}
	if len(p.maps) == 0 || len(p.links) == 0 {
		l.t.Fatalf("instance %s pinned %d maps and %d links: want both", l.instance, len(p.maps), len(p.links))
	}
	return p
}

// differences lists what changed from p to q, "" when nothing did.
func (p pinnedObjects) differences(q pinnedObjects) string {
	var d []string
	diff := func(kind string, a, b map[string]uint32) {
		for name, id := range a {
			if b[name] != id {
				d = append(d, fmt.Sprintf("%s %s: ID %d, then %d", kind, name, id, b[name]))
			}
		}
		for name, id := range b {
			if _, ok := a[name]; !ok {
				d = append(d, fmt.Sprintf("%s %s appeared (ID %d)", kind, name, id))
			}
		}
	}
	diff("map", ids(p.maps), ids(q.maps))
	diff("link", ids(p.links), ids(q.links))
	diff("program of link", ids(p.progs), ids(q.progs))
	return strings.Join(d, "\n")
}

func ids[ID ~uint32](m map[string]ID) map[string]uint32 {
	out := map[string]uint32{}
	for k, v := range m {
		out[k] = uint32(v)
	}
	return out
}

func (l *lab) layoutFile() string {
	return filepath.Join("/var/lib/shunt", l.instance, "map-layout.json")
}

// TestUpgradeKeepsConnections: a node set up by the previous build (the
// commit in testdata/upgrade-from: pods, a ClusterIP service, a
// NetworkPolicy) is taken over by this build's agent: the old agent stops
// (SIGTERM keeps the datapath), the new one adopts its pins and state.
// While it does, a client holds one TCP connection to the ClusterIP and
// opens new ones in a loop: not one may fail, the held one may not break,
// the pinned maps are adopted (same map IDs), not recreated, and the policy
// still keeps the intruder out. The baseline recorded no map layouts, so
// the new agent checks the pinned maps against their BTF, and records them.
//
// When a change makes the pinned layouts intentionally incompatible, this
// test fails (the new agent refuses the old pins, as it must): bump the
// commit in testdata/upgrade-from to the change's own, so the test keeps
// checking the upgrade users will make from then on.
func TestUpgradeKeepsConnections(t *testing.T) {
	requireRoot(t)
	baseline := buildBaseline(t)
	l := newLabOf(t, baseline, "", []string{"--mode", "redirect-peer"},
		servicesManifest, "testdata/other-pod.yaml", "testdata/reliability-policy.yaml")
	l.waitWebServes()
	web := l.clusterIP("web")
	l.probe("client", "connected", "--tcp", web+":80")
	l.probe("other", "timeout", "--tcp", web+":80")
	if _, err := os.Stat(l.layoutFile()); err == nil {
		t.Fatalf("the baseline agent wrote %s: it is not the previous build (check testdata/upgrade-from)", l.layoutFile())
	}
	before := l.pinned()

	fresh := l.startLoad("client", "--tcp", web+":80")
	long := l.startLoad("client", "--persistent", "--tcp", web+":80")
	time.Sleep(time.Second)
	old := l.status().PID
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, old)
	time.Sleep(300 * time.Millisecond) // the node runs without an agent for a moment
	l.bin = binDir
	l.mustShunt("lab", "up")
	l.probe("other", "timeout", "--tcp", web+":80")
	l.probe("client", "connected", "--tcp", web+":80")
	time.Sleep(time.Second)

	longRs := long.stop()
	conns, connsAll, failed := tally(fresh.stop(), "tcp")
	reqs, reqsAll, failedReqs := tally(longRs, "tcp")
	failed = append(failed, failedReqs...)
	t.Logf("upgrade from the baseline: %d/%d new TCP connections to the ClusterIP, %d/%d requests on one held connection",
		conns, connsAll, reqs, reqsAll)
	if len(failed) > 0 {
		t.Errorf("%d attempts failed across the upgrade:\n%s", len(failed), strings.Join(failed[:min(len(failed), 20)], "\n"))
	}
	if locals := distinctLocals(longRs); locals != 1 {
		t.Errorf("the held connection was dialled again (%d local addresses): it broke", locals)
	}
	if conns < 20 || reqs < 20 {
		t.Errorf("too little load to tell: %d connections, %d requests", conns, reqs)
	}
	after := l.pinned()
	for name, id := range before.maps {
		if after.maps[name] != id {
			t.Errorf("pinned map %s was not adopted: ID %d before the upgrade, %d after", name, id, after.maps[name])
		}
	}
	if _, err := os.Stat(l.layoutFile()); err != nil {
		t.Errorf("the new agent recorded no map layouts: %v", err)
	}
	log := readFile(filepath.Join("/var/lib/shunt", l.instance, "shuntd.log"))
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="pinned maps"`) {
			t.Log(line)
		}
	}
	if !strings.Contains(log, "checked against the BTF the kernel keeps") {
		t.Errorf("the new agent's log does not say how it checked the baseline's pins (no layout file):\n%s", log)
	}
	if strings.Contains(log, "adopted without a layout check") {
		t.Errorf("the new agent adopted some of the baseline's pinned maps unchecked (no BTF in the kernel for them?):\n%s", log)
	}
}

// TestUpgradeRefusesIncompatibleLayout: when the recorded layout of a
// pinned map differs from this build's in a way it would read wrongly (two
// fields of the conntrack value swapped, same sizes), the agent refuses to
// start with a message naming the map, the field, both places and what to
// do, and changes nothing: the same maps, links and programs stay pinned,
// the layout file is as it was, and the pods keep talking and the policy
// holds on the datapath left in place.
func TestUpgradeRefusesIncompatibleLayout(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest, "testdata/other-pod.yaml", "testdata/reliability-policy.yaml")
	l.waitWebServes()
	web := l.clusterIP("web")
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)

	// A build that had shunt_ct's rule_id where flags is, and flags after.
	var layouts struct {
		Maps map[string]map[string]any `json:"maps"`
	}
	data, err := os.ReadFile(l.layoutFile())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &layouts); err != nil {
		t.Fatal(err)
	}
	ct := layouts.Maps["shunt_ct"]
	if ct == nil {
		t.Fatalf("no layout for shunt_ct in %s:\n%s", l.layoutFile(), data)
	}
	ct["value"] = []map[string]any{{"name": "last_seen_ns", "offset": 0, "size": 8}, {"name": "created_ns", "offset": 8, "size": 8},
		{"name": "rule_id", "offset": 16, "size": 4}, {"name": "flags", "offset": 20, "size": 4}}
	if data, err = json.Marshal(layouts); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.layoutFile(), data, 0o600); err != nil {
		t.Fatal(err)
	}
	before := l.pinned()

	out, code := l.shunt("lab", "up")
	if code == 0 {
		t.Fatalf("the agent started on pins of an incompatible layout:\n%s", out)
	}
	t.Logf("refused:\n%s", out)
	for _, want := range []string{"shunt_ct value field flags: pinned at offset 20 size 4, this build has it at offset 16 size 4",
		"Nothing was changed", "run the previous shunt build", "`shunt --instance " + l.instance + " uninstall`"} {
		if !strings.Contains(out, want) {
			t.Errorf("refusal does not say %q:\n%s", want, out)
		}
	}
	if d := before.differences(l.pinned()); d != "" {
		t.Errorf("the refused start changed the pinned datapath:\n%s", d)
	}
	if now, _ := os.ReadFile(l.layoutFile()); string(now) != string(data) {
		t.Errorf("the refused start rewrote %s", l.layoutFile())
	}
	l.probeWithoutAgent("client", "connected", "--tcp", web+":80")
	l.probeWithoutAgent("other", "timeout", "--tcp", web+":80")
}

// TestUninstallAfterCrash: after the agent was SIGKILLed, `shunt
// uninstall` leaves nothing of the instance: the BPF programs, links and
// maps behind its pins are gone from the kernel (not only the pins), no
// process of its pods or proxy runs, and the network namespaces, veths,
// routes, cgroups, state and run directories are gone (assertGone). A
// second uninstall is a no-op.
func TestUninstallAfterCrash(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest, "testdata/other-pod.yaml", "testdata/reliability-policy.yaml")
	l.waitWebServes()
	objs := l.pinned()
	procs := l.processes()
	if len(procs) == 0 {
		t.Fatal("no process runs in the instance's cgroups: the pods' containers should")
	}
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)

	t.Log(l.mustShunt("uninstall"))
	l.assertGone()
	// The kernel frees programs and maps once their last reference goes,
	// after an RCU grace period: give it a moment.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		for name, id := range objs.links {
			if lk, err := link.NewFromID(id); err == nil {
				lk.Close()
				left = append(left, fmt.Sprintf("link %s (ID %d)", name, id))
			}
		}
		for name, id := range objs.progs {
			if p, err := ebpf.NewProgramFromID(id); err == nil {
				p.Close()
				left = append(left, fmt.Sprintf("program of link %s (ID %d)", name, id))
			}
		}
		for name, id := range objs.maps {
			if m, err := ebpf.NewMapFromID(id); err == nil {
				m.Close()
				left = append(left, fmt.Sprintf("map %s (ID %d)", name, id))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("BPF objects of the instance left in the kernel after uninstall:\n%s", strings.Join(left, "\n"))
	}
	for _, p := range procs {
		if procstat.Running(p) { // a zombie, dead and not yet reaped, does not run
			t.Errorf("process %d of the instance still runs after uninstall: %s", p, readFile(fmt.Sprintf("/proc/%d/cmdline", p)))
		}
	}
	if out, code := l.shunt("uninstall"); code != 0 {
		t.Errorf("a second uninstall: exit %d:\n%s", code, out)
	}
}

// processes lists the PIDs in the instance's cgroup subtree: its pods'
// containers and its node proxy.
func (l *lab) processes() []int {
	l.t.Helper()
	root, err := cgroup.Root()
	if err != nil {
		l.t.Fatal(err)
	}
	var pids []int
	filepath.WalkDir(filepath.Join(root, l.instance), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		for _, f := range strings.Fields(readFile(p)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}
