// Package instance names everything one shunt node creates on the machine:
// state and socket paths, bpffs pins, cgroups, namespaces and interfaces.
// Several instances (a lab, a test, a benchmark) can run side by side
// because every name derives from the instance name.
package instance

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Default is the instance used when none is named.
const Default = "shunt"

// The address ranges of a node unless --pod-cidr and --service-cidr say
// otherwise.
const (
	DefaultPodCIDR     = "10.244.0.0/24"
	DefaultServiceCIDR = "10.96.0.0/16"
)

var validName = regexp.MustCompile(`^[a-z][a-z0-9]{0,9}$`)

// Instance is one shunt node on this machine.
type Instance struct{ Name string }

// New validates the name: it becomes part of interface names, which the
// kernel limits to 15 bytes.
func New(name string) (Instance, error) {
	if !validName.MatchString(name) {
		return Instance{}, fmt.Errorf("invalid instance name %q: use 1-10 lowercase letters and digits, starting with a letter", name)
	}
	return Instance{Name: name}, nil
}

// StateDir keeps the agent's persisted state and the pods' logs.
func (i Instance) StateDir() string { return filepath.Join(stateRoot, i.Name) }

const (
	stateRoot = "/var/lib/shunt"
	runRoot   = "/run/shunt"
	pinRoot   = "/sys/fs/bpf"
)

// NodeOnlyDirs are what no container may see of any instance on the
// machine: the agents' sockets, state and pinned BPF objects (a root
// process reads and writes a pinned map without any capability, and so
// would change its own policy).
func NodeOnlyDirs() []string { return []string{runRoot, stateRoot, pinRoot} }

// MapLayoutFile records the layouts of the pinned maps, so that a later
// build can tell whether it reads them alike. It cannot sit beside the pins:
// bpffs holds no regular files.
func (i Instance) MapLayoutFile() string { return filepath.Join(i.StateDir(), "map-layout.json") }

// AgentFlagsFile records the command-line settings of the running agent,
// every flag with its value (defaults included), so that `shunt lab up` on a
// running lab can tell which of the settings it is asked for differ. In the
// run directory: it describes this run of the agent only.
func (i Instance) AgentFlagsFile() string { return filepath.Join(i.RunDir(), "shuntd-flags.json") }

// RunDir holds the agent's socket and pid file.
func (i Instance) RunDir() string { return filepath.Join(runRoot, i.Name) }

// Socket is the agent's API socket.
func (i Instance) Socket() string { return filepath.Join(i.RunDir(), "shuntd.sock") }

// PinDir holds pinned maps and links on bpffs.
func (i Instance) PinDir() string { return filepath.Join(pinRoot, i.Name) }

// CgroupDir is the instance's subtree below the cgroup v2 root.
func (i Instance) CgroupDir(root string) string { return filepath.Join(root, i.Name) }

// PodCgroupDir is one pod's cgroup.
func (i Instance) PodCgroupDir(root, namespace, name string) string {
	return filepath.Join(i.CgroupDir(root), "pods", PodFileName(namespace, name))
}

// maxPodFileName bounds the pod names below: with an instance name (up to
// 11 bytes with its dash) in front, they stay under NAME_MAX (255).
const maxPodFileName = 200

// PodFileName is a pod's part of the names of its cgroup and state
// directory: namespace "_" name (no Kubernetes name holds "_", so two pods
// never share one), bounded (boundedPodName).
func PodFileName(namespace, name string) string {
	return boundedPodName(namespace + "_" + name)
}

// boundedPodName keeps a pod's name on the machine a file name: a
// Kubernetes pod name may have 253 bytes and its namespace 63, 317 with
// the separator, over NAME_MAX. A longer one keeps its first bytes and a
// hash of the whole, one byte longer than any name kept whole, so it is no
// other pod's either.
func boundedPodName(n string) string {
	if len(n) <= maxPodFileName {
		return n
	}
	h := sha256.Sum256([]byte(n))
	return n[:maxPodFileName-16] + "-" + hex.EncodeToString(h[:8])
}

// NodeIf is the node interface holding the node's pod-network address.
func (i Instance) NodeIf() string { return i.Name + "_host" }

// TunnelIf is the node's overlay (VXLAN) device.
func (i Instance) TunnelIf() string { return i.Name + "_vxl" }

// PodNetns names a pod's network namespace: instance-namespace-name, as
// scripts and benchmarks expect (shunt-default-client), unless the
// namespace holds a "-": then "_" separates namespace and name. With "-"
// alone, pods a-b/c and a/b-c got one network namespace (the second
// mounted over the first, lab exec entered the wrong pod). Now a name
// without "_" has a namespace without "-", so its first "-" after the
// instance's ends the namespace; a name with "_" (which no Kubernetes name
// holds) is split there: no two pods share one. Bounded (boundedPodName).
func (i Instance) PodNetns(namespace, name string) string {
	sep := "-"
	if strings.Contains(namespace, "-") {
		sep = "_"
	}
	return i.Name + "-" + boundedPodName(namespace+sep+name)
}

// LegacyPodNetns is the name an agent before PodNetns' "_" gave a pod's
// network namespace; such a pod keeps it until its sandbox is rebuilt.
func (i Instance) LegacyPodNetns(namespace, name string) string {
	return i.Name + "-" + namespace + "-" + name
}

// LinkAliasPrefix marks every interface of this instance, so uninstall can
// find them even without the agent's state.
func (i Instance) LinkAliasPrefix() string { return "shunt:" + i.Name + ":" }

// PodLinkAlias is the alias set on a pod's host veth.
func (i Instance) PodLinkAlias(namespace, name string) string {
	return i.LinkAliasPrefix() + namespace + "/" + name
}
