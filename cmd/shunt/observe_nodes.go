package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/flows"
)

// flowStream is one node's flows.
type flowStream struct {
	node   string
	client *api.Client
}

// flowStreams are the agents whose flows observe shows: every node of a
// lab of several nodes (or only node), else the one agent; many says
// whether flows come from several nodes.
func flowStreams(g *globals, node string) (_ []flowStream, many bool, _ error) {
	c, inst, err := g.client()
	if err != nil {
		return nil, false, err
	}
	insts, layout, err := nodeInstances(inst)
	if err != nil {
		return nil, false, err
	}
	if layout == nil || g.socket != "" {
		if node != "" {
			return nil, false, fmt.Errorf("--node %s: lab %q has one node; --node picks one of a lab of several (`shunt lab up --nodes N`)", node, inst.Name)
		}
		return []flowStream{{client: c}}, false, nil
	}
	var out []flowStream
	var names []string
	for i, n := range layout.Nodes {
		names = append(names, n.Name)
		if node == "" || node == n.Name {
			out = append(out, flowStream{node: n.Name, client: api.NewClient(insts[i].Socket())})
		}
	}
	if len(out) == 0 {
		return nil, false, fmt.Errorf("--node %s: lab %q has nodes %s", node, inst.Name, strings.Join(names, ", "))
	}
	return out, true, nil
}

// relayStream is the merged flows of a relay at addr (by mutual TLS with
// tlsDir's certificate, when given).
func relayStream(addr, tlsDir string) ([]flowStream, error) {
	var cfg *tls.Config
	if tlsDir != "" {
		var err error
		if cfg, err = api.LoadTLS(tlsDir, false); err != nil {
			return nil, fmt.Errorf("--relay-tls-dir: %w", err)
		}
	}
	return []flowStream{{node: "relay " + addr, client: api.NewRemoteClient(addr, cfg)}}, nil
}

// mergeFlows calls each for the flows of every stream: with follow, as
// they come; else all of them by time, the last `last` (0: all).
func mergeFlows(streams []flowStream, path string, follow bool, last int, each func(line []byte, fl flows.Flow) error) error {
	type entry struct {
		line []byte
		fl   flows.Flow
	}
	var (
		mu      sync.Mutex
		entries []entry
		wg      sync.WaitGroup
		errs    = make([]error, len(streams))
	)
	for i, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.client.Stream(path, func(line []byte) error {
				var fl flows.Flow
				if err := json.Unmarshal(line, &fl); err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				if follow {
					return each(line, fl)
				}
				entries = append(entries, entry{slices.Clone(line), fl})
				return nil
			})
			if errs[i] != nil && s.node != "" {
				errs[i] = fmt.Errorf("node %s: %w", s.node, errs[i])
			}
		}()
	}
	wg.Wait()
	slices.SortStableFunc(entries, func(a, b entry) int { return a.fl.Time.Compare(b.fl.Time) })
	if last > 0 && len(entries) > last {
		entries = entries[len(entries)-last:]
	}
	for _, e := range entries {
		if err := each(e.line, e.fl); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}
