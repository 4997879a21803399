package kubecluster

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNodeLifecycleArgs: the controllers that remove a node that goes away
// run only when asked for (Nodes nobody heartbeats would otherwise lose
// their pods' endpoints a minute after they are created), with the grace
// period given, and Kubernetes' own grace period when none is.
func TestNodeLifecycleArgs(t *testing.T) {
	flag := func(args []string, name string) (string, bool) {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v, true
			}
		}
		return "", false
	}
	for _, tc := range []struct {
		name      string
		o         Options
		lifecycle bool
		grace     string // "" when the flag must be absent
	}{
		{"off", Options{}, false, ""},
		{"off, a grace period alone changes nothing", Options{NodeMonitorGracePeriod: 8 * time.Second}, false, ""},
		{"on, Kubernetes' grace period", Options{NodeLifecycle: true}, true, ""},
		{"on, a short grace period", Options{NodeLifecycle: true, NodeMonitorGracePeriod: 8 * time.Second}, true, "8s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.ClusterCIDR, tc.o.ServiceCIDR = DefaultClusterCIDR, "10.96.0.0/16"
			args := controllerManagerArgs(tc.o, "/d", 10257)
			list, _ := flag(args, "controllers")
			controllers := strings.Split(list, ",")
			for _, c := range Controllers {
				if !slices.Contains(controllers, c) {
					t.Errorf("--controllers=%s lacks %s", list, c)
				}
			}
			for _, c := range NodeLifecycleControllers {
				if slices.Contains(controllers, c) != tc.lifecycle {
					t.Errorf("--controllers=%s: %s there is %v, want %v", list, c, !tc.lifecycle, tc.lifecycle)
				}
			}
			grace, ok := flag(args, "node-monitor-grace-period")
			if (tc.grace == "") == ok || grace != tc.grace {
				t.Errorf("--node-monitor-grace-period=%q (given: %v), want %q", grace, ok, tc.grace)
			}
		})
	}
}

// A CRD created a moment before has no status yet: not established, and
// no error (kubectl wait failed on exactly this).
func TestCRDEstablished(t *testing.T) {
	for name, tc := range map[string]struct {
		crd  map[string]any
		want bool
	}{
		"no status":     {map[string]any{"metadata": map[string]any{"name": "a"}}, false},
		"no conditions": {map[string]any{"status": map[string]any{}}, false},
		"names accepted only": {map[string]any{"status": map[string]any{"conditions": []any{
			map[string]any{"type": "NamesAccepted", "status": "True"}}}}, false},
		"established false": {map[string]any{"status": map[string]any{"conditions": []any{
			map[string]any{"type": "Established", "status": "False"}}}}, false},
		"established": {map[string]any{"status": map[string]any{"conditions": []any{
			map[string]any{"type": "NamesAccepted", "status": "True"},
			map[string]any{"type": "Established", "status": "True"}}}}, true},
	} {
		if got := crdEstablished(tc.crd); got != tc.want {
			t.Errorf("%s: crdEstablished = %v, want %v", name, got, tc.want)
		}
	}
}
