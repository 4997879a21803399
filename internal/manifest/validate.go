package manifest

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldError is one problem with one field of one object.
type FieldError struct {
	Source  string // file#doc
	Object  string // "Pod default/web"
	Field   string // "spec.containers[0].command"
	Message string
}

func (e FieldError) Error() string {
	return fmt.Sprintf("%s: %s: %s: %s", e.Source, e.Object, e.Field, e.Message)
}

// Errors is every problem found in a set of objects, one per line.
type Errors []FieldError

func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, fe := range e {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// checker collects the problems of one object.
type checker struct {
	src, obj string
	errs     *Errors
}

func (c checker) addf(field, format string, args ...any) {
	*c.errs = append(*c.errs, FieldError{c.src, c.obj, field, fmt.Sprintf(format, args...)})
}

// each reports the messages of a k8s validation helper.
func (c checker) each(field string, msgs []string) {
	for _, m := range msgs {
		c.addf(field, "%s", m)
	}
}

// Validate checks objects one by one and as a set (duplicates); it reports
// every problem, not just the first.
func Validate(objs []Object) error {
	var errs Errors
	seen := map[string]string{}
	for _, o := range objs {
		ns, name := o.NamespaceName()
		id := o.Kind() + " " + name
		if ns != "" {
			id = o.Kind() + " " + ns + "/" + name
		}
		c := checker{o.Source, id, &errs}
		if prev, dup := seen[o.Key()]; dup {
			c.addf("metadata.name", "duplicate: %s is also defined in %s", id, prev)
		}
		seen[o.Key()] = o.Source
		checkMeta(c, o)
		switch obj := o.Obj.(type) {
		case *corev1.Pod:
			checkPod(c, obj)
		case *corev1.Service:
			checkService(c, obj)
		case *discoveryv1.EndpointSlice:
			checkEndpointSlice(c, obj)
		case *networkingv1.NetworkPolicy:
			checkNetworkPolicy(c, obj)
		case *ShuntNetworkPolicy:
			checkShuntPolicy(c, obj)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

func checkMeta(c checker, o Object) {
	ns, name := o.NamespaceName()
	switch {
	case name == "":
		c.addf("metadata.name", "required")
	case o.Kind() == "Namespace" || o.Kind() == "Service":
		c.each("metadata.name", validation.IsDNS1123Label(name))
	default:
		c.each("metadata.name", validation.IsDNS1123Subdomain(name))
	}
	if ns != "" {
		c.each("metadata.namespace", validation.IsDNS1123Label(ns))
	}
	for k, v := range metaOf(o.Obj).GetLabels() {
		c.each("metadata.labels["+k+"]", validation.IsQualifiedName(k))
		c.each("metadata.labels["+k+"]", validation.IsValidLabelValue(v))
	}
}

var protocols = map[corev1.Protocol]bool{corev1.ProtocolTCP: true, corev1.ProtocolUDP: true, corev1.ProtocolSCTP: true}

func checkProtocol(c checker, field string, p corev1.Protocol) {
	if !protocols[p] {
		c.addf(field, "unsupported protocol %q: use TCP, UDP or SCTP", p)
	}
}

func checkPort(c checker, field string, port int32) {
	if port < 1 || port > 65535 {
		c.addf(field, "%d is out of range 1-65535", port)
	}
}

func checkPod(c checker, p *corev1.Pod) {
	if len(p.Spec.Containers) == 0 {
		c.addf("spec.containers", "at least one container is required")
	}
	if p.Spec.HostNetwork {
		c.addf("spec.hostNetwork", "host-network pods are not supported in the lab")
	}
	names := map[string]bool{}
	portNames := map[string]bool{}
	for i, ctr := range p.Spec.Containers {
		f := fmt.Sprintf("spec.containers[%d]", i)
		c.each(f+".name", validation.IsDNS1123Label(ctr.Name))
		if names[ctr.Name] {
			c.addf(f+".name", "duplicate container name %q", ctr.Name)
		}
		names[ctr.Name] = true
		if len(ctr.Command) == 0 {
			c.addf(f+".command", "required: the lab runs command + args inside the pod (the image is not pulled)")
		}
		for j, port := range ctr.Ports {
			pf := fmt.Sprintf("%s.ports[%d]", f, j)
			checkPort(c, pf+".containerPort", port.ContainerPort)
			checkProtocol(c, pf+".protocol", port.Protocol)
			if port.Name != "" {
				c.each(pf+".name", validation.IsValidPortName(port.Name))
				if portNames[port.Name] {
					c.addf(pf+".name", "duplicate port name %q in the pod", port.Name)
				}
				portNames[port.Name] = true
			}
		}
	}
}

func checkService(c checker, s *corev1.Service) {
	switch s.Spec.Type {
	case corev1.ServiceTypeClusterIP:
	default:
		c.addf("spec.type", "%q is not supported yet: use ClusterIP", s.Spec.Type)
	}
	if ip := s.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		if _, err := netip.ParseAddr(ip); err != nil {
			c.addf("spec.clusterIP", "%q is not an IP address", ip)
		}
	}
	if len(s.Spec.Ports) == 0 && s.Spec.ClusterIP != corev1.ClusterIPNone {
		c.addf("spec.ports", "at least one port is required")
	}
	names := map[string]bool{}
	for i, p := range s.Spec.Ports {
		f := fmt.Sprintf("spec.ports[%d]", i)
		checkPort(c, f+".port", p.Port)
		checkProtocol(c, f+".protocol", p.Protocol)
		if len(s.Spec.Ports) > 1 && p.Name == "" {
			c.addf(f+".name", "required when the service has more than one port")
		}
		if p.Name != "" {
			if names[p.Name] {
				c.addf(f+".name", "duplicate port name %q", p.Name)
			}
			names[p.Name] = true
		}
		checkTargetPort(c, f+".targetPort", p.TargetPort)
	}
	switch s.Spec.SessionAffinity {
	case corev1.ServiceAffinityNone:
	case corev1.ServiceAffinityClientIP:
		if t := *s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds; t < 1 || t > 86400 {
			c.addf("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is out of range 1-86400", t)
		}
	default:
		c.addf("spec.sessionAffinity", "%q: use None or ClientIP", s.Spec.SessionAffinity)
	}
}

func checkTargetPort(c checker, field string, tp intstr.IntOrString) {
	if tp.Type == intstr.String {
		c.each(field, validation.IsValidPortName(tp.StrVal))
		return
	}
	checkPort(c, field, tp.IntVal)
}

func checkEndpointSlice(c checker, s *discoveryv1.EndpointSlice) {
	is4 := s.AddressType == discoveryv1.AddressTypeIPv4
	if !is4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
		c.addf("addressType", "%q: use IPv4 or IPv6", s.AddressType)
	}
	if s.Labels[discoveryv1.LabelServiceName] == "" {
		c.addf("metadata.labels["+discoveryv1.LabelServiceName+"]", "required: names the Service this slice belongs to")
	}
	for i, ep := range s.Endpoints {
		for j, a := range ep.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil || ip.Is4() != is4 {
				c.addf(fmt.Sprintf("endpoints[%d].addresses[%d]", i, j), "%q is not an %s address", a, s.AddressType)
			}
		}
	}
	for i, p := range s.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		if p.Port != nil {
			checkPort(c, f+".port", *p.Port)
		}
		if p.Protocol != nil {
			checkProtocol(c, f+".protocol", *p.Protocol)
		}
	}
}

func checkSelector(c checker, field string, sel *metav1.LabelSelector) {
	if sel == nil {
		return
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		c.addf(field, "%v", err)
	}
}

func checkPolicyPorts(c checker, field string, ports []networkingv1.NetworkPolicyPort) {
	for i, p := range ports {
		f := fmt.Sprintf("%s[%d]", field, i)
		checkProtocol(c, f+".protocol", *p.Protocol)
		if p.Port != nil {
			checkTargetPort(c, f+".port", *p.Port)
		}
		if p.EndPort != nil {
			switch {
			case p.Port == nil || p.Port.Type != intstr.Int:
				c.addf(f+".endPort", "requires a numeric port")
			case *p.EndPort < p.Port.IntVal:
				c.addf(f+".endPort", "%d is below port %d", *p.EndPort, p.Port.IntVal)
			default:
				checkPort(c, f+".endPort", *p.EndPort)
			}
		}
	}
}

func checkCIDR(c checker, field, cidr string, except []string) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		c.addf(field, "%q is not a CIDR", cidr)
		return
	}
	for i, e := range except {
		ep, err := netip.ParsePrefix(e)
		if err != nil || !p.Contains(ep.Addr()) || ep.Bits() < p.Bits() {
			c.addf(fmt.Sprintf("%s.except[%d]", field, i), "%q must be a CIDR inside %s", e, cidr)
		}
	}
}

func checkPeers(c checker, field string, peers []networkingv1.NetworkPolicyPeer) {
	for i, pe := range peers {
		f := fmt.Sprintf("%s[%d]", field, i)
		checkSelector(c, f+".podSelector", pe.PodSelector)
		checkSelector(c, f+".namespaceSelector", pe.NamespaceSelector)
		if pe.IPBlock != nil {
			if pe.PodSelector != nil || pe.NamespaceSelector != nil {
				c.addf(f, "ipBlock cannot be combined with podSelector or namespaceSelector")
			}
			checkCIDR(c, f+".ipBlock.cidr", pe.IPBlock.CIDR, pe.IPBlock.Except)
		}
	}
}

func checkNetworkPolicy(c checker, p *networkingv1.NetworkPolicy) {
	checkSelector(c, "spec.podSelector", &p.Spec.PodSelector)
	for i, t := range p.Spec.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			c.addf(fmt.Sprintf("spec.policyTypes[%d]", i), "%q: use Ingress or Egress", t)
		}
	}
	for i, r := range p.Spec.Ingress {
		checkPeers(c, fmt.Sprintf("spec.ingress[%d].from", i), r.From)
		checkPolicyPorts(c, fmt.Sprintf("spec.ingress[%d].ports", i), r.Ports)
	}
	for i, r := range p.Spec.Egress {
		checkPeers(c, fmt.Sprintf("spec.egress[%d].to", i), r.To)
		checkPolicyPorts(c, fmt.Sprintf("spec.egress[%d].ports", i), r.Ports)
	}
}

var entities = map[string]bool{"host": true, "world": true, "cluster": true, "all": true}

func checkShuntPolicy(c checker, p *ShuntNetworkPolicy) {
	checkSelector(c, "spec.podSelector", &p.Spec.PodSelector)
	for dir, rules := range map[string][]ShuntRule{"ingress": p.Spec.Ingress, "egress": p.Spec.Egress} {
		for i, r := range rules {
			f := fmt.Sprintf("spec.%s[%d]", dir, i)
			if r.Action != "allow" && r.Action != "deny" {
				c.addf(f+".action", "%q: use allow or deny", r.Action)
			}
			for j, pe := range r.Peers {
				pf := fmt.Sprintf("%s.peers[%d]", f, j)
				checkSelector(c, pf+".podSelector", pe.PodSelector)
				checkSelector(c, pf+".namespaceSelector", pe.NamespaceSelector)
				if pe.CIDR != "" {
					checkCIDR(c, pf+".cidr", pe.CIDR, pe.Except)
				}
				if pe.Entity != "" && !entities[pe.Entity] {
					c.addf(pf+".entity", "%q: use host, world, cluster or all", pe.Entity)
				}
			}
			checkPolicyPorts(c, f+".ports", r.Ports)
			for j, h := range r.HTTP {
				// A method is an HTTP token, as header names are.
				if h.Method != "" && len(validation.IsHTTPHeaderName(h.Method)) > 0 {
					c.addf(fmt.Sprintf("%s.http[%d].method", f, j), "%q is not an HTTP method", h.Method)
				}
			}
		}
	}
}
