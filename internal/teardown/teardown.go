// Package teardown removes everything a shunt instance created on the
// machine. It is apart from the agent so the CLI can sweep up after a
// crashed agent without linking the agent itself.
package teardown

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/mountpoint"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/steerroute"
	"github.com/shuntnet/shunt/internal/tcfilter"
)

// Instance removes what an instance created, also when no agent runs and
// its state is gone: pods are found by the marks on their interfaces
// (PodNetns). A second run is a no-op.
func Instance(inst instance.Instance) error {
	var errs []error
	if root, err := cgroup.Root(); err == nil {
		errs = append(errs, cgroup.Remove(inst.CgroupDir(root)))
	}
	// The pods' namespaces are found before their host veths go: an older
	// agent's pod namespace is known only through its veth's alias.
	podNetns := PodNetns(inst)
	if names, err := podnet.LinksWithAliasPrefix(inst.LinkAliasPrefix()); err == nil {
		for _, n := range names {
			errs = append(errs, podnet.DeleteLink(n))
		}
	}
	for _, path := range podNetns {
		errs = append(errs, podnet.TeardownPod(podnet.Pod{Netns: filepath.Base(path)}))
	}
	// A pod's namespace file without the namespace mounted on it: its
	// creator (or remover) was killed half-way, an agent stopped in the
	// middle of a pod's sandbox. No other instance's name starts so.
	for _, path := range podnet.HalfMadeNetns(inst.Name + "-") {
		errs = append(errs, podnet.DeleteNetns(filepath.Base(path)))
	}
	errs = append(errs,
		podnet.TeardownNode(podnet.Node{HostIf: inst.NodeIf()}),
		podnet.DeleteLink(inst.TunnelIf()),
		// The tc fallback's filters on interfaces that outlive the
		// instance (the uplink), in this network namespace: a lab's
		// node namespaces go with the lab.
		tcfilter.RemoveAll(tcfilter.OwnerOf(inst.PinDir())),
		// The node proxy's steering routing, when no other instance in
		// this namespace claims it; before the run directory, which
		// holds the claim.
		steerroute.Release(inst),
		Pins(inst.PinDir()),
		os.RemoveAll(inst.StateDir()),
		os.RemoveAll(inst.RunDir()),
		// The mount points its pods' containers needed on the machine.
		mountpoint.ReleaseInstance(inst.Name),
	)
	return errors.Join(errs...)
}

// PodNetns are the paths of the instance's pod network namespaces, found
// by what marks them as its own rather than by name alone: another
// instance's, a test's or an admin's namespace may start with the same
// "NAME-". A namespace is the instance's when an interface in it carries
// the instance's alias (the loopback, marked at creation), or when it is
// named after a pod whose host veth carries it (a pod an agent built before
// namespaces were marked).
func PodNetns(inst instance.Instance) []string {
	owned := podnet.NetnsOwnedBy(inst.Name+"-", inst.LinkAliasPrefix())
	aliases, _ := podnet.LinkAliasesWithPrefix(inst.LinkAliasPrefix())
	for _, alias := range aliases {
		namespace, name, ok := strings.Cut(strings.TrimPrefix(alias, inst.LinkAliasPrefix()), "/")
		if !ok {
			continue
		}
		for _, netns := range []string{inst.PodNetns(namespace, name), inst.LegacyPodNetns(namespace, name)} {
			path := podnet.NetnsPath(netns)
			if _, err := os.Stat(path); err == nil && !slices.Contains(owned, path) {
				owned = append(owned, path)
			}
		}
	}
	return owned
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
