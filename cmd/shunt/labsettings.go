package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/instance"
)

// `shunt lab up` on a running lab makes it so: settings the agent can
// change while it runs are changed (flow sampling, socket acceleration);
// the others are refused, each named, since they take effect only when the
// agent starts. Never silently ignored.

// labSettings are the agent settings a `lab up` was explicitly given:
// shuntd flag name → value as given.
type labSettings map[string]string

// lab-level flags of `lab up` that are not the agent's, or that the running
// lab is compared on elsewhere: mode and CIDRs with the agent's status
// (what it runs with, persisted or default), the layout's with the layout
// (settleLayout).
var notAgentSettings = []string{"filename", "wait", "nodes", "node-grace", "mode", "pod-cidr", "service-cidr"}

// nodeSettings are what a lab of several nodes sets for each of its nodes
// itself (ensureLabNodes) and settleLayout checks.
var nodeSettings = []string{"routing", "tunnel", "underlay-addr", "cluster-cidr", "masquerade", "node-name"}

// askedSettings are the flags of fs the user gave, less skip.
func askedSettings(fs *pflag.FlagSet, skip ...string) labSettings {
	asked := labSettings{}
	fs.Visit(func(f *pflag.Flag) {
		if !slices.Contains(notAgentSettings, f.Name) && !slices.Contains(skip, f.Name) {
			asked[f.Name] = f.Value.String()
		}
	})
	return asked
}

// runningFlags reads what the instance's running agent records of its flags
// (cmd/shuntd writeFlags); nil when it records none (an agent of an older
// build).
func runningFlags(inst instance.Instance) (map[string]string, error) {
	data, err := os.ReadFile(inst.AgentFlagsFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var flags map[string]string
	if err := json.Unmarshal(data, &flags); err != nil {
		return nil, fmt.Errorf("%s: %w", inst.AgentFlagsFile(), err)
	}
	return flags, nil
}

// liveSettings can be changed while the agent runs: `lab up` changes them
// through the agent's API, as the commands named do.
var liveSettings = []string{"flow-sampling", "socket-acceleration", "accelerate-node-processes", "accelerate-without-backpressure"}

// startSettingConflicts lists the settings asked that differ from the
// running agent's flags and take effect only when the agent starts, as
// "--flag ASKED (it runs with VALUE)". Live settings and flags the agent
// does not have are left out; run-pods and the node lease only matter with
// --kubeconfig.
func startSettingConflicts(asked labSettings, running map[string]string) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(asked)) {
		have, known := running[name]
		if !known || slices.Contains(liveSettings, name) {
			continue
		}
		if (name == "run-pods" || name == "node-lease-duration-seconds") && running["kubeconfig"] == "" {
			continue
		}
		if !sameSetting(asked[name], have) {
			out = append(out, fmt.Sprintf("--%s %s (it runs with %s)", name, orNone(asked[name]), orNone(have)))
		}
	}
	return out
}

// sameSetting compares two flag values as the agent reads them: durations
// as durations (2m is 2m0s), numbers as numbers, lists item by item.
func sameSetting(a, b string) bool {
	if a == b {
		return true
	}
	if da, err := time.ParseDuration(a); err == nil {
		db, err := time.ParseDuration(b)
		return err == nil && da == db
	}
	if na, err := strconv.ParseInt(a, 10, 64); err == nil {
		nb, err := strconv.ParseInt(b, 10, 64)
		return err == nil && na == nb
	}
	if ba, err := strconv.ParseBool(a); err == nil {
		bb, err := strconv.ParseBool(b)
		return err == nil && ba == bb
	}
	split := func(s string) []string {
		var items []string
		for _, it := range strings.Split(s, ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		return items
	}
	return slices.Equal(split(a), split(b))
}

// reconcileRunningAgent compares the settings asked of a running agent with
// what it runs: mode and CIDRs with its status, start-time flags with what
// it recorded. Any that differ are refused together, each named; then flow
// sampling and socket acceleration are switched live where they differ.
func reconcileRunningAgent(c *api.Client, inst instance.Instance, st api.Status, mode, podCIDR, serviceCIDR string, asked labSettings) error {
	var conflicts []string
	for _, s := range []struct{ flag, want, have string }{
		{"mode", mode, st.Mode}, {"pod-cidr", podCIDR, st.PodCIDR}, {"service-cidr", serviceCIDR, st.ServiceCIDR},
	} {
		if s.want != "" && s.want != s.have {
			conflicts = append(conflicts, fmt.Sprintf("--%s %s (it runs with %s)", s.flag, s.want, s.have))
		}
	}
	running, err := runningFlags(inst)
	if err != nil {
		return err
	}
	conflicts = append(conflicts, startSettingConflicts(asked, running)...)
	if running == nil && len(asked) > 0 {
		fmt.Fprintf(os.Stderr, "lab %q: its agent records no flags (an older build): only mode, CIDRs, flow sampling and socket acceleration were compared\n", inst.Name)
	}
	if len(conflicts) > 0 {
		return fmt.Errorf("lab %q runs with other settings than asked: %s; these take effect when its agent starts: run `shunt --instance %s lab down` first (it removes the lab's pods too), then `lab up` with them",
			inst.Name, strings.Join(conflicts, ", "), inst.Name)
	}
	if v, ok := asked["flow-sampling"]; ok && v != st.FlowSampling {
		var resp map[string]string
		if err := c.Do("POST", "/v1/flows/sampling?"+url.Values{"mode": {v}}.Encode(), nil, &resp); err != nil {
			return fmt.Errorf("switching flow sampling to %s: %w", v, err)
		}
		fmt.Fprintf(os.Stderr, "lab %q: flow sampling switched from %s to %s (as `shunt flow-sampling %s`)\n", inst.Name, st.FlowSampling, resp["sampling"], v)
	}
	on, nodeProcs := st.Accel.Enabled, st.Accel.NodeProcesses
	if v, ok := asked["socket-acceleration"]; ok {
		on, _ = strconv.ParseBool(v)
	}
	if v, ok := asked["accelerate-node-processes"]; ok {
		nodeProcs, _ = strconv.ParseBool(v)
	}
	// Node processes take part only with acceleration on (shuntd's flag).
	if on != st.Accel.Enabled || on && nodeProcs != st.Accel.NodeProcesses {
		var now api.AccelStatus
		unsafe, _ := strconv.ParseBool(asked["accelerate-without-backpressure"])
		q := fmt.Sprintf("/v1/accel?on=%t&nodeProcesses=%t&withoutBackpressure=%t", on, on && nodeProcs, unsafe)
		if err := c.Do("POST", q, nil, &now); err != nil {
			return fmt.Errorf("switching socket acceleration: %w", err)
		}
		cmd := map[bool]string{true: "on", false: "off"}[on]
		if on && nodeProcs {
			cmd += " --node-processes"
		}
		fmt.Fprintf(os.Stderr, "lab %q: socket acceleration %s (as `shunt accel %s`)\n", inst.Name, accelLine(now), cmd)
	}
	return nil
}
