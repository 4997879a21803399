package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDriftRepair: entries of the service, backend, policy, ipcache and
// endpoint maps deleted or altered by hand with bpftool, behind the
// agent's back, break a service; `shunt sync --verify` names each of them
// (map, key, expected, found), repairs them and exits 1, a second call
// exits 0, and the service works again. Then, with --drift-check-period
// 1s, the same damage is repaired by the agent on its own within a
// period, counted in shunt_drift_repaired_total and `shunt status`.
func TestDriftRepair(t *testing.T) {
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--drift-check-period", "0"},
		servicesManifest, "testdata/other-pod.yaml", "testdata/reliability-policy.yaml")
	l.waitWebServes()
	web := l.clusterIP("web")
	l.probe("client", "connected", "--count", "6", "--tcp", web+":80")
	l.probe("other", "timeout", "--tcp", web+":80")
	if out, code := l.shunt("sync", "--verify"); code != 0 || !strings.Contains(out, "no differences") {
		t.Fatalf("sync --verify on an untouched node: exit %d:\n%s", code, out)
	}

	damage := l.damageMaps(web)
	if out, code := l.shunt("lab", "exec", "client", "--", binDir+"/shunt", "lab", "probe", "--timeout", "1s", "--expect", "connected",
		"--tcp", web+":80"); code == 0 {
		t.Errorf("the service still works with its maps damaged:\n%s", out)
	}

	// A dry run reports and leaves the damage.
	out, code := l.shunt("sync", "--verify", "--dry-run")
	if code != 1 || !strings.Contains(out, "dry run") {
		t.Errorf("sync --verify --dry-run: exit %d (want 1):\n%s", code, out)
	}
	out, code = l.shunt("sync", "--verify")
	if code != 1 {
		t.Errorf("sync --verify after the damage: exit %d (want 1):\n%s", code, out)
	}
	t.Logf("sync --verify after the damage:\n%s", out)
	for _, want := range damage {
		if !want.MatchString(out) {
			t.Errorf("sync --verify does not report %s:\n%s", want, out)
		}
	}
	if out, code := l.shunt("sync", "--verify"); code != 0 || !strings.Contains(out, "no differences") {
		t.Errorf("second sync --verify: exit %d (want 0):\n%s", code, out)
	}
	l.probe("client", "connected", "--count", "6", "--tcp", web+":80")
	l.probe("other", "timeout", "--tcp", web+":80") // the policy is whole again

	// Periodic: the agent restarted with a period of 1 s repairs on its own.
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	l.mustShunt("lab", "up", "--drift-check-period", "1s")
	l.probe("client", "connected", "--tcp", web+":80")
	l.damageMaps(web)
	damaged := time.Now()
	for {
		out, code := l.shunt("sync", "--verify", "--dry-run")
		if code == 0 {
			break
		}
		if time.Since(damaged) > 5*time.Second {
			t.Fatalf("not repaired %s after the damage with a period of 1 s:\n%s", time.Since(damaged), out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(damaged)
	t.Logf("repaired by the periodic check %s after the damage", took)
	if took > 2500*time.Millisecond { // one period, and the time to check and to ask
		t.Errorf("repaired only after %s with a period of 1 s", took)
	}
	l.probe("client", "connected", "--count", "6", "--tcp", web+":80")
	l.probe("other", "timeout", "--tcp", web+":80")

	var st struct {
		Drift struct {
			PeriodSeconds float64        `json:"periodSeconds"`
			Checks        int            `json:"checks"`
			Repaired      map[string]int `json:"repaired"`
		} `json:"drift"`
	}
	if err := json.Unmarshal([]byte(l.mustShunt("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	metrics := l.mustShunt("metrics")
	status := l.mustShunt("status")
	for _, m := range []string{"shunt_services", "shunt_backends", "shunt_policy", "shunt_ipcache", "shunt_endpoints"} {
		if st.Drift.Repaired[m] == 0 {
			t.Errorf("status: nothing repaired in %s: %+v", m, st.Drift)
		}
		re := regexp.MustCompile(`(?m)^shunt_drift_repaired_total\{map="` + m + `"\} (\d+)$`)
		if mm := re.FindStringSubmatch(metrics); mm == nil || mm[1] == "0" {
			t.Errorf("metrics: shunt_drift_repaired_total for %s is %v", m, mm)
		} else if n, _ := strconv.Atoi(mm[1]); n != st.Drift.Repaired[m] {
			t.Errorf("%s: metrics count %d, status %d", m, n, st.Drift.Repaired[m])
		}
		if !strings.Contains(status, m+" "+strconv.Itoa(st.Drift.Repaired[m])) {
			t.Errorf("shunt status does not show the repairs of %s:\n%s", m, status)
		}
	}
	if st.Drift.PeriodSeconds != 1 || st.Drift.Checks == 0 || !strings.Contains(status, "drift:     every 1s") {
		t.Errorf("status: %+v\n%s", st.Drift, status)
	}
}

// damageMaps breaks the web service of servicesManifest with bpftool, in
// one entry or more of each map: the frontend web:80 deleted (slot 0 and
// its backend slots), web-1's backend pointed at another port, web-1's
// ingress policy entries deleted, the client's ipcache identity changed,
// web-2's endpoint deleted. It returns what sync --verify must report.
func (l *lab) damageMaps(vip string) []*regexp.Regexp {
	l.t.Helper()
	web1, web2, client := netip.MustParseAddr(l.podIP("web-1")), netip.MustParseAddr(l.podIP("web-2")), netip.MustParseAddr(l.podIP("client"))
	v := netip.MustParseAddr(vip).As4()
	w1, w2, c := web1.As4(), web2.As4(), client.As4()
	port80 := []byte{0, 80}
	n := map[string]int{}
	for _, e := range l.rawMap("shunt_services") {
		if bytes.Equal(e.key[:4], v[:]) && bytes.Equal(e.key[4:6], port80) && e.key[6] == 6 {
			l.bpftool("map", "delete", "pinned", l.pin("shunt_services"), "key", "hex", hexArgs(e.key))
			n["shunt_services"]++
		}
	}
	for _, e := range l.rawMap("shunt_backends") {
		if bytes.Equal(e.value[:4], w1[:]) && binary.BigEndian.Uint16(e.value[4:6]) == 8080 {
			val := bytes.Clone(e.value)
			binary.BigEndian.PutUint16(val[4:6], 9999)
			l.bpftool("map", "update", "pinned", l.pin("shunt_backends"), "key", "hex", hexArgs(e.key), "value", "hex", hexArgs(val))
			n["shunt_backends"]++
		}
	}
	for _, e := range l.rawMap("shunt_policy") { // {prefixlen, endpoint, identity, egress, proto, dport}
		if bytes.Equal(e.key[4:8], w1[:]) && e.key[12] == 0 {
			l.bpftool("map", "delete", "pinned", l.pin("shunt_policy"), "key", "hex", hexArgs(e.key))
			n["shunt_policy"]++
		}
	}
	for _, e := range l.rawMap("shunt_ipcache") { // {prefixlen, ip} -> {identity, tunnel}
		if binary.NativeEndian.Uint32(e.key[:4]) == 32 && bytes.Equal(e.key[4:8], c[:]) {
			val := bytes.Clone(e.value)
			binary.NativeEndian.PutUint32(val[:4], 999)
			l.bpftool("map", "update", "pinned", l.pin("shunt_ipcache"), "key", "hex", hexArgs(e.key), "value", "hex", hexArgs(val))
			n["shunt_ipcache"]++
		}
	}
	for _, e := range l.rawMap("shunt_endpoints") {
		if bytes.Equal(e.key[:4], w2[:]) {
			l.bpftool("map", "delete", "pinned", l.pin("shunt_endpoints"), "key", "hex", hexArgs(e.key))
			n["shunt_endpoints"]++
		}
	}
	for _, m := range []string{"shunt_services", "shunt_backends", "shunt_policy", "shunt_ipcache", "shunt_endpoints"} {
		if n[m] == 0 {
			l.t.Fatalf("damageMaps: no entry of %s to damage", m)
		}
	}
	if n["shunt_services"] != 3 { // slot 0 and the two backends
		l.t.Fatalf("damageMaps: %d entries of %s:80 in shunt_services, want 3", n["shunt_services"], vip)
	}
	return []*regexp.Regexp{
		regexp.MustCompile(`shunt_services +` + regexp.QuoteMeta(vip) + `:80/TCP slot 0 +service \d+, 2 backends +\(absent\)`),
		regexp.MustCompile(`shunt_services +` + regexp.QuoteMeta(vip) + `:80/TCP slot 2 +backend \d+ +\(absent\)`),
		regexp.MustCompile(`shunt_backends +backend \d+ +` + regexp.QuoteMeta(web1.String()) + `:8080/TCP +` + regexp.QuoteMeta(web1.String()) + `:9999/TCP`),
		regexp.MustCompile(`shunt_policy +` + regexp.QuoteMeta(web1.String()) + ` ingress from identity \d+ 8080/TCP +allow \(rule \d+\) +\(absent\)`),
		regexp.MustCompile(`shunt_ipcache +` + regexp.QuoteMeta(client.String()) + `/32 +identity \d+ +identity 999`),
		regexp.MustCompile(`shunt_endpoints +` + regexp.QuoteMeta(web2.String()) + ` +ifindex \d+, identity \d+, .* +\(absent\)`),
		regexp.MustCompile(`entries repaired \(\d+ expected in \d+ maps\): shunt_backends 1, shunt_endpoints 1, shunt_ipcache 1, shunt_policy \d+, shunt_services 3`),
	}
}

type rawEntry struct{ key, value []byte }

// rawMap reads a map's entries as the kernel holds them (`map dump --raw`).
func (l *lab) rawMap(name string) []rawEntry {
	l.t.Helper()
	var rows []struct{ Key, Value string }
	if err := json.Unmarshal([]byte(l.mustShunt("map", "dump", name, "--raw", "-o", "json")), &rows); err != nil {
		l.t.Fatal(err)
	}
	var out []rawEntry
	for _, r := range rows {
		k, err1 := hex.DecodeString(r.Key)
		v, err2 := hex.DecodeString(r.Value)
		if err1 != nil || err2 != nil {
			l.t.Fatalf("%s: raw entry %+v", name, r)
		}
		out = append(out, rawEntry{k, v})
	}
	return out
}

func (l *lab) pin(name string) string { return "/sys/fs/bpf/" + l.instance + "/" + name }

func (l *lab) bpftool(args ...string) {
	l.t.Helper()
	var flat []string
	for _, a := range args {
		flat = append(flat, strings.Fields(a)...)
	}
	if out, err := exec.Command("bpftool", flat...).CombinedOutput(); err != nil {
		l.t.Fatalf("bpftool %s: %v\n%s", strings.Join(flat, " "), err, out)
	}
}

// hexArgs is bpftool's "hex" form: bytes as two-digit hex words.
func hexArgs(b []byte) string {
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = fmt.Sprintf("%02x", x)
	}
	return strings.Join(parts, " ")
}
