package datapath

import (
	"net/netip"
	"testing"
)

// TestProgramStats: with the run-time statistics on, the connect hook's
// program counts the connections a process of the hooked cgroup makes
// (runs and time), every attached hook is listed once per program, and
// closing the datapath releases the statistics it turned on.
func TestProgramStats(t *testing.T) {
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer}, nil)
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	if err := d.EnableProgramStats(); err != nil {
		t.Fatal(err)
	}
	if !d.ProgramStatsOn() {
		t.Fatal("ProgramStatsOn after EnableProgramStats: false")
	}
	before := connectStat(t, d)
	c := startSockClient(t, cg, "")
	tcp := listenTCP(c, "127.0.0.3:0")
	web := netip.MustParseAddrPort("10.96.214.80:80")
	syncSockServices(t, d, 0, web, tcp, netip.MustParseAddrPort("10.96.214.81:80"), tcp)
	const conns = 5
	for range conns {
		if ans, want := c.do("tcp %s", web), "ok "+web.String(); ans != want {
			t.Fatalf("TCP connect to a service: %q, want %q", ans, want)
		}
	}
	after := connectStat(t, d)
	if runs := after.Runs - before.Runs; runs < conns {
		t.Errorf("sock-connect4 ran %d times over %d connects, want at least %d", runs, conns, conns)
	}
	if after.RunTime <= before.RunTime || after.NsPerRun() <= 0 {
		t.Errorf("sock-connect4's run time did not grow: %v then %v", before.RunTime, after.RunTime)
	}
	stats, err := d.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	hooks, err := d.Hooks()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Programs != 1 || hooks[s.Hook] != 1 {
			t.Errorf("hook %s: %d programs in the statistics, %d links; want one of each", s.Hook, s.Programs, hooks[s.Hook])
		}
	}
	if len(stats) != len(hooks) {
		t.Errorf("statistics for %d hooks, %d hooks attached: %+v", len(stats), len(hooks), stats)
	}
}

func connectStat(t *testing.T, d *Datapath) ProgramStat {
	t.Helper()
	stats, err := d.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Hook == "sock-connect4" {
			return s
		}
	}
	t.Fatalf("no statistics for sock-connect4: %+v", stats)
	return ProgramStat{}
}
