package manifest

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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
