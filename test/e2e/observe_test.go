package e2e

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// observe runs `shunt observe ... -o json` and decodes the flows.
func (l *lab) observe(args ...string) []flows.Flow {
	l.t.Helper()
	out := l.mustShunt(append([]string{"observe", "-o", "json"}, args...)...)
	var fs []flows.Flow
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var f flows.Flow
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			l.t.Fatalf("observe printed a line that is not a flow: %q: %v", sc.Text(), err)
		}
		fs = append(fs, f)
	}
	return fs
}

// metric reads one sample of `shunt metrics` (sum over label sets matching
// every given label).
func (l *lab) metric(name string, labels ...string) float64 {
	l.t.Helper()
	var sum float64
	for _, line := range strings.Split(l.mustShunt("metrics"), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, lb := range labels {
			ok = ok && strings.Contains(line, lb)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

func TestObserveFlowsAndMetrics(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab(twoPods)
		server, client := l.podIP("server"), l.podIP("client")
		l.probe("client", "connected", "--tcp", server+":7000", "--udp", server+":7000")
		forwarded := l.metric("shunt_datapath_packets_total", `reason="forwarded"`)

		// A datagram to a port nothing listens on: the server's kernel
		// answers port unreachable, a flow of its own naming the error.
		l.probe("client", "refused", "--udp-connected", "--udp", server+":7009")
		var icmpErr *flows.Flow
		for deadline := time.Now().Add(2 * time.Second); icmpErr == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			for _, f := range l.observe("--protocol", "ICMP", "--from-pod", "server") {
				if f.Event == "icmp-error" {
					icmpErr = &f
				}
			}
		}
		if icmpErr == nil || icmpErr.ICMPError != "port-unreachable" || icmpErr.Destination.Pod != "default/client" || icmpErr.Verdict != "FORWARDED" {
			t.Errorf("the server's port unreachable: flow %+v; want event icmp-error, port-unreachable, to the client, forwarded", icmpErr)
		}

		// A drop shows up within a second, with its reason and the pods: a
		// follower started before the traffic sees it arrive.
		l.apply("testdata/policy-server-http-only.yaml")
		follow := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "observe", "-f", "--verdict", "DROPPED", "-o", "json")
		stdout, _ := follow.StdoutPipe()
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { follow.Process.Kill(); follow.Wait() }()
		arrived := make(chan flows.Flow, 16)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var f flows.Flow
				if json.Unmarshal(sc.Bytes(), &f) == nil {
					arrived <- f
				}
			}
		}()
		time.Sleep(200 * time.Millisecond) // the follower is connected
		go l.shunt("lab", "exec", "client", "--", "shunt", "lab", "probe", "--tcp", server+":7000", "--timeout", "500ms", "--expect", "timeout")
		var drop flows.Flow
		select {
		case drop = <-arrived:
			if lag := time.Since(drop.Time); lag > time.Second {
				t.Errorf("the drop reached observe -f %s after it happened", lag)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the dropped connection never reached observe -f --verdict DROPPED")
		}
		if drop.DropReason != "policy-not-allowed" || drop.Source.Pod != "default/client" || drop.Destination.Pod != "default/server" ||
			drop.Protocol != "TCP" || drop.Source.IP != client || drop.TCPFlags != "SYN" || drop.Destination.Port != 7000 {
			t.Errorf("drop flow: %+v", drop)
		}

		// Forwarded flows carry pod names, identities and the allowing rule
		// (events other than drops are collected every 100ms).
		l.probe("client", "connected", "--http", "http://"+server+":8080/")
		var allowed bool
		for deadline := time.Now().Add(2 * time.Second); !allowed && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			for _, f := range l.observe("--to-pod", "server", "--verdict", "FORWARDED", "--port", "8080") {
				if f.Event == "new" && f.Source.Pod == "default/client" && strings.Contains(f.Policy, "NetworkPolicy default/server-http-only") &&
					len(f.Destination.Labels) > 0 {
					allowed = true
				}
				if f.Destination.Pod != "default/server" {
					t.Errorf("--to-pod server returned %+v", f)
				}
			}
		}
		if !allowed {
			t.Errorf("no new-connection flow client -> server:8080 naming the allowing policy")
		}
		time.Sleep(300 * time.Millisecond) // the connection's end events too

		// Filters select exactly what they name.
		all := l.observe("--last", "1000")
		for _, c := range []struct {
			args  []string
			match func(flows.Flow) bool
		}{
			{[]string{"--from-pod", "client"}, func(f flows.Flow) bool { return f.Source.Pod == "default/client" }},
			{[]string{"--pod", "default/server"}, func(f flows.Flow) bool {
				return f.Source.Pod == "default/server" || f.Destination.Pod == "default/server"
			}},
			{[]string{"--protocol", "UDP"}, func(f flows.Flow) bool { return f.Protocol == "UDP" }},
			{[]string{"--verdict", "DROPPED"}, func(f flows.Flow) bool { return f.Verdict == "DROPPED" }},
			{[]string{"--port", "8080"}, func(f flows.Flow) bool { return f.Source.Port == 8080 || f.Destination.Port == 8080 }},
		} {
			want := 0
			for _, f := range all {
				if c.match(f) {
					want++
				}
			}
			got := l.observe(append(c.args, "--last", "1000")...)
			for _, f := range got {
				if !c.match(f) {
					t.Errorf("observe %v returned a flow it does not name: %+v", c.args, f)
				}
			}
			if len(got) != want || want == 0 {
				t.Errorf("observe %v: %d flows, want %d (of %d)", c.args, len(got), want, len(all))
			}
		}
		if out, code := l.shunt("observe", "--verdict", "MAYBE"); code != 2 || !strings.Contains(out, "unknown verdict") {
			t.Errorf("bad filter: exit %d: %s", code, out)
		}

		// Metrics moved with the traffic, and count the drop.
		if got := l.metric("shunt_datapath_packets_total", `reason="forwarded"`); got <= forwarded {
			t.Errorf("forwarded packets %v, were %v before more traffic", got, forwarded)
		}
		if l.metric("shunt_datapath_packets_total", `reason="policy-not-allowed"`) == 0 {
			t.Error("no policy-not-allowed packets in the metrics")
		}
		if l.metric("shunt_map_entries", `map="shunt_endpoints"`) != 2 || l.metric("shunt_map_capacity", `map="shunt_policy"`) == 0 {
			t.Error("map fill metrics missing")
		}
		if l.metric("shunt_datapath_sync_duration_seconds_count", `step="policy"`) == 0 {
			t.Error("sync duration histogram missing")
		}
		if out := l.mustShunt("map", "dump", "shunt_ct"); !strings.Contains(out, "default/client") {
			t.Errorf("decoded conntrack dump lacks pod names:\n%s", out)
		}
	})
}

// TestFlowOverflowIsCountedAndForwardingGoesOn: with a ring buffer of one
// page and every packet traced, a flood of small UDP datagrams (hundreds of
// thousands of events a second, more than the agent drains between two
// wakeups) overflows it; the losses are counted and the datagrams still
// arrive.
func TestFlowOverflowIsCountedAndForwardingGoesOn(t *testing.T) {
	l := newLabWith(t, []string{"--flow-sampling", "all", "--flow-buffer-bytes", "4096"}, twoPods, "testdata/iperf-pods.yaml")
	server := l.podIP("iperf-server")
	var res struct {
		End struct {
			Sum struct {
				Packets int `json:"packets"`
			} `json:"sum"`
		} `json:"end"`
		Error string `json:"error"`
	}
	var out string
	for i := 0; i < 20; i++ { // iperf3 needs a moment to listen
		out, _ = l.shunt("lab", "exec", "client", "--", "iperf3", "-c", server, "-u", "-b", "0", "-l", "64", "-t", "2", "--json")
		res.End.Sum.Packets, res.Error = 0, ""
		if json.Unmarshal([]byte(out), &res) == nil && res.End.Sum.Packets > 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if res.End.Sum.Packets < 10000 {
		t.Fatalf("iperf3 UDP flood through the datapath with an overflowing flow buffer sent %d datagrams (%s):\n%.2000s",
			res.End.Sum.Packets, res.Error, out)
	}
	var st struct {
		Flows struct{ Emitted, Lost uint64 }
	}
	if err := json.Unmarshal([]byte(l.mustShunt("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Flows.Lost == 0 || st.Flows.Emitted == 0 {
		t.Errorf("flow stats %+v: want events both emitted and lost", st.Flows)
	}
	if l.metric("shunt_flows_lost_total") == 0 {
		t.Error("shunt_flows_lost_total did not count the losses")
	}
	if !strings.Contains(l.mustShunt("status"), "flow events lost") {
		t.Error("status health does not mention the lost flow events")
	}
	l.probe("client", "connected", "--tcp", l.podIP("server")+":7000")
}

// TestProgramRunTime: with --bpf-stats the agent has the kernel count its
// programs' runs and time: after connections between two pods, `shunt
// status` shows the runs and time per run of the pod program and the
// connect hook, and the metrics count them per hook.
func TestProgramRunTime(t *testing.T) {
	l := newLabWith(t, []string{"--bpf-stats"}, twoPods)
	server := l.podIP("server")
	l.probe("client", "connected", "--count", "3", "--tcp", server+":7000")
	status := l.mustShunt("status")
	line := ""
	for _, s := range strings.Split(status, "\n") {
		if strings.HasPrefix(s, "run time:") {
			line = s
		}
	}
	// to-pod runs for no packet here: bpf_redirect_peer hands them to
	// the pod past the host side's egress.
	for _, want := range []string{"from-pod ", "sock-connect4 ", "ns/run"} {
		if !strings.Contains(line, want) {
			t.Errorf("shunt status's run time line lacks %q:\n%s", want, status)
		}
	}
	for _, hook := range []string{"from-pod", "sock-connect4"} {
		if runs := l.metric("shunt_bpf_program_runs_total", `hook="`+hook+`"`); runs == 0 {
			t.Errorf("shunt_bpf_program_runs_total{hook=%q} is 0 after traffic", hook)
		}
		if secs := l.metric("shunt_bpf_program_run_seconds_total", `hook="`+hook+`"`); secs <= 0 {
			t.Errorf("shunt_bpf_program_run_seconds_total{hook=%q} is %v after traffic", hook, secs)
		}
	}
}
