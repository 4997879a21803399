package e2e

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/tcfilter"
)

// shuntTCFilter is one of shunt's cls_bpf filters as a test finds it.
type shuntTCFilter struct {
	ifname, dir, name string
	handle            uint32
	progID            int
	progName          string
}

// tcFilters lists every filter at shunt's tc priority on every interface
// of the network namespace, with the name of the program each runs, and
// counts the tcx programs on those interfaces (a node in the tc fallback
// must have none of shunt's).
func tcFilters(t *testing.T, netns string) (filters []shuntTCFilter, tcxPrograms int) {
	t.Helper()
	err := netnsrun.Do("/run/netns/"+netns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			for _, dir := range []tcfilter.Direction{tcfilter.Ingress, tcfilter.Egress} {
				fs, err := tcfilter.Filters(l.Attrs().Index, dir)
				if err != nil {
					return err
				}
				for _, f := range fs {
					b, ok := f.(*netlink.BpfFilter)
					if !ok || b.Priority != tcfilter.Priority {
						continue
					}
					sf := shuntTCFilter{ifname: l.Attrs().Name, dir: dir.String(), name: b.Name, handle: b.Handle, progID: b.Id}
					if p, err := ebpf.NewProgramFromID(ebpf.ProgramID(b.Id)); err == nil {
						if info, err := p.Info(); err == nil {
							sf.progName = info.Name
						}
						p.Close()
					}
					filters = append(filters, sf)
				}
			}
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				if r, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at}); err == nil {
					tcxPrograms += len(r.Programs)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return filters, tcxPrograms
}

// TestKernelFallbackTC: a node whose agent takes the tc fallback
// (SHUNT_KERNEL_FALLBACKS=tc, which `lab up` hands the agent) says so in
// status and attaches every tc program as a cls_bpf filter (pod veths and
// the masquerade's uplink), no tcx link; pod to pod, pod to service, pod
// to a host outside the cluster (masqueraded) and a NetworkPolicy's drop
// work through them; a restarted agent replaces its filters in place
// (new programs, never two filters) and traffic goes on; lab down leaves no
// shunt filter on any interface.
func TestKernelFallbackTC(t *testing.T) {
	t.Setenv("SHUNT_KERNEL_FALLBACKS", "tc")
	const node, outside = "192.168.77.1", "192.168.77.100"
	ns := newNodeNetns(t, node, 1500)
	peers := outsideHost(t, ns, outside, 7000)
	l := newLabIn(t, ns, []string{"--masquerade", "--underlay-addr", node}, servicesManifest, "testdata/other-pod.yaml")
	inst, _ := instance.New(l.instance)
	owner := tcfilter.OwnerOf(inst.PinDir())

	var st struct {
		Features []string
		Kernel   struct{ Fallbacks, Forced []string }
		Hooks    map[string]int
	}
	if err := json.Unmarshal([]byte(l.mustShunt("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(st.Kernel.Fallbacks, "tc") || !slices.Contains(st.Kernel.Forced, "tc") || !slices.Contains(st.Features, "tc clsact + cls_bpf") {
		t.Errorf("status: kernel %+v, features %v; want the tc fallback taken (forced) and tc clsact + cls_bpf", st.Kernel, st.Features)
	}
	if text := l.mustShunt("status"); !strings.Contains(text, "tcx: forced off → tc clsact") {
		t.Errorf("status lacks the tc fallback on its kernel line:\n%s", text)
	}
	pods := 4 // client, web-1, web-2, other
	want := map[string]int{"from-pod": pods, "to-pod": pods, "to-uplink": 1, "from-uplink": 1}
	for hook, n := range want {
		if st.Hooks[hook] != n {
			t.Errorf("status hooks %v: want %s %d", st.Hooks, hook, n)
		}
	}

	// Every filter at shunt's priority is this instance's and runs the
	// program of its hook; one per pod veth direction and uplink direction.
	progOf := map[string]string{"from-pod": "shunt_from_pod", "to-pod": "shunt_to_pod", "to-uplink": "shunt_to_uplink", "from-uplink": "shunt_from_uplink"}
	checkFilters := func(when string) map[string]int {
		t.Helper()
		filters, tcx := tcFilters(t, ns)
		if tcx != 0 {
			t.Errorf("%s: %d tcx programs in the node's namespace, want none in the tc fallback", when, tcx)
		}
		perHook := map[string]int{}
		ids := map[string]int{}
		for _, f := range filters {
			hook := strings.TrimSuffix(strings.TrimPrefix(f.name, "shunt:"), ":"+inst.PinDir())
			if f.handle != owner.Handle() || f.name != owner.Name(hook) || progOf[hook] == "" || f.progName == "" || !strings.HasPrefix(progOf[hook], f.progName) {
				t.Errorf("%s: filter on %s %s: handle %#x name %q program %d %q; want shunt's (handle %#x) running its hook's program",
					when, f.ifname, f.dir, f.handle, f.name, f.progID, f.progName, owner.Handle())
			}
			perHook[hook]++
			ids[f.ifname+"/"+f.dir] = f.progID
		}
		for hook, n := range want {
			if perHook[hook] != n {
				t.Errorf("%s: %d %s filters, want %d (all: %+v)", when, perHook[hook], hook, n, filters)
			}
		}
		return ids
	}
	before := checkFilters("after lab up")

	web, web1 := l.clusterIP("web"), l.podIP("web-1")
	traffic := func(when string) {
		t.Helper()
		fwd := l.status().forwarded()
		l.probe("client", "connected", "--tcp", web1+":8080")              // pod to pod
		l.probe("client", "connected", "--count", "4", "--tcp", web+":80") // pod to service
		l.probe("other", "connected", "--tcp", outside+":7000")            // masqueraded
		onlyFrom(t, peers, node)
		if l.status().forwarded() == fwd {
			t.Errorf("%s: the forwarded counter did not move: the traffic did not go through shunt's filters", when)
		}
	}
	traffic("after lab up")

	// A policy's drop is a tc program's: the sender's from-pod judges a
	// local destination's ingress policy.
	l.apply("testdata/policy-services.yaml")
	l.probe("client", "connected", "--tcp", web+":80")
	l.probe("other", "timeout", "--tcp", web+":80", "--tcp", web1+":8080")
	var denied uint64
	for _, c := range l.status().Counters {
		if strings.HasPrefix(c.Reason, "policy-") && (c.Direction == "from-pod" || c.Direction == "to-pod") {
			denied += c.Packets
		}
	}
	if denied == 0 {
		t.Errorf("no policy drop counted by the tc programs: %+v", l.status().Counters)
	}
	l.delete("testdata/policy-services.yaml")

	// A restart: the filters stay while no agent runs, the new agent
	// replaces their programs in place.
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	l.probe("client", "connected", "--tcp", web1+":8080")
	l.mustShunt("lab", "up")
	after := checkFilters("after a restart")
	for at, id := range before {
		if after[at] == id {
			t.Errorf("after a restart: the filter on %s still runs program %d, the old agent's", at, id)
		}
	}
	traffic("after a restart")

	l.mustShunt("lab", "down")
	if filters, _ := tcFilters(t, ns); len(filters) != 0 {
		t.Errorf("after lab down: filters at shunt's priority left: %+v", filters)
	}
	err := netnsrun.Do("/run/netns/"+ns, func() error {
		ul, err := netlink.LinkByName("ul0")
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(ul)
		for _, q := range qs {
			if q.Type() == "clsact" {
				t.Errorf("after lab down: the uplink keeps the clsact qdisc shunt added")
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
