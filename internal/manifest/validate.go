package manifest

import (
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/shuntnet/shunt/internal/parallel"
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
	if pod.Spec.HostNetwork {
		c.errorf(spec.child("hostNetwork"), "not supported in the lab: every pod gets its own network namespace")
	}
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
		}
	}
}

// ---- Service ----

func checkService(c *checker, svc *corev1.Service) {
	spec := path("spec")
	if t := svc.Spec.Type; t != "" && t != corev1.ServiceTypeClusterIP {
		c.errorf(spec.child("type"), "%q is not supported in the lab: use ClusterIP (or clusterIP: None for a headless Service)", t)
	}
	headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
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

	if len(svc.Spec.Ports) == 0 && !headless {
		c.errorf(spec.child("ports"), "at least one port is required (only a headless Service, clusterIP: None, may have none)")
	}
	names := map[string]path{}
	type portProto struct {
		port  int32
		proto corev1.Protocol
	}
	seen := map[portProto]bool{}
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
		if p.NodePort != 0 {
			c.errorf(f.child("nodePort"), "not supported: the lab has ClusterIP Services only")
		}
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
	for _, dir := range []struct {
		name  string
		rules []ShuntRule
	}{{"ingress", p.Spec.Ingress}, {"egress", p.Spec.Egress}} {
		for i, r := range dir.rules {
			checkShuntRule(c, spec.child(dir.name).index(i), r)
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
		if _, err := regexp.Compile(h.Path); err != nil {
			c.errorf(hf.child("path"), "not a valid regular expression: %v", err)
		}
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
