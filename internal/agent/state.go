package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/policy"
)

// State is what the agent persists in its state directory: the settings
// and what it built for each pod in state.json; the desired objects (so a
// restart needs no re-apply), ClusterIPs included in their specs, are kept
// by objectLog.
type State struct {
	Mode        datapath.Mode `json:"mode"`
	PodCIDR     string        `json:"podCIDR"`
	ServiceCIDR string        `json:"serviceCIDR"`
	// Only in state files of older versions: the objects, and ClusterIPs
	// by service namespace/name.
	Objects    []StoredObject        `json:"objects,omitempty"`
	ClusterIPs map[string]string     `json:"clusterIPs,omitempty"`
	Pods       map[string]*PodRecord `json:"pods"` // by namespace/name
	// Policy are the identity, CIDR and rule numbers handed out, kept so
	// they stay the same across restarts.
	Policy policy.Allocations `json:"policy"`
}

// StoredObject is a manifest object with where it came from.
type StoredObject struct {
	Source string          `json:"source"`
	Object json.RawMessage `json:"object"`
}

// PodRecord is the runtime side of one pod.
type PodRecord struct {
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
	IP         string            `json:"ip"`
	Netns      string            `json:"netns"`
	HostIf     string            `json:"hostIf"`
	Cgroup     string            `json:"cgroup"`
	Created    time.Time         `json:"created"`
	Containers []ContainerRecord `json:"containers"`
}

// ContainerRecord is one container process, run under a shim that records
// its exit status even when no agent is running.
type ContainerRecord struct {
	Name     string    `json:"name"`
	ShimPID  int       `json:"shimPID"`
	Started  time.Time `json:"started"`
	LogFile  string    `json:"logFile"`
	ExitFile string    `json:"exitFile"`
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

func loadState(dir string) (*State, error) {
	s := State{Pods: map[string]*PodRecord{}}
	data, err := os.ReadFile(statePath(dir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err == nil {
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt uninstall` if it is damaged)", statePath(dir), err)
		}
	}
	if s.Pods == nil {
		s.Pods = map[string]*PodRecord{}
	}
	return &s, nil
}

// writeAtomic writes a file so that a crash leaves the old or the new one.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return os.Rename(tmp, path)
}

// save writes state.json (settings, pods; not the objects) unless it
// would be written as last is; it returns what the file now holds.
func (s *State) save(dir string, last []byte) ([]byte, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return last, err
	}
	if bytes.Equal(data, last) {
		return last, nil
	}
	if err := writeAtomic(statePath(dir), data); err != nil {
		return last, err
	}
	return data, nil
}

// decodeObjects parses persisted objects with the same strict
// decoder as files, so both go through one set of checks.
func decodeObjects(stored []StoredObject) ([]manifest.Object, error) {
	docs := make([]manifest.Document, len(stored))
	for i, so := range stored {
		docs[i] = manifest.Document{Source: so.Source, JSON: so.Object}
	}
	return manifest.Decode(docs)
}
