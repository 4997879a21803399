package manifest

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/meshroute"
	"github.com/shuntnet/shunt/internal/parallel"

	"github.com/shuntnet/shunt/internal/capability"
)

// maxClientIPTimeout is the API server's limit on
// sessionAffinityConfig.clientIP.timeoutSeconds (one day).
const maxClientIPTimeout = 86400

// Validate checks each object and the set as a whole (no two objects with
// the same Key). It reports every problem it finds, as a *Errors, rather
// than stopping at the first. Objects should have been defaulted (Parse does
// that); omitted protocols are accepted as the TCP they default to.
func Validate(objs []Object) error {
	// Objects are checked on every CPU, each into its own list, and the
	// lists joined in order: the report does not depend on scheduling.
	per := make([]Errors, len(objs))
	parallel.For(len(objs), func(i int) {
		o := objs[i]
		c := &checker{source: o.Source, object: o.label(), errs: &per[i]}
		info, ok := kindByType[reflect.TypeOf(o.Obj)]
		if !ok {
			c.errorf("", "unsupported object type %T: supported kinds are %s", o.Obj, supportedKinds())
			return
		}
		checkMeta(c, info, o.Obj.(metav1.Object))
		info.check(c, o.Obj)
	})
	var errs Errors
	seen := make(map[Key]string, len(objs)) // Key -> Source of its first definition
	for i, o := range objs {
		if _, ok := kindByType[reflect.TypeOf(o.Obj)]; ok {
			if first, dup := seen[o.Key()]; dup {
				errs.add(o.Source, o.label(), "metadata.name", "duplicate: %s is also defined in %s", o.label(), first)
			} else {
				seen[o.Key()] = o.Source
			}
		}
		errs.List = append(errs.List, per[i].List...)
	}
	return errs.orNil()
}

// CheckReferences checks what a delete needs of each object, and nothing
// more: a supported kind, a valid name, a valid namespace for namespaced
// kinds and none for cluster-scoped ones, no object named twice. Objects
// from DecodeReferences (apiVersion, kind and metadata only) pass when
// those are right; Validate would refuse them for what their spec lacks.
// Problems are reported like Validate's, as a *Errors naming file#doc,
// object and field.
func CheckReferences(objs []Object) error {
	var errs Errors
	seen := make(map[Key]string, len(objs)) // Key -> Source of its first mention
	for _, o := range objs {
		c := &checker{source: o.Source, object: o.label(), errs: &errs}
		info, ok := kindByType[reflect.TypeOf(o.Obj)]
		if !ok {
			c.errorf("", "unsupported object type %T: supported kinds are %s", o.Obj, supportedKinds())
			continue
		}
		if first, dup := seen[o.Key()]; dup {
			c.errorf("metadata.name", "duplicate: %s is also named in %s", o.label(), first)
		} else {
			seen[o.Key()] = o.Source
		}
		checkReference(c, info, o.Obj.(metav1.Object))
	}
	return errs.orNil()
}

// checker collects the problems of one object.
type checker struct {
	source, object string
	errs           *Errors
}

func (c *checker) errorf(field path, format string, args ...any) {
	c.errs.add(c.source, c.object, string(field), format, args...)
}

// all reports the messages of a k8s.io/apimachinery validation helper.
func (c *checker) all(field path, msgs []string) {
	for _, m := range msgs {
		c.errorf(field, "%s", m)
	}
}

// path is a JSON field path such as spec.containers[0].name.
type path string

func (p path) child(name string) path {
	if p == "" {
		return path(name)
	}
	return p + "." + path(name)
}

func (p path) index(i int) path { return p + path("["+strconv.Itoa(i)+"]") }

func (p path) key(k string) path { return p + path("["+k+"]") }

// ---- metadata ----

func checkMeta(c *checker, info *kindInfo, m metav1.Object) {
	checkReference(c, info, m)
	checkLabels(c, "metadata.labels", m.GetLabels())
}

// checkReference checks the metadata that names an object: its name and
// its namespace.
func checkReference(c *checker, info *kindInfo, m metav1.Object) {
	if m.GetName() == "" {
		c.errorf("metadata.name", "required")
	} else {
		c.all("metadata.name", info.nameRule(m.GetName()))
	}
	switch ns := m.GetNamespace(); {
	case !info.namespaced && ns != "":
		c.errorf("metadata.namespace", "must be empty: %s is cluster-scoped", info.kind)
	case info.namespaced && ns == "":
		c.errorf("metadata.namespace", "required")
	case ns != "":
		c.all("metadata.namespace", validation.IsDNS1123Label(ns))
	}
}

// checkLabels checks label keys and values (also used for selector maps).
func checkLabels(c *checker, field path, labels map[string]string) {
	for _, k := range sortedKeys(labels) { // sorted: stable error order
		c.all(field.key(k), validation.IsQualifiedName(k))
		c.all(field.key(k), validation.IsValidLabelValue(labels[k]))
	}
}

func checkSelector(c *checker, field path, sel *metav1.LabelSelector) {
	if sel == nil {
		return
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		c.errorf(field, "%v", err)
	}
}

// ---- ports, protocols, addresses: shared by the kinds ----

// protocols are the values of the protocol fields; "" is what TCP defaults from.
var protocols = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}

func checkProtocol(c *checker, field path, p corev1.Protocol) {
	if p != "" && !slices.Contains(protocols, p) {
		c.errorf(field, "unsupported protocol %q: use TCP, UDP or SCTP", p)
	}
}

func checkPortNumber(c *checker, field path, port int32) {
	if port < 1 || port > 65535 {
		c.errorf(field, "%d is out of range 1-65535", port)
	}
}

// checkPortRef checks a port given as a number or as a container port name.
func checkPortRef(c *checker, field path, p intstr.IntOrString) {
	if p.Type == intstr.String {
		c.all(field, validation.IsValidPortName(p.StrVal))
		return
	}
	checkPortNumber(c, field, p.IntVal)
}

// checkPortName checks an optional port name and that it is unique among
// names (which maps each name to the field that used it first).
func checkPortName(c *checker, field path, name string, rule func(string) []string, names map[string]path) {
	if name == "" {
		return
	}
	c.all(field, rule(name))
	if first, dup := names[name]; dup {
		c.errorf(field, "duplicate port name %q (also %s)", name, first)
		return
	}
	names[name] = field
}

// checkNode checks what shunt reads of a Node: the pod CIDR its pods take
// addresses from and the addresses other nodes reach it at (the tunnel
// endpoint of its pods). Both are optional in the API (a node waits for
// the controller-manager's pod CIDR); what is there must be usable.
func checkNode(c *checker, n *corev1.Node) {
	spec := path("spec")
	if n.Spec.PodCIDR != "" {
		checkPodCIDR(c, spec.child("podCIDR"), n.Spec.PodCIDR)
	}
	for i, cidr := range n.Spec.PodCIDRs {
		checkPodCIDR(c, spec.child("podCIDRs").index(i), cidr)
	}
	if len(n.Spec.PodCIDRs) > 0 && n.Spec.PodCIDR != "" && n.Spec.PodCIDRs[0] != n.Spec.PodCIDR {
		c.errorf(spec.child("podCIDRs").index(0), "%q must equal spec.podCIDR %q", n.Spec.PodCIDRs[0], n.Spec.PodCIDR)
	}
	for i, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if _, ok := parseIP(a.Address); !ok {
			c.errorf(path("status").child("addresses").index(i).child("address"), "%q is not a valid IP address", a.Address)
		}
	}
}

func checkPodCIDR(c *checker, field path, cidr string) {
	prefix, err := netip.ParsePrefix(cidr)
	switch {
	case err != nil:
		c.errorf(field, "%q is not a CIDR (e.g. 10.244.1.0/24)", cidr)
	case prefix.Masked() != prefix:
		c.errorf(field, "%q has host bits set: use %q", cidr, prefix.Masked().String())
	}
}

// parseIP parses an address the way the API server's strict validation
// does: no zones, no IPv4-mapped IPv6, no leading zeros.
func parseIP(s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(s)
	return ip, err == nil && ip.Zone() == "" && !ip.Is4In6()
}

// checkCIDR checks a CIDR and its exceptions, which must lie strictly
// inside it.
func checkCIDR(c *checker, cidrField path, cidr string, exceptField path, except []string) {
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		c.errorf(cidrField, "%q is not a CIDR (e.g. 10.0.0.0/8 or fd00::/64)", cidr)
		return
	}
	if prefix.Masked() != prefix {
		// 10.0.0.1/8 is most likely a typo; say what it means.
		c.errorf(cidrField, "%q has host bits set: use %q", cidr, prefix.Masked().String())
	}
	for i, e := range except {
		ep, err := netip.ParsePrefix(e)
		if err != nil || ep.Addr().Is4() != prefix.Addr().Is4() || ep.Bits() <= prefix.Bits() || !prefix.Contains(ep.Addr()) {
			c.errorf(exceptField.index(i), "%q must be a CIDR strictly inside %s", e, cidr)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ---- Pod ----

func checkPod(c *checker, pod *corev1.Pod) {
	spec := path("spec")
	if len(pod.Spec.Containers) == 0 {
		c.errorf(spec.child("containers"), "at least one container is required")
	}
	names := map[string]bool{}
	portNames := map[string]path{} // container port names are unique across the pod
	for i, ctr := range pod.Spec.Containers {
		f := spec.child("containers").index(i)
		switch {
		case ctr.Name == "":
			c.errorf(f.child("name"), "required")
		case names[ctr.Name]:
			c.errorf(f.child("name"), "duplicate container name %q", ctr.Name)
		default:
			c.all(f.child("name"), validation.IsDNS1123Label(ctr.Name))
		}
		names[ctr.Name] = true
		if len(ctr.Command) == 0 {
			c.errorf(f.child("command"), "must not be empty: the lab runs command + args as the container's process (the image is not run)")
		}
		for j, port := range ctr.Ports {
			pf := f.child("ports").index(j)
			checkPortNumber(c, pf.child("containerPort"), port.ContainerPort)
			checkProtocol(c, pf.child("protocol"), port.Protocol)
			checkPortName(c, pf.child("name"), port.Name, validation.IsValidPortName, portNames)
			if port.HostPort != 0 {
				checkPortNumber(c, pf.child("hostPort"), port.HostPort)
			}
			if port.HostIP != "" {
				if _, ok := parseIP(port.HostIP); !ok {
					c.errorf(pf.child("hostIP"), "%q is not a valid IPv4 or IPv6 address", port.HostIP)
				} else if port.HostPort == 0 {
					c.errorf(pf.child("hostIP"), "may only be set with a hostPort")
				}
			}
		}
		if sc := ctr.SecurityContext; sc != nil && sc.Capabilities != nil {
			sf := f.child("securityContext").child("capabilities")
			for j, a := range sc.Capabilities.Add {
				if strings.EqualFold(string(a), "ALL") {
					continue // every capability, as privileged
				}
				if err := capability.Check([]string{string(a)}); err != nil {
					c.errorf(sf.child("add").index(j), "%v", err)
				}
			}
			for j, d := range sc.Capabilities.Drop {
				if err := capability.Check([]string{string(d)}); err != nil {
					c.errorf(sf.child("drop").index(j), "%v", err)
				}
			}
		}
	}
}

// ---- Service ----

func checkService(c *checker, svc *corev1.Service) {
	spec := path("spec")
	headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
	checkServiceType(c, svc, headless)
	if ip := svc.Spec.ClusterIP; ip != "" && !headless {
		if _, ok := parseIP(ip); !ok {
			c.errorf(spec.child("clusterIP"), "%q is not a valid IPv4 or IPv6 address (or None)", ip)
		}
	}
	for i, ip := range svc.Spec.ClusterIPs {
		if _, ok := parseIP(ip); !ok && ip != corev1.ClusterIPNone {
			c.errorf(spec.child("clusterIPs").index(i), "%q is not a valid IPv4 or IPv6 address (or None)", ip)
		}
	}
	if len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIPs[0] != svc.Spec.ClusterIP {
		c.errorf(spec.child("clusterIPs").index(0), "%q must match clusterIP %q", svc.Spec.ClusterIPs[0], svc.Spec.ClusterIP)
	}
	checkLabels(c, spec.child("selector"), svc.Spec.Selector)
	// An API server takes any annotation; the agent then names a value it
	// does not know as a problem of the Service. The lab refuses it.
	if _, err := dpinfo.ParseForwardingMode(svc.Annotations[dpinfo.ForwardingModeAnnotation]); err != nil {
		c.errorf(path("metadata.annotations").key(dpinfo.ForwardingModeAnnotation), "%v", err)
	}

	if len(svc.Spec.Ports) == 0 && !headless {
		c.errorf(spec.child("ports"), "at least one port is required (only a headless Service, clusterIP: None, may have none)")
	}
	names := map[string]path{}
	seen := map[portProto]bool{}
	nodePorts := map[portProto]bool{}
	for i, p := range svc.Spec.Ports {
		f := spec.child("ports").index(i)
		if p.Name == "" && len(svc.Spec.Ports) > 1 {
			c.errorf(f.child("name"), "required when the Service has more than one port")
		}
		checkPortName(c, f.child("name"), p.Name, validation.IsDNS1123Label, names)
		checkPortNumber(c, f.child("port"), p.Port)
		checkProtocol(c, f.child("protocol"), p.Protocol)
		if pp := (portProto{p.Port, p.Protocol}); seen[pp] {
			c.errorf(f, "duplicate port %d/%s", p.Port, p.Protocol)
		} else {
			seen[pp] = true
		}
		// A targetPort defaulted from an invalid port was reported just above.
		if p.TargetPort != intstr.FromInt32(p.Port) && p.TargetPort != intstr.FromInt32(0) {
			checkPortRef(c, f.child("targetPort"), p.TargetPort)
		}
		checkNodePort(c, svc, f.child("nodePort"), p, nodePorts)
	}

	affinity := svc.Spec.SessionAffinityConfig
	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		if affinity != nil && affinity.ClientIP != nil {
			c.errorf(spec.child("sessionAffinityConfig"), "must not be set when sessionAffinity is None")
		}
	case corev1.ServiceAffinityClientIP:
		if affinity != nil && affinity.ClientIP != nil && affinity.ClientIP.TimeoutSeconds != nil {
			if t := *affinity.ClientIP.TimeoutSeconds; t < 1 || t > maxClientIPTimeout {
				c.errorf("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is out of range 1-%d", t, maxClientIPTimeout)
			}
		}
	default:
		c.errorf(spec.child("sessionAffinity"), "%q: use None or ClientIP", svc.Spec.SessionAffinity)
	}
}

// portProto is a port number of one protocol.
type portProto struct {
	port  int32
	proto corev1.Protocol
}

// DefaultNodePortRange is the API server's --service-node-port-range
// default, the lab's nodePorts.
var DefaultNodePortRange = struct{ Min, Max int32 }{30000, 32767}

// exposesNodePorts says whether a Service's type gives it nodePorts.
func exposesNodePorts(t corev1.ServiceType) bool {
	return t == corev1.ServiceTypeNodePort || t == corev1.ServiceTypeLoadBalancer
}

// checkServiceType checks the type and the fields of outside traffic
// (externalIPs, traffic policy, health check port, load balancer IP) as
// the API server does.
func checkServiceType(c *checker, svc *corev1.Service, headless bool) {
	spec := path("spec")
	t := svc.Spec.Type
	switch t {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		c.errorf(spec.child("type"), "%q is not supported in the lab: use ClusterIP, NodePort or LoadBalancer", t)
	}
	if headless && exposesNodePorts(t) {
		c.errorf(spec.child("clusterIP"), "None may not be used with type %s: a headless Service has no frontend to expose", t)
	}
	for i, s := range svc.Spec.ExternalIPs {
		if _, ok := parseIP(s); !ok {
			c.errorf(spec.child("externalIPs").index(i), "%q is not a valid IPv4 or IPv6 address", s)
		}
	}
	switch p := svc.Spec.ExternalTrafficPolicy; p {
	case "", corev1.ServiceExternalTrafficPolicyCluster:
	case corev1.ServiceExternalTrafficPolicyLocal:
		if !exposesNodePorts(t) && len(svc.Spec.ExternalIPs) == 0 {
			c.errorf(spec.child("externalTrafficPolicy"), "Local may only be set with type NodePort or LoadBalancer, or externalIPs")
		}
	default:
		c.errorf(spec.child("externalTrafficPolicy"), "%q: use Cluster or Local", p)
	}
	if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
		switch {
		case t != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal:
			c.errorf(spec.child("healthCheckNodePort"), "may only be set with type LoadBalancer and externalTrafficPolicy Local")
		case hc < DefaultNodePortRange.Min || hc > DefaultNodePortRange.Max:
			c.errorf(spec.child("healthCheckNodePort"), "%d is outside the NodePort range %d-%d", hc, DefaultNodePortRange.Min, DefaultNodePortRange.Max)
		}
	}
	if svc.Spec.AllocateLoadBalancerNodePorts != nil && t != corev1.ServiceTypeLoadBalancer {
		c.errorf(spec.child("allocateLoadBalancerNodePorts"), "may only be set with type LoadBalancer")
	}
	if ip := svc.Spec.LoadBalancerIP; ip != "" {
		if _, ok := parseIP(ip); !ok {
			c.errorf(spec.child("loadBalancerIP"), "%q is not a valid IPv4 or IPv6 address", ip)
		} else if t != corev1.ServiceTypeLoadBalancer {
			c.errorf(spec.child("loadBalancerIP"), "may only be set with type LoadBalancer")
		}
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if _, ok := parseIP(ing.IP); ing.IP != "" && !ok {
			c.errorf(path("status.loadBalancer.ingress").index(i).child("ip"), "%q is not a valid IPv4 or IPv6 address", ing.IP)
		}
	}
}

// checkNodePort checks one port's nodePort: only with a type that has
// them, in the range, not twice for one protocol (seen).
func checkNodePort(c *checker, svc *corev1.Service, f path, p corev1.ServicePort, seen map[portProto]bool) {
	if p.NodePort == 0 {
		return
	}
	switch {
	case !exposesNodePorts(svc.Spec.Type):
		c.errorf(f, "may only be set with type NodePort or LoadBalancer, not %s", cmp.Or(svc.Spec.Type, corev1.ServiceTypeClusterIP))
	case p.NodePort < DefaultNodePortRange.Min || p.NodePort > DefaultNodePortRange.Max:
		c.errorf(f, "%d is outside the NodePort range %d-%d", p.NodePort, DefaultNodePortRange.Min, DefaultNodePortRange.Max)
	}
	k := portProto{p.NodePort, p.Protocol}
	if seen[k] {
		c.errorf(f, "duplicate nodePort %d/%s", p.NodePort, p.Protocol)
	}
	seen[k] = true
}

// ---- EndpointSlice ----

func checkEndpointSlice(c *checker, s *discoveryv1.EndpointSlice) {
	var wantV4 bool
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
		wantV4 = true
	case discoveryv1.AddressTypeIPv6:
	case discoveryv1.AddressTypeFQDN:
		c.errorf("addressType", "FQDN is not supported in the lab: use IPv4 or IPv6")
	case "":
		c.errorf("addressType", "required: IPv4 or IPv6")
	default:
		c.errorf("addressType", "%q: use IPv4 or IPv6", s.AddressType)
	}
	if s.Labels[discoveryv1.LabelServiceName] == "" {
		c.errorf(path("metadata.labels").key(discoveryv1.LabelServiceName), "required: names the Service this slice belongs to")
	}
	family := s.AddressType == discoveryv1.AddressTypeIPv4 || s.AddressType == discoveryv1.AddressTypeIPv6
	for i, ep := range s.Endpoints {
		f := path("endpoints").index(i).child("addresses")
		if len(ep.Addresses) == 0 {
			c.errorf(f, "at least one address is required")
		}
		for j, a := range ep.Addresses {
			ip, ok := parseIP(a)
			switch {
			case !ok:
				c.errorf(f.index(j), "%q is not a valid IP address", a)
			case family && ip.Is4() != wantV4:
				c.errorf(f.index(j), "%q is not an %s address", a, s.AddressType)
			}
		}
	}
	names := map[string]path{}
	for i, p := range s.Ports {
		f := path("ports").index(i)
		if p.Name != nil {
			checkPortName(c, f.child("name"), *p.Name, validation.IsDNS1123Label, names)
		}
		if p.Port != nil {
			checkPortNumber(c, f.child("port"), *p.Port)
		}
		if p.Protocol != nil {
			checkProtocol(c, f.child("protocol"), *p.Protocol)
		}
	}
}

// ---- NetworkPolicy ----

func checkNetworkPolicy(c *checker, np *networkingv1.NetworkPolicy) {
	spec := path("spec")
	checkSelector(c, spec.child("podSelector"), &np.Spec.PodSelector)
	seen := map[networkingv1.PolicyType]bool{}
	for i, t := range np.Spec.PolicyTypes {
		f := spec.child("policyTypes").index(i)
		switch {
		case t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress:
			c.errorf(f, "%q: use Ingress or Egress", t)
		case seen[t]:
			c.errorf(f, "duplicate %q", t)
		}
		seen[t] = true
	}
	for i, r := range np.Spec.Ingress {
		f := spec.child("ingress").index(i)
		checkPeers(c, f.child("from"), r.From)
		checkPolicyPorts(c, f.child("ports"), r.Ports)
	}
	for i, r := range np.Spec.Egress {
		f := spec.child("egress").index(i)
		checkPeers(c, f.child("to"), r.To)
		checkPolicyPorts(c, f.child("ports"), r.Ports)
	}
}

func checkPeers(c *checker, field path, peers []networkingv1.NetworkPolicyPeer) {
	for i, pe := range peers {
		f := field.index(i)
		checkSelector(c, f.child("podSelector"), pe.PodSelector)
		checkSelector(c, f.child("namespaceSelector"), pe.NamespaceSelector)
		selects := pe.PodSelector != nil || pe.NamespaceSelector != nil
		switch {
		case pe.IPBlock == nil && !selects:
			c.errorf(f, "must set podSelector, namespaceSelector or ipBlock")
		case pe.IPBlock != nil && selects:
			c.errorf(f.child("ipBlock"), "cannot be combined with podSelector or namespaceSelector")
		}
		if pe.IPBlock != nil {
			b := f.child("ipBlock")
			checkCIDR(c, b.child("cidr"), pe.IPBlock.CIDR, b.child("except"), pe.IPBlock.Except)
		}
	}
}

// checkPolicyPorts checks NetworkPolicyPorts (also used by ShuntNetworkPolicy).
func checkPolicyPorts(c *checker, field path, ports []networkingv1.NetworkPolicyPort) {
	for i, p := range ports {
		f := field.index(i)
		if p.Protocol != nil {
			checkProtocol(c, f.child("protocol"), *p.Protocol)
		}
		if p.Port != nil {
			checkPortRef(c, f.child("port"), *p.Port)
		}
		if p.EndPort == nil {
			continue
		}
		switch {
		case p.Port == nil || p.Port.Type != intstr.Int:
			c.errorf(f.child("endPort"), "requires a numeric port")
		case *p.EndPort < p.Port.IntVal:
			c.errorf(f.child("endPort"), "%d must not be below port %d", *p.EndPort, p.Port.IntVal)
		default:
			checkPortNumber(c, f.child("endPort"), *p.EndPort)
		}
	}
}

// ---- ShuntNetworkPolicy ----

var entities = []string{EntityHost, EntityWorld, EntityCluster, EntityAll}

func checkShuntPolicy(c *checker, p *ShuntNetworkPolicy) {
	spec := path("spec")
	checkSelector(c, spec.child("podSelector"), &p.Spec.PodSelector)
	for i, r := range p.Spec.Ingress {
		f := spec.child("ingress").index(i)
		checkShuntRule(c, f, r)
		if len(r.HTTP) > 0 {
			checkHTTPRulePorts(c, f.child("ports"), r.Ports)
		}
	}
	for i, r := range p.Spec.Egress {
		f := spec.child("egress").index(i)
		checkShuntRule(c, f, r)
		if len(r.HTTP) > 0 {
			// Connections reach the node proxy by their destination (a pod
			// port with HTTP rules), where it decides each request with the
			// server's ingress rules; nothing sends it a client's
			// connections for the client's egress rules.
			c.errorf(f.child("http"), "HTTP rules are supported on ingress only: the node proxy enforces them on the server's side; put them in an ingress rule of a policy selecting the server")
		}
	}
}

// checkHTTPRulePorts checks the ports of an ingress rule with HTTP rules:
// the proxy takes over exactly the pod ports named, so they must be listed,
// one port each (no endPort ranges), and TCP.
func checkHTTPRulePorts(c *checker, f path, ports []networkingv1.NetworkPolicyPort) {
	if len(ports) == 0 {
		c.errorf(f, "required with http: list the ports HTTP is served on (numbers or container port names): the node proxy takes over exactly those ports")
	}
	for i, p := range ports {
		pf := f.index(i)
		if p.Port == nil {
			c.errorf(pf.child("port"), "required with http: the node proxy needs an exact port (a number or a container port name)")
		}
		if p.EndPort != nil {
			c.errorf(pf.child("endPort"), "not allowed with http: the node proxy needs exact ports, not ranges (list each port)")
		}
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			c.errorf(pf.child("protocol"), "%s: http rules apply to TCP ports only", *p.Protocol)
		}
	}
}

func checkShuntRule(c *checker, f path, r ShuntRule) {
	switch r.Action {
	case "", ActionAllow, ActionDeny:
	default:
		c.errorf(f.child("action"), "%q: use allow or deny", r.Action)
	}
	for j, pe := range r.Peers {
		pf := f.child("peers").index(j)
		checkSelector(c, pf.child("podSelector"), pe.PodSelector)
		checkSelector(c, pf.child("namespaceSelector"), pe.NamespaceSelector)
		forms := 0
		if pe.PodSelector != nil || pe.NamespaceSelector != nil {
			forms++
		}
		if pe.CIDR != "" {
			forms++
			checkCIDR(c, pf.child("cidr"), pe.CIDR, pf.child("except"), pe.Except)
		} else if len(pe.Except) > 0 {
			c.errorf(pf.child("except"), "requires cidr")
		}
		if pe.Entity != "" {
			forms++
			if !slices.Contains(entities, pe.Entity) {
				c.errorf(pf.child("entity"), "%q: use host, world, cluster or all", pe.Entity)
			}
		}
		switch {
		case forms == 0:
			c.errorf(pf, "must set podSelector/namespaceSelector, cidr or entity")
		case forms > 1:
			c.errorf(pf, "set only one of podSelector/namespaceSelector, cidr and entity (use separate peers)")
		}
	}
	checkPolicyPorts(c, f.child("ports"), r.Ports)
	for j, h := range r.HTTP {
		hf := f.child("http").index(j)
		if h.Method != "" && !isToken(h.Method) {
			c.errorf(hf.child("method"), "%q is not a valid HTTP method", h.Method)
		}
		checkRegexp(c, hf.child("path"), h.Path)
		for _, name := range sortedKeys(h.Headers) {
			if !isToken(name) {
				c.errorf(hf.child("headers").key(name), "%q is not a valid HTTP header name", name)
			}
			if !isFieldValue(h.Headers[name]) {
				c.errorf(hf.child("headers").key(name), "value %q contains control characters", h.Headers[name])
			}
		}
	}
}

// checkRegexp checks a regular expression in the syntax the proxy
// matches with: Go's regexp, RE2 (no backreferences or lookaround).
func checkRegexp(c *checker, f path, expr string) {
	if _, err := regexp.Compile(expr); err != nil {
		c.errorf(f, "not a valid RE2 regular expression: %v", strings.TrimPrefix(err.Error(), "error parsing regexp: "))
	}
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2), the
// syntax of methods and header names.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		alnum := 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
		if !alnum && !slices.Contains([]byte("!#$%&'*+-.^_`|~"), b) {
			return false
		}
	}
	return true
}

// isFieldValue reports whether s can be an HTTP header value: no control
// characters other than tab.
func isFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

// ---- HTTPRoute ----

// The limits of the Gateway API's CRD schema (gateway.networking.k8s.io/v1).
const (
	maxParentRefs      = 32
	maxRouteRules      = 16
	maxRuleMatches     = 64
	maxRouteMatches    = 128 // across all rules
	maxMatchConditions = 16  // headers, query parameters
	maxBackendRefs     = 16
	maxWeight          = 1000000
	maxPathLength      = 1024
	maxHeaderValue     = 4096
	maxQueryValue      = 1024
)

// gammaOnly is why a parent other than a Service is refused.
const gammaOnly = `shunt supports the GAMMA mesh pattern: parentRefs must name a Service: set group: "" and kind: Service`

// filtersImplemented names the filters shunt's proxy applies; others are
// refused: silently ignoring one (a mirror, CORS) would serve requests
// other than the route says.
const filtersImplemented = "shunt's proxy implements RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite and RequestMirror"

// maxHeaderModifications is the CRD's limit on each of set, add and remove.
const maxHeaderModifications = 16

var (
	// gatewayDuration is a Gateway API duration (GEP-2257): "1h", "10s",
	// "1m30s500ms"; no fractions, no other units.
	gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)
	// pathChars are the characters an Exact or PathPrefix value may hold.
	pathChars = regexp.MustCompile(`^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$`)
)

var httpMethods = []gatewayv1.HTTPMethod{
	gatewayv1.HTTPMethodGet, gatewayv1.HTTPMethodHead, gatewayv1.HTTPMethodPost, gatewayv1.HTTPMethodPut, gatewayv1.HTTPMethodDelete,
	gatewayv1.HTTPMethodConnect, gatewayv1.HTTPMethodOptions, gatewayv1.HTTPMethodTrace, gatewayv1.HTTPMethodPatch,
}

// checkHTTPRoute checks an HTTPRoute as the Gateway API's CRD schema does,
// and refuses what shunt does not implement rather than ignore it: parents
// other than Services of the route's namespace, filters other than header
// modifiers, redirects and rewrites, hostnames, session persistence,
// backends other than Services of the namespace.
func checkHTTPRoute(c *checker, r *gatewayv1.HTTPRoute) {
	spec := path("spec")
	checkParentRefs(c, spec.child("parentRefs"), r.Namespace, r.Spec.ParentRefs)
	if len(r.Spec.Hostnames) > 0 {
		c.errorf(spec.child("hostnames"), "not supported with Service parents: a route on a Service takes every request to it, whatever the Host header: remove them")
	}
	if len(r.Spec.Rules) > maxRouteRules {
		c.errorf(spec.child("rules"), "%d rules: at most %d are allowed", len(r.Spec.Rules), maxRouteRules)
	}
	matches := 0
	for i, rule := range r.Spec.Rules {
		f := spec.child("rules").index(i)
		if rule.Name != nil {
			c.all(f.child("name"), validation.IsDNS1123Subdomain(string(*rule.Name)))
		}
		if len(rule.Matches) > maxRuleMatches {
			c.errorf(f.child("matches"), "%d matches: at most %d are allowed", len(rule.Matches), maxRuleMatches)
		}
		matches += len(rule.Matches)
		for j, m := range rule.Matches {
			checkRouteMatch(c, f.child("matches").index(j), m)
		}
		checkFilters(c, f.child("filters"), rule.Filters, rule, false)
		if len(rule.BackendRefs) > 0 && slices.ContainsFunc(rule.Filters, func(x gatewayv1.HTTPRouteFilter) bool { return x.RequestRedirect != nil }) {
			c.errorf(f.child("filters"), "RequestRedirect filter must not be used together with backendRefs: the proxy answers a redirect itself")
		}
		if len(rule.BackendRefs) > maxBackendRefs {
			c.errorf(f.child("backendRefs"), "%d backendRefs: at most %d are allowed", len(rule.BackendRefs), maxBackendRefs)
		}
		for j, b := range rule.BackendRefs {
			checkBackendRef(c, f.child("backendRefs").index(j), r.Namespace, b)
			checkFilters(c, f.child("backendRefs").index(j).child("filters"), b.Filters, rule, true)
		}
		if rule.Timeouts != nil {
			checkTimeouts(c, f.child("timeouts"), rule.Timeouts)
		}
		if rule.Retry != nil {
			checkRetry(c, f.child("retry"), rule.Retry)
		}
		if rule.SessionPersistence != nil {
			c.errorf(f.child("sessionPersistence"), "not supported: shunt's proxy picks a backend for each request by weight: remove it")
		}
	}
	if matches > maxRouteMatches {
		c.errorf(spec.child("rules"), "%d matches in all: at most %d are allowed across the rules of a route", matches, maxRouteMatches)
	}
}

// The CRD's syntax of an Exact method match's service and method.
var (
	grpcServiceName = regexp.MustCompile(`^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`)
	grpcMethodName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z_0-9]*$`)
)

// checkGRPCRoute checks a GRPCRoute as the CRD does and refuses what shunt
// does not implement: its method matches here, the rest (parents,
// hostnames, header matches, filters, backendRefs, session persistence) as
// the HTTPRoute form the proxy serves (meshroute.HTTPForm), whose fields
// have the same names.
// checkReferenceGrant asks what the CRD asks: at least one from and one to,
// each from with its kind and namespace, each to with its kind.
func checkReferenceGrant(c *checker, g *gatewayv1beta1.ReferenceGrant) {
	spec := path("spec")
	if len(g.Spec.From) == 0 {
		c.errorf(spec.child("from"), "required: the kinds and namespaces of the objects that may refer to this namespace's")
	}
	for i, from := range g.Spec.From {
		if from.Kind == "" {
			c.errorf(spec.child("from").index(i).child("kind"), "required (e.g. HTTPRoute)")
		}
		if from.Namespace == "" {
			c.errorf(spec.child("from").index(i).child("namespace"), "required: the namespace of the referring objects")
		}
	}
	if len(g.Spec.To) == 0 {
		c.errorf(spec.child("to"), "required: the kinds of this namespace's objects that may be referred to")
	}
	for i, to := range g.Spec.To {
		if to.Kind == "" {
			c.errorf(spec.child("to").index(i).child("kind"), "required (e.g. Service)")
		}
	}
}

func checkGRPCRoute(c *checker, r *gatewayv1.GRPCRoute) {
	for i, rule := range r.Spec.Rules {
		for j, m := range rule.Matches {
			if m.Method != nil {
				checkMethodMatch(c, path("spec").child("rules").index(i).child("matches").index(j).child("method"), *m.Method)
			}
		}
		if rule.SessionPersistence != nil {
			c.errorf(path("spec").child("rules").index(i).child("sessionPersistence"), "not supported: shunt's proxy picks a backend for each call by weight: remove it")
		}
	}
	form := meshroute.HTTPForm(r)
	form.Spec.Hostnames = r.Spec.Hostnames
	for i := range form.Spec.Rules {
		for j := range form.Spec.Rules[i].Matches {
			form.Spec.Rules[i].Matches[j].Path = nil // the method, checked above
		}
	}
	checkHTTPRoute(c, form)
}

func checkMethodMatch(c *checker, f path, m gatewayv1.GRPCMethodMatch) {
	service, method := deref(m.Service), deref(m.Method)
	if service == "" && method == "" {
		c.errorf(f, "one or both of service and method must be given")
	}
	for _, part := range []struct {
		field, value string
		syntax       *regexp.Regexp
	}{{"service", service, grpcServiceName}, {"method", method, grpcMethodName}} {
		switch {
		case part.value == "":
		case len(part.value) > 1024:
			c.errorf(f.child(part.field), "%d characters: at most 1024 are allowed", len(part.value))
		case m.Type == nil || *m.Type == gatewayv1.GRPCMethodMatchExact:
			if !part.syntax.MatchString(part.value) {
				c.errorf(f.child(part.field), "%q: a %s must match %s", part.value, part.field, part.syntax)
			}
		case *m.Type == gatewayv1.GRPCMethodMatchRegularExpression:
			checkRegexp(c, f.child(part.field), part.value)
		}
	}
	if m.Type != nil && *m.Type != gatewayv1.GRPCMethodMatchExact && *m.Type != gatewayv1.GRPCMethodMatchRegularExpression {
		c.errorf(f.child("type"), "%q: use Exact or RegularExpression", *m.Type)
	}
}

func checkParentRefs(c *checker, f path, ns string, refs []gatewayv1.ParentReference) {
	if len(refs) == 0 {
		c.errorf(f, `required: shunt supports the GAMMA mesh pattern: name the Service whose requests the route takes, e.g. {group: "", kind: Service, name: reviews}`)
	}
	if len(refs) > maxParentRefs {
		c.errorf(f, "%d parentRefs: at most %d are allowed", len(refs), maxParentRefs)
	}
	// As the CRD: references to one Service must each set a different port.
	refsTo := map[gatewayv1.ObjectName]int{}
	for _, p := range refs {
		refsTo[p.Name]++
	}
	ports := map[string]path{} // "name:port" -> the reference that named it first
	for i, p := range refs {
		pf := f.index(i)
		switch {
		case p.Kind == nil || *p.Kind != KindService:
			c.errorf(pf.child("kind"), "%q is not supported: %s (omitted, group and kind mean a Gateway)", deref(p.Kind), gammaOnly)
		case p.Group == nil || *p.Group != "":
			c.errorf(pf.child("group"), "%q is not supported: %s (an omitted group means %s)", deref(p.Group), gammaOnly, gatewayv1.GroupName)
		}
		if p.Namespace != nil && string(*p.Namespace) != ns {
			c.errorf(pf.child("namespace"), "%q: cross-namespace parentRefs are not supported: put the route in the namespace of its Service (%s)", *p.Namespace, ns)
		}
		if p.Name == "" {
			c.errorf(pf.child("name"), "required")
		} else {
			c.all(pf.child("name"), validation.IsDNS1123Label(string(p.Name)))
		}
		if p.SectionName != nil {
			c.errorf(pf.child("sectionName"), "not supported: attach the route to one port of the Service with port")
		}
		if p.Port != nil {
			checkPortNumber(c, pf.child("port"), *p.Port)
		}
		if n := refsTo[p.Name]; n > 1 {
			if p.Port == nil {
				c.errorf(pf.child("port"), "required: %d parentRefs name Service %q, each must set a different port", n, p.Name)
				continue
			}
			key := fmt.Sprintf("%s:%d", p.Name, *p.Port)
			if first, dup := ports[key]; dup {
				c.errorf(pf.child("port"), "duplicate: %s names Service %q port %d already", first, p.Name, *p.Port)
			} else {
				ports[key] = pf
			}
		}
	}
}

func checkRouteMatch(c *checker, f path, m gatewayv1.HTTPRouteMatch) {
	if p := m.Path; p != nil && p.Value != nil {
		checkPathMatch(c, f.child("path"), cmp.Or(deref(p.Type), gatewayv1.PathMatchPathPrefix), *p.Value)
	}
	if len(m.Headers) > maxMatchConditions {
		c.errorf(f.child("headers"), "%d headers: at most %d are allowed", len(m.Headers), maxMatchConditions)
	}
	names := map[gatewayv1.HTTPHeaderName]bool{}
	for i, h := range m.Headers {
		hf := f.child("headers").index(i)
		checkMatchName(c, hf.child("name"), "header", h.Name, names)
		checkMatchValue(c, hf, gatewayv1.HeaderMatchType(deref(h.Type)), h.Value, maxHeaderValue)
	}
	if len(m.QueryParams) > maxMatchConditions {
		c.errorf(f.child("queryParams"), "%d queryParams: at most %d are allowed", len(m.QueryParams), maxMatchConditions)
	}
	names = map[gatewayv1.HTTPHeaderName]bool{}
	for i, q := range m.QueryParams {
		qf := f.child("queryParams").index(i)
		checkMatchName(c, qf.child("name"), "query parameter", q.Name, names)
		checkMatchValue(c, qf, gatewayv1.HeaderMatchType(deref(q.Type)), q.Value, maxQueryValue)
	}
	if m.Method != nil && !slices.Contains(httpMethods, *m.Method) {
		c.errorf(f.child("method"), "%q: use GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE or PATCH", *m.Method)
	}
}

// checkPathMatch checks a path match as the CRD does: Exact and PathPrefix
// values are absolute, normalized paths; a RegularExpression must compile.
func checkPathMatch(c *checker, f path, typ gatewayv1.PathMatchType, value string) {
	vf := f.child("value")
	if len(value) > maxPathLength {
		c.errorf(vf, "%d characters: at most %d are allowed", len(value), maxPathLength)
	}
	switch typ {
	case gatewayv1.PathMatchExact, gatewayv1.PathMatchPathPrefix:
		switch {
		case !strings.HasPrefix(value, "/"):
			c.errorf(vf, "%q must start with \"/\" for type %s (an absolute path)", value, typ)
		case !pathChars.MatchString(value):
			c.errorf(vf, "%q has characters a path may not hold: use %%-encoding (%%20 for a space)", value)
		}
		for _, bad := range []string{"//", "/./", "/../", "%2f", "%2F", "#"} {
			if strings.Contains(value, bad) {
				c.errorf(vf, "%q must not contain %q for type %s", value, bad, typ)
			}
		}
		for _, bad := range []string{"/..", "/."} {
			if strings.HasSuffix(value, bad) {
				c.errorf(vf, "%q must not end with %q for type %s", value, bad, typ)
			}
		}
	case gatewayv1.PathMatchRegularExpression:
		checkRegexp(c, vf, value)
	default:
		c.errorf(f.child("type"), "%q: use Exact, PathPrefix or RegularExpression", typ)
	}
}

// checkMatchName checks the name of a header or query parameter match,
// unique within its list (names maps those seen).
func checkMatchName(c *checker, f path, what string, name gatewayv1.HTTPHeaderName, names map[gatewayv1.HTTPHeaderName]bool) {
	switch {
	case name == "":
		c.errorf(f, "required")
	case !isToken(string(name)):
		c.errorf(f, "%q is not a valid %s name", name, what)
	case names[name]:
		c.errorf(f, "duplicate %s %q", what, name)
	}
	names[name] = true
}

// checkMatchValue checks the type (omitted: Exact) and value of a header or
// query parameter match; both kinds of match have the same types.
func checkMatchValue(c *checker, f path, typ gatewayv1.HeaderMatchType, value string, maxLen int) {
	vf := f.child("value")
	switch {
	case value == "":
		c.errorf(vf, "required")
	case len(value) > maxLen:
		c.errorf(vf, "%d characters: at most %d are allowed", len(value), maxLen)
	case !isFieldValue(value):
		c.errorf(vf, "%q contains control characters", value)
	}
	switch typ {
	case "", gatewayv1.HeaderMatchExact:
	case gatewayv1.HeaderMatchRegularExpression:
		checkRegexp(c, vf, value)
	default:
		c.errorf(f.child("type"), "%q: use Exact or RegularExpression", typ)
	}
}

// checkFilters checks a rule's filters (backendRef: a backendRef's) as the
// CRD does, and refuses those shunt's proxy does not apply.
func checkFilters(c *checker, f path, filters []gatewayv1.HTTPRouteFilter, rule gatewayv1.HTTPRouteRule, backendRef bool) {
	seen := map[gatewayv1.HTTPRouteFilterType]bool{}
	for i, x := range filters {
		xf := f.index(i)
		if seen[x.Type] && x.Type != gatewayv1.HTTPRouteFilterRequestMirror { // mirrors add up, as the CRD allows
			c.errorf(xf.child("type"), "%s filter cannot be repeated", x.Type)
		}
		seen[x.Type] = true
		// The field named for the type, as the CRD's rules require.
		given := map[gatewayv1.HTTPRouteFilterType]struct {
			field string
			set   bool
		}{
			gatewayv1.HTTPRouteFilterRequestHeaderModifier:  {"requestHeaderModifier", x.RequestHeaderModifier != nil},
			gatewayv1.HTTPRouteFilterResponseHeaderModifier: {"responseHeaderModifier", x.ResponseHeaderModifier != nil},
			gatewayv1.HTTPRouteFilterRequestRedirect:        {"requestRedirect", x.RequestRedirect != nil},
			gatewayv1.HTTPRouteFilterURLRewrite:             {"urlRewrite", x.URLRewrite != nil},
			gatewayv1.HTTPRouteFilterRequestMirror:          {"requestMirror", x.RequestMirror != nil},
		}
		if g, known := given[x.Type]; known && !g.set {
			c.errorf(xf.child(g.field), "required for type %s", x.Type)
			continue
		}
		switch x.Type {
		case gatewayv1.HTTPRouteFilterRequestHeaderModifier:
			checkHeaderFilter(c, xf.child("requestHeaderModifier"), x.RequestHeaderModifier)
		case gatewayv1.HTTPRouteFilterResponseHeaderModifier:
			checkHeaderFilter(c, xf.child("responseHeaderModifier"), x.ResponseHeaderModifier)
		case gatewayv1.HTTPRouteFilterRequestMirror:
			if backendRef {
				c.errorf(xf.child("type"), "%s is not supported on a backendRef: shunt's proxy applies it as a rule's filter: move it to the rule", x.Type)
				continue
			}
			checkMirror(c, xf.child("requestMirror"), x.RequestMirror)
		case gatewayv1.HTTPRouteFilterRequestRedirect, gatewayv1.HTTPRouteFilterURLRewrite:
			if backendRef {
				c.errorf(xf.child("type"), "%s is not supported on a backendRef: shunt's proxy applies it as a rule's filter: move it to the rule", x.Type)
				continue
			}
			if x.Type == gatewayv1.HTTPRouteFilterURLRewrite {
				checkHostnamePath(c, xf.child("urlRewrite"), x.URLRewrite.Hostname, x.URLRewrite.Path, rule)
				continue
			}
			rd, rf := x.RequestRedirect, xf.child("requestRedirect")
			if rd.Scheme != nil && *rd.Scheme != "http" && *rd.Scheme != "https" {
				c.errorf(rf.child("scheme"), "%q: use http or https", *rd.Scheme)
			}
			if rd.StatusCode != nil && !slices.Contains([]int{301, 302, 303, 307, 308}, *rd.StatusCode) {
				c.errorf(rf.child("statusCode"), "%d: use 301, 302, 303, 307 or 308", *rd.StatusCode)
			}
			if rd.Port != nil {
				checkPortNumber(c, rf.child("port"), *rd.Port)
			}
			checkHostnamePath(c, rf, rd.Hostname, rd.Path, rule)
		default:
			c.errorf(xf.child("type"), "%q is not supported: %s", x.Type, filtersImplemented)
		}
	}
	if seen[gatewayv1.HTTPRouteFilterRequestRedirect] && seen[gatewayv1.HTTPRouteFilterURLRewrite] {
		c.errorf(f, "may specify either a RequestRedirect or a URLRewrite filter, not both")
	}
}

// checkMirror checks a RequestMirror as the CRD does: a Service with a
// port, and at most one of percent (0-100) and fraction (numerator 0 to
// denominator, denominator above 0).
func checkMirror(c *checker, f path, m *gatewayv1.HTTPRequestMirrorFilter) {
	checkBackendRef(c, f.child("backendRef"), "", gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: m.BackendRef}})
	if m.Percent != nil && m.Fraction != nil {
		c.errorf(f, "only one of percent or fraction may be specified")
	}
	if p := m.Percent; p != nil && (*p < 0 || *p > 100) {
		c.errorf(f.child("percent"), "%d is out of range 0-100", *p)
	}
	if fr := m.Fraction; fr != nil {
		den := int32(100)
		if fr.Denominator != nil {
			den = *fr.Denominator
			if den < 1 {
				c.errorf(f.child("fraction").child("denominator"), "%d: must be at least 1", den)
			}
		}
		if fr.Numerator < 0 || fr.Numerator > den {
			c.errorf(f.child("fraction").child("numerator"), "%d is out of range 0-%d (the denominator)", fr.Numerator, den)
		}
	}
}

// checkHeaderFilter checks set, add and remove of a header modifier.
func checkHeaderFilter(c *checker, f path, h *gatewayv1.HTTPHeaderFilter) {
	for name, headers := range map[string][]gatewayv1.HTTPHeader{"set": h.Set, "add": h.Add} {
		if len(headers) > maxHeaderModifications {
			c.errorf(f.child(name), "%d headers: at most %d are allowed", len(headers), maxHeaderModifications)
		}
		names := map[string]bool{}
		for i, hd := range headers {
			hf := f.child(name).index(i)
			switch key := strings.ToLower(string(hd.Name)); {
			case hd.Name == "" || !isToken(string(hd.Name)):
				c.errorf(hf.child("name"), "%q is not a valid header name", hd.Name)
			case names[key]:
				c.errorf(hf.child("name"), "duplicate header %q", hd.Name)
			default:
				names[key] = true
			}
			if len(hd.Value) > maxHeaderValue || !isFieldValue(hd.Value) {
				c.errorf(hf.child("value"), "%q: at most %d characters, no control characters", hd.Value, maxHeaderValue)
			}
		}
	}
	if len(h.Remove) > maxHeaderModifications {
		c.errorf(f.child("remove"), "%d headers: at most %d are allowed", len(h.Remove), maxHeaderModifications)
	}
	for i, name := range h.Remove {
		if name == "" || !isToken(name) {
			c.errorf(f.child("remove").index(i), "%q is not a valid header name", name)
		}
	}
}

// checkHostnamePath checks a redirect's or rewrite's hostname and path;
// ReplacePrefixMatch needs the rule's one match to be a PathPrefix.
func checkHostnamePath(c *checker, f path, hostname *gatewayv1.PreciseHostname, p *gatewayv1.HTTPPathModifier, rule gatewayv1.HTTPRouteRule) {
	if hostname != nil {
		c.all(f.child("hostname"), validation.IsDNS1123Subdomain(string(*hostname)))
	}
	if p == nil {
		return
	}
	pf := f.child("path")
	switch {
	case p.Type == gatewayv1.FullPathHTTPPathModifier && p.ReplaceFullPath == nil:
		c.errorf(pf.child("replaceFullPath"), "required for type ReplaceFullPath")
	case p.Type == gatewayv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch == nil:
		c.errorf(pf.child("replacePrefixMatch"), "required for type ReplacePrefixMatch")
	case p.Type == gatewayv1.PrefixMatchHTTPPathModifier:
		// Defaults give a rule without matches one PathPrefix "/" match.
		if len(rule.Matches) > 1 || len(rule.Matches) == 1 && rule.Matches[0].Path != nil && deref(rule.Matches[0].Path.Type) != gatewayv1.PathMatchPathPrefix {
			c.errorf(pf.child("type"), "ReplacePrefixMatch: exactly one PathPrefix match must be specified")
		}
	case p.Type != gatewayv1.FullPathHTTPPathModifier:
		c.errorf(pf.child("type"), "%q: use ReplaceFullPath or ReplacePrefixMatch", p.Type)
	}
	for _, v := range []struct {
		field string
		value *string
	}{{"replaceFullPath", p.ReplaceFullPath}, {"replacePrefixMatch", p.ReplacePrefixMatch}} {
		switch {
		case v.value == nil:
		case len(*v.value) > maxPathLength:
			c.errorf(pf, "%d characters: at most %d are allowed", len(*v.value), maxPathLength)
		case !isFieldValue(*v.value):
			// The CRD allows them; written into a request line or a
			// Location a CR LF would split the head.
			c.errorf(pf.child(v.field), "%q contains control characters: a path may not (use %%-encoding)", *v.value)
		}
	}
}

func checkBackendRef(c *checker, f path, ns string, b gatewayv1.HTTPBackendRef) {
	// Omitted, group and kind default to a core Service.
	const coreService = `backendRefs must name a Service (group: "", kind: Service)`
	switch {
	case b.Kind != nil && *b.Kind != KindService:
		c.errorf(f.child("kind"), "%q is not supported: %s", *b.Kind, coreService)
	case b.Group != nil && *b.Group != "":
		c.errorf(f.child("group"), "%q is not supported: %s", *b.Group, coreService)
	}
	// A backendRef to another namespace is resolved only where a
	// ReferenceGrant of that namespace permits it (meshroute.Grants): not
	// a fault of the route, which the grant may come after.
	if b.Name == "" {
		c.errorf(f.child("name"), "required")
	} else {
		c.all(f.child("name"), validation.IsDNS1123Label(string(b.Name)))
	}
	if b.Port == nil {
		c.errorf(f.child("port"), "required: the port of the Service to send requests to")
	} else {
		checkPortNumber(c, f.child("port"), *b.Port)
	}
	if w := b.Weight; w != nil && (*w < 0 || *w > maxWeight) {
		c.errorf(f.child("weight"), "%d is out of range 0-%d", *w, maxWeight)
	}
}

func checkTimeouts(c *checker, f path, t *gatewayv1.HTTPRouteTimeouts) {
	request, requestOK := checkDuration(c, f.child("request"), t.Request)
	backend, backendOK := checkDuration(c, f.child("backendRequest"), t.BackendRequest)
	// As the CRD: a backend request lies within the request; 0 is no limit.
	if requestOK && backendOK && t.Request != nil && t.BackendRequest != nil && request != 0 && backend > request {
		c.errorf(f.child("backendRequest"), "%s is longer than the request timeout %s", *t.BackendRequest, *t.Request)
	}
}

func checkRetry(c *checker, f path, r *gatewayv1.HTTPRouteRetry) {
	// The CRD's minimum: a rule that should not retry has no retry.
	if r.Attempts != nil && *r.Attempts < 1 {
		c.errorf(f.child("attempts"), "%d is below 1, the least the Gateway API allows (remove retry for no retries)", *r.Attempts)
	}
	seen := map[gatewayv1.HTTPRouteRetryStatusCode]bool{}
	for i, code := range r.Codes {
		switch {
		case code < 400 || code > 599:
			c.errorf(f.child("codes").index(i), "%d is out of range 400-599", code)
		case seen[code]:
			c.errorf(f.child("codes").index(i), "duplicate %d", code)
		}
		seen[code] = true
	}
	checkDuration(c, f.child("backoff"), r.Backoff)
}

// checkDuration checks an optional Gateway API duration and returns its
// value; ok is false when it is invalid.
func checkDuration(c *checker, f path, d *gatewayv1.Duration) (v time.Duration, ok bool) {
	if d == nil {
		return 0, true
	}
	if gatewayDuration.MatchString(string(*d)) {
		v, _ := time.ParseDuration(string(*d)) // every string the pattern accepts parses
		return v, true
	}
	c.errorf(f, `%q is not a Gateway API duration: 1 to 4 parts, each a number of at most 5 digits with a unit h, m, s or ms (e.g. "10s", "1m30s", "250ms")`, *d)
	return 0, false
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
