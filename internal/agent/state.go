package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/manifest"
)

// State is what the agent persists in its state directory: the desired
// objects (so a restart needs no re-apply) and what it built for each pod.
type State struct {
	Mode        datapath.Mode         `json:"mode"`
	PodCIDR     string                `json:"podCIDR"`
	ServiceCIDR string                `json:"serviceCIDR"`
	ClusterIPs  map[string]string     `json:"clusterIPs"` // service ns/name -> allocated ClusterIP
	Objects     []StoredObject        `json:"objects"`
	Pods        map[string]*PodRecord `json:"pods"` // by namespace/name
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
	data, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return &State{Pods: map[string]*PodRecord{}}, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt uninstall` if it is damaged)", statePath(dir), err)
	}
	if s.Pods == nil {
		s.Pods = map[string]*PodRecord{}
	}
	return &s, nil
}

// save writes the state atomically: a crash leaves the old or the new file.
func (s *State) save(dir string) error {
	data, err := json.Marshal(s) // compact: the file holds every object, indenting doubles it
	if err != nil {
		return err
	}
	tmp := statePath(dir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return os.Rename(tmp, statePath(dir))
}

// storeObjects converts model objects for persistence.
func storeObjects(objs []manifest.Object) ([]StoredObject, error) {
	out := make([]StoredObject, 0, len(objs))
	for _, o := range objs {
		raw, err := json.Marshal(o.Obj)
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", o.Key(), err)
		}
		out = append(out, StoredObject{Source: o.Source, Object: raw})
	}
	return out, nil
}

// decodeObjects parses persisted or received objects with the same strict
// parser as files, so both go through one set of checks.
func decodeObjects(stored []StoredObject) ([]manifest.Object, error) {
	var out []manifest.Object
	for _, so := range stored {
		objs, err := manifest.Parse(so.Source, so.Object)
		if err != nil {
			return nil, err
		}
		// One object per entry: keep the file#doc it came from, not "#1".
		for i := range objs {
			objs[i].Source = so.Source
		}
		out = append(out, objs...)
	}
	return out, nil
}
