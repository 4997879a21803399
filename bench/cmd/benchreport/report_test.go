package main

import (
	"strings"
	"testing"
)

func TestMediansRatiosAndTable(t *testing.T) {
	rows := []Row{
		{Case: "bridge", Metric: "p50", Unit: "us", Value: 40, Rep: 1},
		{Case: "bridge", Metric: "p50", Unit: "us", Value: 44, Rep: 2},
		{Case: "bridge", Metric: "p50", Unit: "us", Value: 42, Rep: 3},
		{Case: "peer", Metric: "p50", Unit: "us", Value: 30, Rep: 1},
		{Case: "peer", Metric: "p50", Unit: "us", Value: 29, Rep: 2},
		{Case: "peer", Metric: "p50", Unit: "us", Value: 100, Rep: 3},
		{Case: "peer", Metric: "gbps", Unit: "Gbit/s", Value: 20, Rep: 1},
		{Case: "peer", Metric: "gbps", Unit: "Gbit/s", Value: 22, Rep: 2},
	}
	meds := Medians(rows)
	want := map[string]float64{"bridge/p50": 42, "peer/p50": 30, "peer/gbps": 21}
	for _, m := range meds {
		if want[m.Case+"/"+m.Metric] != m.Value {
			t.Errorf("%s/%s median %v, want %v", m.Case, m.Metric, m.Value, want[m.Case+"/"+m.Metric])
		}
	}
	md := Markdown("T", meds, "bridge", "hdr", "bench/run x", "")
	for _, s := range []string{
		"| case | p50 (us) | × bridge | gbps (Gbit/s) | × bridge |",
		"| bridge | 42.00 | 1.00 | — | — |",
		"| peer | 30.00 | 0.71 | 21.00 | — |",
		"bench/run x",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	svg := Chart("T", meds)
	if !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, ">peer<") {
		t.Errorf("chart: %s", svg)
	}
}

func TestScaledTableHasNColumnAndLines(t *testing.T) {
	rows := []Row{
		{Case: "a", N: 0, Metric: "rate", Unit: "conn/s", Value: 10},
		{Case: "a", N: 100, Metric: "rate", Unit: "conn/s", Value: 8},
		{Case: "b", N: 0, Metric: "rate", Unit: "conn/s", Value: 5},
		{Case: "b", N: 100, Metric: "rate", Unit: "conn/s", Value: 4},
	}
	md := Markdown("T", Medians(rows), "a", "", "", "")
	if !strings.Contains(md, "| case | n | rate (conn/s) | × a |") || !strings.Contains(md, "| b | 100 | 4.00 | 0.50 |") {
		t.Errorf("scaled table:\n%s", md)
	}
	if svg := Chart("T", Medians(rows)); !strings.Contains(svg, "<polyline") {
		t.Error("scaled chart has no lines")
	}
}
