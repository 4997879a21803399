package main

import (
	"os"
	"testing"
)

// TestParseCounters: the tables of /proc/net/snmp and /proc/net/netstat
// by nstat's names, read from this process's own network namespace (the
// kernel's real format), and a table whose values line is missing refused.
func TestParseCounters(t *testing.T) {
	snmp, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Skip("no /proc/net/snmp:", err)
	}
	netstat, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		t.Skip("no /proc/net/netstat:", err)
	}
	c, err := parseCounters(string(snmp) + string(netstat))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append(clientTCPCounters, serverTCPCounters...) {
		if _, ok := c[name]; !ok {
			t.Errorf("counter %s not found (have %d counters)", name, len(c))
		}
	}
	c, err = parseCounters("Tcp: RtoAlgorithm RetransSegs\nTcp: 1 42\nTcpExt: TWRecycled\nTcpExt: 7\n")
	if err != nil || c["TcpRetransSegs"] != 42 || c["TcpExtTWRecycled"] != 7 {
		t.Errorf("two tables: %v, %v; want TcpRetransSegs 42, TcpExtTWRecycled 7", c, err)
	}
	if _, err := parseCounters("Tcp: RtoAlgorithm RetransSegs\nTcp: 1 42\nTcpExt: TWRecycled\n"); err == nil {
		t.Error("a table without its values line was accepted")
	}
}

// TestCountersMoved: only the named counters that changed, in the order
// named; "none moved" when none did.
func TestCountersMoved(t *testing.T) {
	before := map[string]int64{"TcpRetransSegs": 5, "TcpOutRsts": 1, "Other": 1}
	after := map[string]int64{"TcpRetransSegs": 8, "TcpOutRsts": 1, "Other": 9, "TcpExtTWRecycled": 4}
	if got, want := countersMoved(before, after, []string{"TcpExtTWRecycled", "TcpOutRsts", "TcpRetransSegs"}), "TcpExtTWRecycled 4, TcpRetransSegs 3"; got != want {
		t.Errorf("countersMoved = %q, want %q", got, want)
	}
	if got := countersMoved(before, before, []string{"TcpRetransSegs"}); got != "none moved" {
		t.Errorf("countersMoved of unchanged counters = %q, want \"none moved\"", got)
	}
}
