package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/policy"
)

// State is the agent's own settings, in state.json. Each part keeps its own
// file beside it: the lab's objects (objects.json + objects.journal) and
// pod records (pods.json), the reconciler's policy numbers
// (identities.json).
type State struct {
	Mode        datapath.Mode `json:"mode"`
	PodCIDR     string        `json:"podCIDR"`
	ServiceCIDR string        `json:"serviceCIDR"`
	// Source: a Kubernetes API server the node follows (nil: the lab).
	Source   *SourceState `json:"source,omitempty"`
	Routing  string       `json:"routing,omitempty"`  // "", tunnel or native (older files: tunnel when Tunnel is set)
	Tunnel   string       `json:"tunnel,omitempty"`   // "" or vxlan
	Underlay string       `json:"underlay,omitempty"` // with routing or masquerade: this node's underlay address
	// Masquerade: pods' traffic to outside leaves from the node's address
	// (nil: it keeps the pods').
	Masquerade *MasqueradeState `json:"masquerade,omitempty"`
	// Only in state files of older versions, read to migrate them.
	Objects    []lab.StoredObject        `json:"objects,omitempty"`
	ClusterIPs map[string]string         `json:"clusterIPs,omitempty"`
	Pods       map[string]*lab.PodRecord `json:"pods,omitempty"`
	Policy     *policy.Allocations       `json:"policy,omitempty"`

	saved []byte // the file as last read or written
}

// MasqueradeState is how a node masquerades, as first started.
type MasqueradeState struct {
	Ports   string   `json:"ports"`             // MIN-MAX
	Exclude []string `json:"exclude,omitempty"` // CIDRs; empty: the defaults
}

// SourceState is the API server a Kubernetes node follows, or the node's
// place in a multi-node lab.
type SourceState struct {
	Kubeconfig string `json:"kubeconfig,omitempty"` // "": in-cluster
	NodeName   string `json:"nodeName,omitempty"`
	RunPods    bool   `json:"runPods,omitempty"`
	// NodeLeaseSeconds is the node's Lease duration (RunPods); 0: the
	// default.
	NodeLeaseSeconds int32 `json:"nodeLeaseDurationSeconds,omitempty"`
	// LabControlPlane: this node's control plane serves the lab's other
	// nodes; LabJoin: this node follows the control plane at that socket.
	LabControlPlane bool   `json:"labControlPlane,omitempty"`
	LabJoin         string `json:"labJoin,omitempty"`
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

func loadState(dir string) (*State, error) {
	var s State
	data, err := os.ReadFile(statePath(dir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err == nil {
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt lab down` if it is damaged)", statePath(dir), err)
		}
		s.saved = data
	}
	return &s, nil
}

// save writes state.json unless it holds this already.
func (s *State) save(dir string) error {
	var err error
	s.saved, err = atomicfile.WriteJSON(statePath(dir), s, s.saved)
	return err
}

func allocationsPath(dir string) string { return filepath.Join(dir, "identities.json") }

// loadAllocations reads the policy numbers handed out before (legacy: as
// an older agent kept them in state.json).
func loadAllocations(dir string, legacy *policy.Allocations) (policy.Allocations, error) {
	var a policy.Allocations
	data, err := os.ReadFile(allocationsPath(dir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if legacy != nil {
			return *legacy, nil
		}
		return a, nil
	case err != nil:
		return a, err
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return a, fmt.Errorf("reading %s: %w (remove the lab with `shunt lab down` if it is damaged)", allocationsPath(dir), err)
	}
	return a, nil
}

func saveAllocations(dir string, a policy.Allocations) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return atomicfile.Write(allocationsPath(dir), data)
}
