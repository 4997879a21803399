// Package steerroute installs and removes the routing that delivers the
// packets tc steers to the node proxy (bpf/lib/steer.h) to the node's own
// stack: a rule sends packets with the steering mark to a table whose only
// route is `local 0.0.0.0/0 dev lo`, the routing TPROXY needs too.
//
// The rule and the route belong to a network namespace, not to an
// instance: every instance whose agent runs in one namespace (a node's
// agent and a test's, or several on one machine) needs the same ones, and
// the kernel holds one copy. So each instance records its claim in its run
// directory, and the last one to go removes them. It is apart from the
// datapath so that `shunt uninstall` can release an instance whose agent
// crashed without linking the datapath (internal/teardown).
package steerroute

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/instance"
)

// Routing is the rule's mark, the routing table of the local route, and
// the rule's priority.
type Routing struct {
	Mark     uint32 `json:"mark"`
	Table    int    `json:"table"`
	Priority int    `json:"priority"`
}

// Protocol marks the rule and the route as shunt's in `ip rule` and `ip
// route` (proto 83, 0x53); the datapath marks its tunnel routes with it
// too (scripts/leftovers.sh looks for it).
const Protocol = 0x53

// claim is what an instance records: which namespace it installed the
// routing in, and which routing.
type claim struct {
	Netns string `json:"netns"`
	Routing
}

const claimFile = "proxy-steer-routing.json"

func claimPath(inst instance.Instance) string { return filepath.Join(inst.RunDir(), claimFile) }

// Claim records that inst needs r in the calling thread's network
// namespace and installs it there (again, if something removed it).
func Claim(inst instance.Instance, r Routing) error {
	return locked(inst, func() error {
		here, err := currentNetns()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(inst.RunDir(), 0o755); err != nil {
			return fmt.Errorf("proxy steering routing: %w", err)
		}
		data, err := json.Marshal(claim{Netns: here, Routing: r})
		if err != nil {
			return err
		}
		if err := atomicfile.Write(claimPath(inst), data); err != nil {
			return fmt.Errorf("proxy steering routing: recording the claim of %s: %w", inst.Name, err)
		}
		return install(r)
	})
}

// Release drops inst's claim and, when no other instance claims the same
// routing in the same namespace, removes the rule and the route. The
// routing is removed only from the calling thread's namespace: a claim
// made in another (a lab node's, gone with its lab) is only dropped. A
// second call, or one for an instance that never claimed, is a no-op.
func Release(inst instance.Instance) error {
	return locked(inst, func() error {
		own, err := readClaim(claimPath(inst))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			// Unreadable: the routing stays (another instance may need
			// it); the claim goes, so the next release is not stuck.
			return errors.Join(err, os.Remove(claimPath(inst)))
		}
		here, err := currentNetns()
		if err != nil {
			return err
		}
		var errs []error
		if own.Netns == here {
			shared, err := claimedByOthers(inst, own)
			switch {
			case err != nil:
				errs = append(errs, err)
			case !shared:
				errs = append(errs, remove(own.Routing))
			}
		}
		if err := os.Remove(claimPath(inst)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
}

// DriftName is how drift checks name the routing (reports, metrics).
const DriftName = "proxy-steer-routing"

// Check says which of r's rule and route the calling thread's namespace
// lacks, as `ip rule`/`ip route` would add them; with repair it claims r
// again for inst, which installs what is missing. Something outside shunt
// can remove them (a network manager that owns the machine's rules, as
// systemd-networkd does with ManageForeignRoutingPolicyRules=yes, its
// default; an admin's `ip rule flush`): steered packets would then be
// forwarded to the pod instead of reaching the proxy, its HTTP rules
// skipped.
func Check(inst instance.Instance, r Routing, repair bool) ([]string, error) {
	var missing []string
	present, err := rulePresent(r)
	if err != nil {
		return nil, err
	}
	if !present {
		missing = append(missing, fmt.Sprintf("rule fwmark %#x lookup %d pref %d", r.Mark, r.Table, r.Priority))
	}
	if present, err = routePresent(r); err != nil {
		return nil, err
	}
	if !present {
		missing = append(missing, fmt.Sprintf("route local 0.0.0.0/0 dev lo table %d", r.Table))
	}
	if repair && len(missing) > 0 {
		return missing, Claim(inst, r)
	}
	return missing, nil
}

func routePresent(r Routing) (bool, error) {
	want, err := r.route()
	if err != nil {
		return false, err
	}
	routes, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: r.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return false, fmt.Errorf("proxy steering: listing the routes of table %d: %w", r.Table, err)
	}
	for _, x := range routes {
		if x.Type == unix.RTN_LOCAL && x.LinkIndex == want.LinkIndex && (x.Dst == nil || x.Dst.String() == "0.0.0.0/0") {
			return true, nil
		}
	}
	return false, nil
}

// claimedByOthers says whether another instance's claim names the same
// routing in the same namespace.
func claimedByOthers(inst instance.Instance, own claim) (bool, error) {
	paths, err := filepath.Glob(filepath.Join(filepath.Dir(inst.RunDir()), "*", claimFile))
	if err != nil {
		return false, err
	}
	for _, p := range paths {
		if p == claimPath(inst) {
			continue
		}
		c, err := readClaim(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("proxy steering routing: another instance's claim: %w (the routing stays)", err)
		}
		if c == own {
			return true, nil
		}
	}
	return false, nil
}

func readClaim(path string) (claim, error) {
	var c claim
	data, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("proxy steering routing: claim %s: %w", path, err)
	}
	return c, nil
}

// locked runs fn holding the lock of the directory that holds every
// instance's run directory, so that one instance's release cannot remove
// the routing between another's claim and its install (a directory takes
// flock as a file does, and leaves no lock file behind).
func locked(inst instance.Instance, fn func() error) error {
	root := filepath.Dir(inst.RunDir())
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("proxy steering routing: %w", err)
	}
	dir, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("proxy steering routing: %w", err)
	}
	defer dir.Close() // closing releases the lock
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("proxy steering routing: locking %s: %w", root, err)
	}
	return fn()
}

// currentNetns names the calling thread's network namespace (device and
// inode of its nsfs file), which tells namespaces apart while they exist.
func currentNetns() (string, error) {
	h, err := netns.Get()
	if err != nil {
		return "", fmt.Errorf("proxy steering routing: this thread's network namespace: %w", err)
	}
	defer h.Close()
	return h.UniqueId(), nil
}

func (r Routing) rule() *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = unix.AF_INET
	rule.Mark = r.Mark
	mask := uint32(0xffffffff)
	rule.Mask = &mask
	rule.Table = r.Table
	rule.Priority = r.Priority
	return rule
}

func (r Routing) route() (*netlink.Route, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("proxy steering routing: the loopback device: %w", err)
	}
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	return &netlink.Route{
		LinkIndex: lo.Attrs().Index, Dst: all, Table: r.Table, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		Protocol: Protocol,
	}, nil
}

func install(r Routing) error {
	route, err := r.route()
	if err != nil {
		return err
	}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("proxy steering: local route in table %d (`ip route replace local 0.0.0.0/0 dev lo table %d`): %w", r.Table, r.Table, err)
	}
	present, err := rulePresent(r)
	if err != nil || present {
		return err
	}
	rule := r.rule()
	rule.Protocol = Protocol
	if err := netlink.RuleAdd(rule); err != nil {
		return fmt.Errorf("proxy steering: routing rule (`ip rule add fwmark %#x lookup %d pref %d`): %w", r.Mark, r.Table, r.Priority, err)
	}
	return nil
}

func rulePresent(r Routing) (bool, error) {
	rules, err := netlink.RuleList(unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("proxy steering: listing routing rules: %w", err)
	}
	for _, x := range rules {
		if x.Mark == r.Mark && x.Table == r.Table && x.Priority == r.Priority {
			return true, nil
		}
	}
	return false, nil
}

// remove deletes the rule and the route; either already gone (ENOENT,
// ESRCH) is fine. The rule is matched without its protocol, so an older
// agent's (made before rules carried one) goes too.
func remove(r Routing) error {
	var errs []error
	if err := netlink.RuleDel(r.rule()); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("proxy steering: removing the routing rule (`ip rule del fwmark %#x lookup %d pref %d`): %w", r.Mark, r.Table, r.Priority, err))
	}
	route, err := r.route()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := netlink.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("proxy steering: removing the local route (`ip route del local 0.0.0.0/0 dev lo table %d`): %w", r.Table, err))
	}
	return errors.Join(errs...)
}
