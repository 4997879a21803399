// Package teardown removes everything a shunt instance created on the
// machine. It is apart from the agent so the CLI can sweep up after a
// crashed agent without linking the agent itself.
package teardown

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/tcfilter"
)

// Instance removes what an instance created, also when no agent runs and
// its state is gone: pods are found by namespace names and interface
// aliases. A second run is a no-op.
func Instance(inst instance.Instance) error {
	var errs []error
	if root, err := cgroup.Root(); err == nil {
		errs = append(errs, cgroup.Remove(inst.CgroupDir(root)))
	}
	if names, err := podnet.LinksWithAliasPrefix(inst.LinkAliasPrefix()); err == nil {
		for _, n := range names {
			errs = append(errs, podnet.DeleteLink(n))
		}
	}
	if entries, err := os.ReadDir(podnet.NetnsDir); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), inst.Name+"-") {
				errs = append(errs, podnet.TeardownPod(podnet.Pod{Netns: e.Name()}))
			}
		}
	}
	errs = append(errs,
		podnet.TeardownNode(podnet.Node{HostIf: inst.NodeIf()}),
		podnet.DeleteLink(inst.TunnelIf()),
		// The tc fallback's filters on interfaces that outlive the
		// instance (the uplink), in this network namespace: a lab's
		// node namespaces go with the lab.
		tcfilter.RemoveAll(tcfilter.OwnerOf(inst.PinDir())),
		Pins(inst.PinDir()),
		os.RemoveAll(inst.StateDir()),
		os.RemoveAll(inst.RunDir()),
	)
	return errors.Join(errs...)
}

// Pins removes every pin of a datapath under pinDir: links first (a link
// whose pin is gone and that no process holds is released, which detaches
// its program), then maps. Removing the file is all that unpinning is, so
// this needs no BPF library: the CLI removes an instance without linking
// the datapath. Running it twice is a no-op.
func Pins(pinDir string) error {
	links, _ := filepath.Glob(filepath.Join(pinDir, "links", "*"))
	var errs []error
	for _, pin := range links {
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, os.RemoveAll(pinDir))
	return errors.Join(errs...)
}
