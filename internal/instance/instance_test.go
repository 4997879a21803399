package instance

import (
	"strings"
	"testing"
)

// TestPodFileName: every pod gets a network namespace of its own, named
// within NAME_MAX even at Kubernetes' length limits, and pods of a
// namespace without "-" keep the name older agents gave them.
func TestPodFileName(t *testing.T) {
	inst := Instance{Name: "abcdefghij"} // the longest instance name
	ns63 := strings.Repeat("n", 63)
	name253 := strings.Join([]string{strings.Repeat("p", 63), strings.Repeat("q", 63), strings.Repeat("r", 63), strings.Repeat("s", 61)}, ".")
	sibling := name253[:252] + "t" // shares 252 bytes with name253
	pairs := [][2][2]string{
		{{"a-b", "c"}, {"a", "b-c"}},       // "-" in either name
		{{ns63, name253}, {ns63, sibling}}, // a long shared prefix
		{{"default", name253}, {"default", sibling}},
	}
	for _, p := range pairs {
		a, b := inst.PodNetns(p[0][0], p[0][1]), inst.PodNetns(p[1][0], p[1][1])
		if a == b {
			t.Errorf("pods %s/%s and %s/%s share network namespace %s", p[0][0], p[0][1], p[1][0], p[1][1], a)
		}
		for _, n := range []string{a, b} {
			if len(n) > 255 {
				t.Errorf("network namespace name of %d bytes, over NAME_MAX: %s", len(n), n)
			}
		}
	}
	if got := PodFileName("default", "client"); got != "default_client" {
		t.Errorf("PodFileName(default, client) = %q, want default_client (as before)", got)
	}
	if got := inst.PodNetns("default", "client"); got != "abcdefghij-default-client" {
		t.Errorf("PodNetns(default, client) = %q, want abcdefghij-default-client (as before)", got)
	}
	if got := PodFileName(ns63, name253); len(got) != maxPodFileName+1 || !strings.HasPrefix(got, ns63+"_ppp") {
		t.Errorf("PodFileName of a 317-byte pod: %q (%d bytes), want its first bytes and a hash, %d bytes", got, len(got), maxPodFileName+1)
	}
}
