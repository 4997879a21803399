// Package teardown removes everything a shunt instance created on the
// machine. It is apart from the agent so the CLI can sweep up after a
// crashed agent without linking the agent itself.
package teardown

import (
	"errors"
	"os"
	"strings"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podnet"
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
		datapath.Uninstall(inst.PinDir()),
		os.RemoveAll(inst.StateDir()),
		os.RemoveAll(inst.RunDir()),
	)
	return errors.Join(errs...)
}
