package lbipam

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var pool = netip.MustParsePrefix("192.0.2.0/29") // hands out .1-.6

type svcOpt func(*corev1.Service)

func lb(name string, age int, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1000+int64(age), 0))},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withIngress(ip string) svcOpt {
	return func(s *corev1.Service) { s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}} }
}
func asking(ip string) svcOpt { return func(s *corev1.Service) { s.Spec.LoadBalancerIP = ip } }
func externalIP(ip string) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, ip) }
}
func ofType(t corev1.ServiceType) svcOpt { return func(s *corev1.Service) { s.Spec.Type = t } }
func ofClass(c string) svcOpt            { return func(s *corev1.Service) { s.Spec.LoadBalancerClass = &c } }

func decisions(t *testing.T, services ...*corev1.Service) map[string]Decision {
	t.Helper()
	out := map[string]Decision{}
	for _, d := range Plan(services, pool) {
		if _, dup := out[d.Name]; dup {
			t.Fatalf("two decisions for %s", d.Name)
		}
		out[d.Name] = d
	}
	return out
}

// TestPlanAssignsFreeAddressesOldestFirst: pending LoadBalancers get the
// pool's free addresses (not the network's, not the broadcast), oldest
// Service first; addresses held by a status or an externalIP are skipped;
// one already assigned is left alone.
func TestPlanAssignsFreeAddressesOldestFirst(t *testing.T) {
	got := decisions(t,
		lb("newer", 3), lb("older", 1),
		lb("held", 0, withIngress("192.0.2.1")),
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ext"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ExternalIPs: []string{"192.0.2.2"}}},
	)
	if len(got) != 2 {
		t.Fatalf("decisions %+v: want one for each pending Service", got)
	}
	if a := got["older"].Assign; a != netip.MustParseAddr("192.0.2.3") {
		t.Errorf("older got %v, want 192.0.2.3 (.1 held by a status, .2 an externalIP)", a)
	}
	if a := got["newer"].Assign; a != netip.MustParseAddr("192.0.2.4") {
		t.Errorf("newer got %v, want 192.0.2.4", a)
	}
}

// TestPlanHonoursLoadBalancerIP: spec.loadBalancerIP is given when in the
// pool and free, refused with the field otherwise; the free scan does not
// hand it to another Service first.
func TestPlanHonoursLoadBalancerIP(t *testing.T) {
	got := decisions(t,
		lb("first", 0),
		lb("asks-5", 1, asking("192.0.2.5")),
		lb("asks-out", 2, asking("198.51.100.7")),
		lb("asks-taken", 3, asking("192.0.2.6"), externalIP("192.0.2.9")),
		lb("holds-6", -1, withIngress("192.0.2.6")),
	)
	if a := got["asks-5"].Assign; a != netip.MustParseAddr("192.0.2.5") {
		t.Errorf("asks-5 got %+v", got["asks-5"])
	}
	if a := got["first"].Assign; a != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("first got %+v, want 192.0.2.1", got["first"])
	}
	for name, want := range map[string]string{"asks-out": "spec.loadBalancerIP: 198.51.100.7 is not in the load balancer pool 192.0.2.0/29",
		"asks-taken": "spec.loadBalancerIP: 192.0.2.6 is already taken by Service default/holds-6"} {
		if d := got[name]; d.Assign.IsValid() || d.Problem != want {
			t.Errorf("%s: %+v, want the problem %q", name, d, want)
		}
	}
}

// TestPlanFullPoolAndRelease: a full pool refuses the newest Service with
// a problem; a Service that stopped being a LoadBalancer, or named another
// controller's class, gives the pool's address back, and another class's
// pending Service is not served.
func TestPlanFullPoolAndRelease(t *testing.T) {
	var services []*corev1.Service
	for i := range 7 {
		services = append(services, lb(string(rune('a'+i)), i))
	}
	services = append(services,
		lb("was-lb", 10, ofType(corev1.ServiceTypeClusterIP), withIngress("192.0.2.200")), // outside the pool: not ours
		lb("now-nodeport", 11, ofType(corev1.ServiceTypeNodePort), withIngress("192.0.2.4")),
		lb("classed", 12, ofClass("example.com/other")),
	)
	got := decisions(t, services...)
	if d := got["g"]; d.Assign.IsValid() || !strings.Contains(d.Problem, "no free address left") {
		t.Errorf("the seventh Service in a pool of six: %+v", d)
	}
	if _, ok := got["was-lb"]; ok {
		t.Errorf("an address outside the pool is another controller's: %+v", got["was-lb"])
	}
	if !got["now-nodeport"].Release {
		t.Errorf("now-nodeport keeps 192.0.2.4 of the pool: %+v", got["now-nodeport"])
	}
	if _, ok := got["classed"]; ok {
		t.Errorf("a Service of another loadBalancerClass was served: %+v", got["classed"])
	}
	// .4 is still held until released: a-f get .1-.3 and .5-.6 and one
	// is left without.
	assigned := 0
	for _, d := range got {
		if d.Assign == netip.MustParseAddr("192.0.2.4") {
			t.Errorf("%s got 192.0.2.4, still held by now-nodeport", d.Name)
		}
		if d.Assign.IsValid() {
			assigned++
		}
	}
	if assigned != 5 {
		t.Errorf("%d addresses assigned, want 5 (six in the pool, one still held)", assigned)
	}
}

func TestHostRange(t *testing.T) {
	for prefix, want := range map[string][2]string{
		"192.0.2.0/29": {"192.0.2.1", "192.0.2.6"},
		"192.0.2.4/31": {"192.0.2.4", "192.0.2.5"},
		"192.0.2.9/32": {"192.0.2.9", "192.0.2.9"},
		"10.1.2.77/24": {"10.1.2.1", "10.1.2.254"},
	} {
		first, last := HostRange(netip.MustParsePrefix(prefix))
		if first.String() != want[0] || last.String() != want[1] {
			t.Errorf("%s: %v-%v, want %s-%s", prefix, first, last, want[0], want[1])
		}
	}
	if err := CheckPool(netip.MustParsePrefix("2001:db8::/64")); err == nil {
		t.Error("an IPv6 pool was accepted")
	}
	for _, bad := range []string{"nope", "2001:db8::/64", "192.0.2.1"} {
		if _, err := ParsePool("--lb-pool", bad); err == nil || !strings.Contains(err.Error(), `--lb-pool "`+bad+`": give an IPv4 CIDR`) {
			t.Errorf("ParsePool(%q): %v; want a refusal naming the flag and value", bad, err)
		}
	}
	if p, err := ParsePool("--lb-pool", "192.0.2.0/29"); err != nil || p != pool {
		t.Errorf("ParsePool(192.0.2.0/29) = %v, %v", p, err)
	}
}
