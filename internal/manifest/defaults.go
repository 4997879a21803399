package manifest

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// setDefaults fills in what the API server would, so consumers never have
// to guess an omitted protocol or target port.
func setDefaults(obj runtime.Object) {
	switch o := obj.(type) {
	case *corev1.Pod:
		for i := range o.Spec.Containers {
			for j := range o.Spec.Containers[i].Ports {
				if o.Spec.Containers[i].Ports[j].Protocol == "" {
					o.Spec.Containers[i].Ports[j].Protocol = corev1.ProtocolTCP
				}
			}
		}
		if o.Spec.RestartPolicy == "" {
			o.Spec.RestartPolicy = corev1.RestartPolicyNever
		}
	case *corev1.Service:
		if o.Spec.Type == "" {
			o.Spec.Type = corev1.ServiceTypeClusterIP
		}
		if o.Spec.SessionAffinity == "" {
			o.Spec.SessionAffinity = corev1.ServiceAffinityNone
		}
		if o.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			if o.Spec.SessionAffinityConfig == nil {
				o.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
			}
			if o.Spec.SessionAffinityConfig.ClientIP == nil {
				o.Spec.SessionAffinityConfig.ClientIP = &corev1.ClientIPConfig{}
			}
			if o.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds == nil {
				t := int32(corev1.DefaultClientIPServiceAffinitySeconds)
				o.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = &t
			}
		}
		for i := range o.Spec.Ports {
			p := &o.Spec.Ports[i]
			if p.Protocol == "" {
				p.Protocol = corev1.ProtocolTCP
			}
			if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0 {
				p.TargetPort = intstr.FromInt32(p.Port)
			}
		}
	case *networkingv1.NetworkPolicy:
		for i := range o.Spec.Ingress {
			defaultPolicyPorts(o.Spec.Ingress[i].Ports)
		}
		for i := range o.Spec.Egress {
			defaultPolicyPorts(o.Spec.Egress[i].Ports)
		}
		if len(o.Spec.PolicyTypes) == 0 {
			// As the API server: Ingress always, Egress when egress rules exist.
			o.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if len(o.Spec.Egress) > 0 {
				o.Spec.PolicyTypes = append(o.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
			}
		}
	case *ShuntNetworkPolicy:
		for _, rules := range [][]ShuntRule{o.Spec.Ingress, o.Spec.Egress} {
			for i := range rules {
				if rules[i].Action == "" {
					rules[i].Action = "allow"
				}
				defaultPolicyPorts(rules[i].Ports)
			}
		}
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
