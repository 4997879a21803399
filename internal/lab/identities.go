package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/policy"
)

// ClusterIdentities numbers the identities of a multi-node lab: the
// control plane's node and every joining node resolve pod identity keys
// here (reconciler.IdentityResolver), so an identity carried in a VNI
// means the same pods on every node. A key keeps its number for the life
// of the lab (numbers are plentiful: 2^24 less the reserved ones, and a
// number reused while a node still enforces the old meaning would let
// the wrong pods through). Persisted, so a restart keeps them.
type ClusterIdentities struct {
	path string

	mu    sync.Mutex
	ids   map[string]uint32
	used  map[uint32]bool
	free  uint32
	saved []byte
}

// NewClusterIdentities loads the numbers kept in dir; a new lab starts
// from seed (the numbers its first node gave before it served others).
func NewClusterIdentities(dir string, seed map[string]uint32) (*ClusterIdentities, error) {
	c := &ClusterIdentities{path: filepath.Join(dir, "cluster-identities.json"), ids: map[string]uint32{}, used: map[uint32]bool{}, free: policy.FirstPodIdentity}
	data, err := os.ReadFile(c.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		for k, id := range seed {
			c.ids[k] = id
		}
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &c.ids); err != nil {
			return nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt lab down` if it is damaged)", c.path, err)
		}
		c.saved = data
	}
	for _, id := range c.ids {
		c.used[id] = true
	}
	return c, nil
}

// Resolve gives every key its number, new keys the lowest free one.
func (c *ClusterIdentities) Resolve(_ context.Context, keys []policy.IdentityKey) (map[string]uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint32, len(keys))
	added := false
	for _, k := range keys {
		id, ok := c.ids[k.Key]
		if !ok {
			for c.used[c.free] {
				c.free++
			}
			if c.free >= policy.FirstCIDRIdentity {
				return nil, fmt.Errorf("the lab has numbered every pod identity (%d): `shunt lab down` and up again", policy.FirstCIDRIdentity-policy.FirstPodIdentity)
			}
			id = c.free
			c.ids[k.Key], c.used[id] = id, true
			added = true
		}
		out[k.Key] = id
	}
	if added {
		var err error
		if c.saved, err = atomicfile.WriteJSON(c.path, c.ids, c.saved); err != nil {
			return nil, fmt.Errorf("keeping the cluster's identities: %w", err)
		}
	}
	return out, nil
}
