package manifest

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The defaulting functions fill in what the API server would, so consumers
// never have to guess an omitted protocol or target port. They run before
// validation and must cope with invalid input.

func defaultPod(p *corev1.Pod) {
	for i := range p.Spec.Containers {
		for j := range p.Spec.Containers[i].Ports {
			defaultProtocol(&p.Spec.Containers[i].Ports[j].Protocol)
		}
	}
}

func defaultService(s *corev1.Service) {
	if s.Spec.Type == "" {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if s.Spec.SessionAffinity == "" {
		s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	// As the API server: outside traffic may reach any endpoint unless
	// the Service says Local.
	if external := s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer ||
		len(s.Spec.ExternalIPs) > 0; external && s.Spec.ExternalTrafficPolicy == "" {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		if s.Spec.SessionAffinityConfig == nil {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
		}
		if s.Spec.SessionAffinityConfig.ClientIP == nil {
			s.Spec.SessionAffinityConfig.ClientIP = &corev1.ClientIPConfig{}
		}
		if s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds == nil {
			t := corev1.DefaultClientIPServiceAffinitySeconds
			s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = &t
		}
	}
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		defaultProtocol(&p.Protocol)
		// As the API server: an omitted (or zero/empty) targetPort is the port.
		if p.TargetPort == intstr.FromInt32(0) || p.TargetPort == intstr.FromString("") {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
}

func defaultEndpointSlice(s *discoveryv1.EndpointSlice) {
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Protocol == nil {
			tcp := corev1.ProtocolTCP
			p.Protocol = &tcp
		}
		// The API server stores an omitted name as "", so consumers can
		// dereference it.
		if p.Name == nil {
			empty := ""
			p.Name = &empty
		}
	}
}

func defaultNetworkPolicy(np *networkingv1.NetworkPolicy) {
	for i := range np.Spec.Ingress {
		defaultPolicyPorts(np.Spec.Ingress[i].Ports)
	}
	for i := range np.Spec.Egress {
		defaultPolicyPorts(np.Spec.Egress[i].Ports)
	}
	if len(np.Spec.PolicyTypes) == 0 {
		// As the API server: Ingress always, Egress when there are egress rules.
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
	}
}

func defaultShuntPolicy(p *ShuntNetworkPolicy) {
	for _, rules := range [][]ShuntRule{p.Spec.Ingress, p.Spec.Egress} {
		for i := range rules {
			if rules[i].Action == "" {
				rules[i].Action = ActionAllow
			}
			defaultPolicyPorts(rules[i].Ports)
		}
	}
}

// defaultHTTPRoute applies the defaults of the Gateway API's CRD schema: a
// parentRef names a Gateway unless it says otherwise (so a Service parent
// must set group: "" and kind: Service), a backendRef a core Service with
// weight 1; a route without rules, or a rule without matches, matches every
// request (PathPrefix "/"); match types are PathPrefix and Exact. Filters
// are left alone: validation refuses them.
func defaultHTTPRoute(r *gatewayv1.HTTPRoute) {
	defaultParentRefs(r.Spec.ParentRefs)
	// The CRD defaults only omitted lists; an empty one is defaulted too,
	// so that a route written out (empty lists omitted) reads back equal.
	if len(r.Spec.Rules) == 0 {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{}}
	}
	for i := range r.Spec.Rules {
		rule := &r.Spec.Rules[i]
		if len(rule.Matches) == 0 {
			rule.Matches = []gatewayv1.HTTPRouteMatch{{}}
		}
		for j := range rule.Matches {
			defaultRouteMatch(&rule.Matches[j])
		}
		for j := range rule.BackendRefs {
			defaultBackendRef(&rule.BackendRefs[j].BackendRef)
		}
	}
}

// defaultGRPCRoute applies the defaults of the GRPCRoute CRD's schema:
// parentRefs and backendRefs as an HTTPRoute's, method and header matches
// of type Exact. Unlike an HTTPRoute's, its rules and matches get no
// default (none matches every call).
func defaultGRPCRoute(r *gatewayv1.GRPCRoute) {
	defaultParentRefs(r.Spec.ParentRefs)
	for i := range r.Spec.Rules {
		rule := &r.Spec.Rules[i]
		for j := range rule.Matches {
			m := &rule.Matches[j]
			if m.Method != nil && m.Method.Type == nil {
				m.Method.Type = new(gatewayv1.GRPCMethodMatchExact)
			}
			for k := range m.Headers {
				if m.Headers[k].Type == nil {
					m.Headers[k].Type = new(gatewayv1.GRPCHeaderMatchExact)
				}
			}
		}
		for j := range rule.BackendRefs {
			defaultBackendRef(&rule.BackendRefs[j].BackendRef)
		}
	}
}

// defaultParentRefs: a parentRef names a Gateway unless it says otherwise.
func defaultParentRefs(refs []gatewayv1.ParentReference) {
	for i := range refs {
		p := &refs[i]
		if p.Group == nil {
			p.Group = new(gatewayv1.Group(gatewayv1.GroupName))
		}
		if p.Kind == nil {
			p.Kind = new(gatewayv1.Kind("Gateway"))
		}
	}
}

// defaultBackendRef: a backendRef names a core Service, with weight 1.
func defaultBackendRef(b *gatewayv1.BackendRef) {
	if b.Group == nil {
		b.Group = new(gatewayv1.Group(""))
	}
	if b.Kind == nil {
		b.Kind = new(gatewayv1.Kind(KindService))
	}
	if b.Weight == nil {
		b.Weight = new(int32(1))
	}
}

func defaultRouteMatch(m *gatewayv1.HTTPRouteMatch) {
	if m.Path == nil {
		m.Path = &gatewayv1.HTTPPathMatch{}
	}
	if m.Path.Type == nil {
		m.Path.Type = new(gatewayv1.PathMatchPathPrefix)
	}
	if m.Path.Value == nil {
		m.Path.Value = new("/")
	}
	for k := range m.Headers {
		if m.Headers[k].Type == nil {
			m.Headers[k].Type = new(gatewayv1.HeaderMatchExact)
		}
	}
	for k := range m.QueryParams {
		if m.QueryParams[k].Type == nil {
			m.QueryParams[k].Type = new(gatewayv1.QueryParamMatchExact)
		}
	}
}

func defaultProtocol(p *corev1.Protocol) {
	if *p == "" {
		*p = corev1.ProtocolTCP
	}
}

func defaultPolicyPorts(ports []networkingv1.NetworkPolicyPort) {
	for i := range ports {
		if ports[i].Protocol == nil {
			tcp := corev1.ProtocolTCP
			ports[i].Protocol = &tcp
		}
	}
}
