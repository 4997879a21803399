package main

import (
	"reflect"
	"testing"
)

func TestStartSettingConflicts(t *testing.T) {
	// What shuntd records (writeFlags): every flag, defaults included.
	running := map[string]string{
		"metrics-addr": "", "flow-history": "8192", "drift-check-period": "2m0s", "masquerade-exclude": "10.0.0.0/8,192.168.0.0/16",
		"conntrack-single-table": "false", "socket-acceleration": "true", "flow-sampling": "default",
		"kubeconfig": "", "run-pods": "false", "node-lease-duration-seconds": "40",
	}
	for _, tc := range []struct {
		name  string
		asked labSettings
		want  []string
	}{
		{"nothing asked", labSettings{}, nil},
		{"the same, spelled otherwise", labSettings{"flow-history": "8192", "drift-check-period": "120s", "masquerade-exclude": "10.0.0.0/8, 192.168.0.0/16", "conntrack-single-table": "false"}, nil},
		{"differing start-time settings, each named", labSettings{"metrics-addr": "127.0.0.1:9962", "flow-history": "10", "conntrack-single-table": "true"},
			[]string{"--conntrack-single-table true (it runs with false)", "--flow-history 10 (it runs with 8192)", "--metrics-addr 127.0.0.1:9962 (it runs with <none>)"}},
		{"live settings are switched, not refused", labSettings{"socket-acceleration": "false", "flow-sampling": "all"}, nil},
		{"kubelet settings only matter with --kubeconfig", labSettings{"run-pods": "true", "node-lease-duration-seconds": "8"}, nil},
		{"a flag the agent does not have", labSettings{"no-such-flag": "x"}, nil},
		{"a setting dropped", labSettings{"masquerade-exclude": ""}, []string{"--masquerade-exclude <none> (it runs with 10.0.0.0/8,192.168.0.0/16)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := startSettingConflicts(tc.asked, running); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAskedSettings: only the flags given count, less the lab's own and
// those the caller compares elsewhere.
func TestAskedSettings(t *testing.T) {
	var g globals
	up := newLabUpCmd(&g)
	if err := up.ParseFlags([]string{"--mode", "bridge", "--metrics-addr", "127.0.0.1:1", "--nodes", "2", "--tunnel", "vxlan", "--socket-acceleration", "-f", "x.yaml"}); err != nil {
		t.Fatal(err)
	}
	want := labSettings{"metrics-addr": "127.0.0.1:1", "socket-acceleration": "true"}
	if got := askedSettings(up.Flags(), nodeSettings...); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	want["tunnel"] = "vxlan"
	if got := askedSettings(up.Flags()); !reflect.DeepEqual(got, want) {
		t.Errorf("one node: got %v, want %v", got, want)
	}
}
