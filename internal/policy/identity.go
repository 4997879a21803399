// Package policy computes, without I/O, what the datapath needs to enforce
// network policy: an identity for every distinct (namespace, labels) set,
// the ipcache (address -> identity), identities for the CIDRs policies
// name, and per local pod and direction the policy entries (peer identity,
// protocol, port prefix -> allow/deny, deciding rule). Trace explains a
// verdict from the same entries.
package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// NamespaceNameLabel is the label the API server puts on every namespace,
// so a namespaceSelector can pick namespaces by name.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// Pod is a pod as policy sees it.
type Pod struct {
	Pod   *corev1.Pod
	IP    netip.Addr // invalid while the pod has no address
	Local bool       // runs on this node: gets policy entries
}

func (p Pod) key() string { return p.Pod.Namespace + "/" + p.Pod.Name }

// Identity is one security identity: the pods of one namespace that carry
// the same labels (in a namespace with the same labels) share it.
type Identity struct {
	ID              uint32            `json:"id"`
	Namespace       string            `json:"namespace,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty"`
	Pods            []string          `json:"pods,omitempty"` // ns/name
	Reserved        string            `json:"reserved,omitempty"`
}

// ReservedIdentities are the identities of what is not a pod.
var ReservedIdentities = []Identity{
	{ID: IdentityHost, Reserved: "host"},
	{ID: IdentityWorld, Reserved: "world"},
	{ID: IdentityRemoteNode, Reserved: "remote-node"},
}

// Allocations are the numbers handed out so far. They are kept across
// computations and agent restarts, so an identity or rule keeps its number
// while it exists and unchanged policy never rewrites a map entry.
type Allocations struct {
	Identities map[string]uint32 `json:"identities,omitempty"` // identity key -> id
	CIDRs      map[string]uint32 `json:"cidrs,omitempty"`      // prefix -> id
	Rules      map[string]uint32 `json:"rules,omitempty"`      // rule key -> id
}

// allocator hands out stable numbers: a key keeps the number it had; new
// keys get the lowest free number from first. Keys not asked for again are
// forgotten when the computation ends.
type allocator struct {
	prev  map[string]uint32
	next  map[string]uint32
	used  map[uint32]bool
	first uint32
	free  uint32
}

func newAllocator(prev map[string]uint32, first uint32) *allocator {
	a := &allocator{prev: prev, next: map[string]uint32{}, used: map[uint32]bool{}, first: first, free: first}
	for _, id := range prev {
		a.used[id] = true
	}
	return a
}

func (a *allocator) get(key string) uint32 {
	if id, ok := a.next[key]; ok {
		return id
	}
	id, ok := a.prev[key]
	if !ok {
		for a.used[a.free] {
			a.free++
		}
		id = a.free
		a.used[id] = true
	}
	a.next[key] = id
	return id
}

// labelsKey is a canonical text of a label set.
func labelsKey(l map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(l)) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}

// IdentityKeyOf is the key of the pods of namespace ns with podLabels, in a
// namespace labelled nsLabels (with its name label): what an identity
// stands for.
func IdentityKeyOf(ns string, podLabels, nsLabels map[string]string) string {
	return identityKey(ns, podLabels, nsLabels)
}

func identityKey(ns string, podLabels, nsLabels map[string]string) string {
	return ns + "\x01" + labelsKey(podLabels) + "\x01" + labelsKey(nsLabels)
}

// IdentityKey is what an identity stands for, as a cluster-wide allocator
// publishes it: the key compute uses, and its parts for people.
type IdentityKey struct {
	Key             string
	Namespace       string
	Labels          map[string]string
	NamespaceLabels map[string]string
}

// IdentityKeys lists the identity keys of every pod of the input, once
// each, sorted: what a cluster-wide allocator must number before Compute,
// which then takes those numbers as they are (Allocations.Identities).
func IdentityKeys(in Input) []IdentityKey {
	nsLabels := namespaceLabelSets(in.Namespaces)
	seen := map[string]bool{}
	var out []IdentityKey
	for _, p := range in.Pods {
		nsl := nsLabels(p.Pod.Namespace)
		k := identityKey(p.Pod.Namespace, p.Pod.Labels, nsl)
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, IdentityKey{Key: k, Namespace: p.Pod.Namespace, Labels: p.Pod.Labels, NamespaceLabels: nsl})
	}
	slices.SortFunc(out, func(a, b IdentityKey) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// namespaceLabelSets gives each namespace's labels as selectors see them:
// with the name label the API server adds.
func namespaceLabelSets(nss []*corev1.Namespace) func(string) map[string]string {
	sets := make(map[string]map[string]string, len(nss))
	for _, ns := range nss {
		l := maps.Clone(ns.Labels)
		if l == nil {
			l = map[string]string{}
		}
		l[NamespaceNameLabel] = ns.Name
		sets[ns.Name] = l
	}
	return func(ns string) map[string]string {
		if l, ok := sets[ns]; ok {
			return l
		}
		return map[string]string{NamespaceNameLabel: ns}
	}
}
