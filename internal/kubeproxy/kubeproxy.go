// Package kubeproxy finds what kube-proxy programmed in a node's netfilter
// and removes it as `kube-proxy --cleanup` does. Two translators of the same
// Service would fight: kube-proxy's DNAT rewrites what shunt's socket-layer
// balancing chose, or answers NodePorts shunt withdrew. shunt replaces
// kube-proxy, so an agent on a Kubernetes node refuses to start while
// kube-proxy's rules are live, unless told to remove them.
//
// Both of kube-proxy's Linux modes are read through nftables' netlink API
// (no binary needed): the nftables mode keeps everything in its own table
// "kube-proxy" (ip and ip6), and the iptables mode, through iptables-nft
// (the default iptables of current distributions and of kube-proxy's own
// image when the node uses it), writes KUBE-* chains into the nat, filter
// and mangle tables. Which chains are kube-proxy's follows kube-proxy's
// CleanupLeftovers (pkg/proxy/iptables/cleanup.go, v1.37): kubelet's own
// chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) are never
// counted or touched. Rules of iptables-legacy (x_tables) cannot be read
// over nftables' API: they are reported when iptables-legacy-save is there
// to list them, and never removed here.
package kubeproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// nftablesTable is the table of kube-proxy's nftables mode.
const nftablesTable = "kube-proxy"

// ownedChains are kube-proxy's fixed chains per table in its iptables
// mode; service chains (ownedChainPrefixes) come and go with Services.
var ownedChains = map[string][]string{
	"nat":    {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"},
	"mangle": {"KUBE-PROXY-CANARY"},
}

// ownedChainPrefixes name kube-proxy's per-Service and per-endpoint chains
// in the nat table (isServiceChainName in kube-proxy).
var ownedChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"}

// liveChains are the entry points that make kube-proxy's iptables rules
// translate traffic; a canary alone translates nothing.
var liveChains = []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES"}

func owned(table, chain string) bool {
	if slices.Contains(ownedChains[table], chain) {
		return true
	}
	return table == "nat" && slices.ContainsFunc(ownedChainPrefixes, func(p string) bool { return strings.HasPrefix(chain, p) })
}

// Rules is what kube-proxy left in one network namespace's netfilter.
type Rules struct {
	// Tables of the nftables mode: "ip kube-proxy", "ip6 kube-proxy".
	Tables []string
	// Chains of the iptables mode written through iptables-nft, as
	// "ip nat KUBE-SERVICES"; per-Service chains are only counted.
	Chains        []string
	ServiceChains int
	// Legacy are KUBE-* chains of iptables-legacy, as "ip nat KUBE-SERVICES",
	// when iptables-legacy-save could list them; LegacyUnread says why
	// legacy tables that are loaded could not be read.
	Legacy       []string
	LegacyUnread string
}

// Live says whether kube-proxy's rules translate Services here.
func (r Rules) Live() bool {
	live := func(c string) bool {
		return slices.ContainsFunc(liveChains, func(l string) bool { return strings.HasSuffix(c, " "+l) })
	}
	return len(r.Tables) > 0 || slices.ContainsFunc(r.Chains, live) || slices.ContainsFunc(r.Legacy, live)
}

// Empty says whether nothing of kube-proxy is left (canaries included).
func (r Rules) Empty() bool {
	return len(r.Tables) == 0 && len(r.Chains) == 0 && r.ServiceChains == 0 && len(r.Legacy) == 0
}

// String names what was found, for errors and `shunt node check`.
func (r Rules) String() string {
	var parts []string
	if len(r.Tables) > 0 {
		parts = append(parts, "nftables mode: table "+strings.Join(r.Tables, ", table "))
	}
	if len(r.Chains) > 0 || r.ServiceChains > 0 {
		parts = append(parts, fmt.Sprintf("iptables mode (iptables-nft): chains %s and %d per-Service chains", strings.Join(r.Chains, ", "), r.ServiceChains))
	}
	if len(r.Legacy) > 0 {
		parts = append(parts, "iptables mode (iptables-legacy): chains "+strings.Join(r.Legacy, ", "))
	}
	if len(parts) == 0 {
		parts = append(parts, "no rules of kube-proxy")
	}
	if r.LegacyUnread != "" {
		parts = append(parts, r.LegacyUnread)
	}
	return strings.Join(parts, "; ")
}

var families = []struct {
	family nftables.TableFamily
	name   string
}{{nftables.TableFamilyIPv4, "ip"}, {nftables.TableFamilyIPv6, "ip6"}}

// Detect reads the netfilter of the calling thread's network namespace.
func Detect() (Rules, error) {
	conn, err := nftables.New()
	if err != nil {
		return Rules{}, fmt.Errorf("opening nftables' netlink socket: %w", err)
	}
	var r Rules
	for _, f := range families {
		tables, err := conn.ListTablesOfFamily(f.family)
		if err != nil {
			return Rules{}, fmt.Errorf("listing %s nftables tables: %w", f.name, err)
		}
		for _, t := range tables {
			if t.Name == nftablesTable {
				r.Tables = append(r.Tables, f.name+" "+t.Name)
			}
		}
		chains, err := conn.ListChainsOfTableFamily(f.family)
		if err != nil {
			return Rules{}, fmt.Errorf("listing %s nftables chains: %w", f.name, err)
		}
		for _, c := range chains {
			switch {
			case c.Table.Name == nftablesTable || !owned(c.Table.Name, c.Name):
			case slices.Contains(ownedChains[c.Table.Name], c.Name):
				r.Chains = append(r.Chains, f.name+" "+c.Table.Name+" "+c.Name)
			default:
				r.ServiceChains++
			}
		}
	}
	r.Legacy, r.LegacyUnread = detectLegacy()
	return r, nil
}

// detectLegacy lists kube-proxy's chains in iptables-legacy's tables, which
// only iptables-legacy-save can read. Loaded x_tables tables alone prove
// nothing (any iptables-legacy user loads them), so without the program
// they are only mentioned.
func detectLegacy() ([]string, string) {
	names, err := os.ReadFile("/proc/net/ip_tables_names")
	if err != nil || len(bytes.TrimSpace(names)) == 0 {
		return nil, "" // no legacy table loaded in this namespace
	}
	save, err := exec.LookPath("iptables-legacy-save")
	if err != nil {
		return nil, fmt.Sprintf("iptables-legacy tables are loaded (%s) but iptables-legacy-save is not installed to read them", strings.Join(strings.Fields(string(names)), ", "))
	}
	out, err := exec.Command(save).Output()
	if err != nil {
		return nil, fmt.Sprintf("iptables-legacy-save failed: %v", err)
	}
	var found []string
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			chain, _, _ := strings.Cut(line[1:], " ")
			if slices.Contains(ownedChains[table], chain) {
				found = append(found, "ip "+table+" "+chain)
			}
		}
	}
	return found, ""
}

// Remove deletes kube-proxy's rules from the calling thread's network
// namespace in one nftables transaction, as `kube-proxy --cleanup` does:
// the nftables mode's tables; in the iptables mode, the jumps from the
// built-in chains into kube-proxy's chains, then those chains. Connections
// kube-proxy already translated keep their translation: it lives in the
// kernel's conntrack entry, not in the rules. kube-proxy must be stopped
// first, or it writes its rules back at its next sync. Rules of
// iptables-legacy are refused with what to run instead.
func Remove() error {
	before, err := Detect()
	if err != nil {
		return err
	}
	if len(before.Legacy) > 0 {
		return fmt.Errorf("kube-proxy's rules are in iptables-legacy (%s), which shunt does not edit: run `kube-proxy --cleanup` on the node (kube-proxy's image has it), then start shunt", strings.Join(before.Legacy, ", "))
	}
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables' netlink socket: %w", err)
	}
	for _, f := range families {
		tables, err := conn.ListTablesOfFamily(f.family)
		if err != nil {
			return err
		}
		for _, t := range tables {
			if t.Name == nftablesTable {
				conn.DelTable(t)
			}
		}
		chains, err := conn.ListChainsOfTableFamily(f.family)
		if err != nil {
			return err
		}
		var theirs []*nftables.Chain
		for _, c := range chains {
			if c.Table.Name == nftablesTable {
				continue
			}
			if owned(c.Table.Name, c.Name) {
				theirs = append(theirs, c)
				continue
			}
			// Any other chain (built-in or someone else's) may jump
			// into kube-proxy's: those rules go, the chain stays.
			rules, err := conn.GetRules(c.Table, c)
			if err != nil {
				return fmt.Errorf("reading the rules of %s %s %s: %w", f.name, c.Table.Name, c.Name, err)
			}
			for _, rule := range rules {
				if target := jumpTarget(rule); target != "" && owned(c.Table.Name, target) {
					if err := conn.DelRule(rule); err != nil {
						return err
					}
				}
			}
		}
		// Their chains jump into each other: all are emptied before any
		// is deleted.
		for _, c := range theirs {
			conn.FlushChain(c)
		}
		for _, c := range theirs {
			conn.DelChain(c)
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("removing kube-proxy's rules (%s): %w", before, err)
	}
	after, err := Detect()
	if err != nil {
		return err
	}
	if !after.Empty() {
		return fmt.Errorf("kube-proxy's rules are back or were not all removed (%s): is kube-proxy still running on this node? Stop it first (docs/install.md, migrating from kube-proxy)", after)
	}
	return nil
}

// jumpTarget is the chain a rule jumps or goes to ("" for none).
func jumpTarget(r *nftables.Rule) string {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
			return v.Chain
		}
	}
	return ""
}

// ErrLive is returned by Check when kube-proxy's rules translate Services.
var ErrLive = errors.New("kube-proxy's rules are live on this node")

// Check is the agent's start-up check on a Kubernetes node: nothing of
// kube-proxy, or its rules removed when remove is set. The error names what
// was found and both ways out.
func Check(remove bool) (Rules, error) {
	r, err := Detect()
	if err != nil {
		return r, fmt.Errorf("looking for kube-proxy's rules: %w", err)
	}
	if !r.Live() {
		return r, nil
	}
	if !remove {
		return r, fmt.Errorf("%w (%s): shunt replaces kube-proxy and both would translate the same Services. Stop kube-proxy on this node, then start shuntd with --remove-kube-proxy-rules (Helm: removeKubeProxyRules=true) or run `kube-proxy --cleanup`; docs/install.md says how to migrate node by node", ErrLive, r)
	}
	if err := Remove(); err != nil {
		return r, err
	}
	return r, nil
}
