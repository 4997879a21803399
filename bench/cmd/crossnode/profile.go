package main

// -profile: a machine-wide CPU profile (perf record) of every measured
// new-connections run, and where its time went by kind of work: what
// tells the dataplanes apart (netfilter's hooks, conntrack and NAT in the
// nodes; shunt's BPF programs and the map and packet helpers they call;
// the kernel's VXLAN device) from what every case pays alike (the client,
// the servers, the TCP stack, the underlay bridge). A connection rate
// alone cannot say how much of a connection's cost a dataplane can still
// take away; this can (bench/RESULTS.md, issue 27).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// profileKinds sorts the kernel's and programs' symbols into kinds of
// work, the first match winning; "other" is the rest.
var profileKinds = []struct {
	name string
	re   *regexp.Regexp
}{
	// A bridge's netfilter hooks (br_netfilter): flannel's cni0 in the
	// kube-proxy cases' nodes. The underlay's bridge, the switch every
	// case crosses alike, runs none (switchWithoutNetfilter).
	{"bridge-netfilter", regexp.MustCompile(`^br_nf`)},
	{"netfilter", regexp.MustCompile(`^(__)?(nf_|nft_|ipt_|ip6t_|xt_|iptable_|hash_conntrack|init_conntrack|ipv4_conntrack|tcp_packet)`)},
	{"bpf", regexp.MustCompile(`^(__)?bpf_|^htab_|^__htab_|lookup_nulls_elem_raw|^trie_|^pcpu_freelist|^sk_psock|^sock_map|^sock_hash`)},
	{"vxlan", regexp.MustCompile(`vxlan|^udp_tunnel|^iptunnel|^gro_cell`)},
	{"idle", regexp.MustCompile(`^(pv_native_safe_halt|default_idle|cpu_idle|do_idle|intel_idle|acpi_idle|mwait_idle)`)},
}

// profileShares reads `perf report --stdio --no-children --sort sym`
// output (lines "  5.15%  [k] symbol") into each kind's share in percent
// of all samples.
func profileShares(report []byte) (map[string]float64, error) {
	shares := map[string]float64{}
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(report))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || strings.HasPrefix(f[0], "#") || !strings.HasSuffix(f[0], "%") || !strings.HasPrefix(f[1], "[") {
			continue
		}
		pct, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
		if err != nil {
			return nil, fmt.Errorf("perf report line %q: %w", sc.Text(), err)
		}
		kind := "other"
		for _, k := range profileKinds {
			if k.re.MatchString(f[2]) {
				kind = k.name
				break
			}
		}
		shares[kind] += pct
		total += pct
	}
	if total == 0 {
		return nil, fmt.Errorf("perf report has no samples:\n%s", report)
	}
	return shares, nil
}

// profile is a recording of the whole machine while a run of
// b.duration goes on, from 1 s into it to 1 s before its end (the steady
// part), into file (startProfile); wait waits for it to end and returns
// where the time went.
type profile struct {
	file string
	done chan error
}

func (b *bench) startProfile(name string) *profile {
	p := &profile{file: filepath.Join(b.out, "perf-"+name+".data"), done: make(chan error, 1)}
	length := b.duration - 2*time.Second
	if length < time.Second {
		length = time.Second
	}
	go func() {
		select {
		case <-time.After(time.Second):
		case <-b.ctx.Done():
			p.done <- b.ctx.Err()
			return
		}
		argv := []string{"perf", "record", "-q", "-a", "-F", "999", "-o", p.file, "--", "sleep", strconv.FormatFloat(length.Seconds(), 'f', 1, 64)}
		record(argv...)
		out, err := exec.CommandContext(b.ctx, argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("perf record: %v: %s", err, bytes.TrimSpace(out))
		}
		p.done <- err
	}()
	return p
}

func (p *profile) wait() (map[string]float64, error) {
	if err := <-p.done; err != nil {
		return nil, err
	}
	argv := []string{"perf", "report", "-i", p.file, "--stdio", "--no-children", "--sort", "sym"}
	record(argv...)
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		return nil, fmt.Errorf("perf report -i %s: %v", p.file, err)
	}
	return profileShares(out)
}

// logProfile writes where a run's time went to the log and to
// profile-shares.tsv beside the perf data.
func (b *bench) logProfile(caseName, metric string, n, rep int, shares map[string]float64, file string) {
	var parts []string
	var tsv strings.Builder
	for _, kind := range append(profileKindNames(), "other") {
		parts = append(parts, fmt.Sprintf("%s %.1f%%", kind, shares[kind]))
		fmt.Fprintf(&tsv, "%s\t%s\t%d\t%d\t%s\t%.2f\n", caseName, metric, n, rep, kind, shares[kind])
	}
	log.Printf("  %-16s %s: CPU by kind of work (perf, whole machine): %s (%s)", caseName, metric, strings.Join(parts, ", "), filepath.Base(file))
	b.appendOut("profile-shares.tsv", tsv.String())
}

// appendOut appends text to the file name in -out, which every run of the
// benchmark adds its rows to; a failure is logged, not fatal.
func (b *bench) appendOut(name, text string) {
	f, err := os.OpenFile(filepath.Join(b.out, name), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.WriteString(text)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		log.Printf("  %s: %v", name, err)
	}
}

func profileKindNames() []string {
	var names []string
	for _, k := range profileKinds {
		names = append(names, k.name)
	}
	return names
}
