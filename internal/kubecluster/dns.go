package kubecluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// The cluster DNS: CoreDNS with its kubernetes plugin (the program of the
// registry.k8s.io/coredns/coredns image, which the lab kubelet maps to the
// coredns scripts/kube-build.sh builds from tools/coredns), serving
// cluster.local from the API server, as Service kube-system/kube-dns at
// the service CIDR's tenth address (kubeadm's choice), UDP and TCP 53.
//
// It runs on the node's network (hostNetwork) and reads the API with a
// kubeconfig of its own user, system:coredns, from a Secret: this control
// plane listens on loopback only, so a pod on the pod network has no way
// to it, while a node's network does (the node's own, or a lab node's
// namespace, where RelayInto relays it). Its kubernetes Service therefore
// cannot give CoreDNS the in-cluster configuration a real cluster's does.

// DNSImage is the image of the cluster DNS: CoreDNS at tools/coredns's pin.
const DNSImage = "registry.k8s.io/coredns/coredns:v1.15.0"

// DNSUser is the cluster DNS's user, with ClusterRole system:coredns.
const DNSUser = "system:coredns"

// DNSServiceIP is the address of Service kube-dns: the tenth of the
// service CIDR, as kubeadm gives it.
func DNSServiceIP(serviceCIDR string) (netip.Addr, error) {
	p, err := netip.ParsePrefix(serviceCIDR)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("service CIDR %q: %w", serviceCIDR, err)
	}
	a := p.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	if !p.Contains(a) {
		return netip.Addr{}, fmt.Errorf("service CIDR %s has no tenth address for the cluster DNS", serviceCIDR)
	}
	return a, nil
}

// dnsCorefile is kubeadm's Corefile with the kubeconfig, without health
// (:8080), prometheus (:9153) and loop: on the node's network those ports
// may be the node's own, and readiness comes from ready (:8181). Names
// outside the cluster go to the node's resolver.
const dnsCorefile = `.:53 {
    errors
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig /var/run/secrets/coredns/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . /etc/resolv.conf {
        max_concurrent 1000
    }
    cache 30
    reload
    loadbalance
}
`

// DeployDNS runs the cluster DNS: its RBAC, kubeconfig Secret, Corefile
// ConfigMap, a Deployment of one replica (a bare Pod when the cluster runs
// no Deployment controller, Options.WorkloadControllers) and Service
// kube-dns. It returns the Service's address: give it to the nodes'
// kubelets (shunt lab up --cluster-dns). Pods run once a node plays the
// kubelet.
func (c *Cluster) DeployDNS(ctx context.Context, workloadControllers bool) (netip.Addr, error) {
	ip, err := DNSServiceIP(c.ServiceCIDR)
	if err != nil {
		return ip, err
	}
	cs, err := c.Clientset()
	if err != nil {
		return ip, err
	}
	tmp, err := os.MkdirTemp(c.Dir, "dns-")
	if err != nil {
		return ip, err
	}
	defer os.RemoveAll(tmp)
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := IssueKubeconfig(c.Dir, kubeconfig, DNSUser); err != nil {
		return ip, err
	}
	kc, err := os.ReadFile(kubeconfig)
	if err != nil {
		return ip, err
	}
	ns := metav1.NamespaceSystem
	labels := map[string]string{"k8s-app": "kube-dns"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: DNSUser}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: DNSUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: DNSUser},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: DNSUser}}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "coredns-kubeconfig", Namespace: ns}, Data: map[string][]byte{"kubeconfig": kc}}
	config := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns}, Data: map[string]string{"Corefile": dnsCorefile}}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: dnsPodSpec()}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: ns, Labels: map[string]string{
		"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true"}},
		Spec: corev1.ServiceSpec{ClusterIP: ip.String(), Selector: labels, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
		}}}
	steps := []func() error{
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, config, metav1.CreateOptions{})
			return err
		},
		func() error { _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); return err },
		func() error { return createDNSWorkload(ctx, cs, template, workloadControllers) },
	}
	for _, step := range steps {
		if err := step(); err != nil && !apierrors.IsAlreadyExists(err) {
			return ip, fmt.Errorf("deploying the cluster DNS: %w", err)
		}
	}
	return ip, nil
}

func createDNSWorkload(ctx context.Context, cs kubernetes.Interface, template corev1.PodTemplateSpec, deployment bool) error {
	meta := metav1.ObjectMeta{Name: "coredns", Namespace: metav1.NamespaceSystem, Labels: template.Labels}
	if !deployment {
		_, err := cs.CoreV1().Pods(meta.Namespace).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: template.Spec}, metav1.CreateOptions{})
		return err
	}
	one := int32(1)
	_, err := cs.AppsV1().Deployments(meta.Namespace).Create(ctx, &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{
		Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: template.Labels}, Template: template,
	}}, metav1.CreateOptions{})
	return err
}

// dnsPodSpec is kubeadm's CoreDNS pod on the node's network, with the
// kubeconfig Secret mounted where the Corefile reads it.
func dnsPodSpec() corev1.PodSpec {
	return corev1.PodSpec{
		HostNetwork: true,
		DNSPolicy:   corev1.DNSDefault,
		Containers: []corev1.Container{{
			Name: "coredns", Image: DNSImage, Args: []string{"-conf", "/etc/coredns/Corefile"},
			Ports: []corev1.ContainerPort{
				{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
			},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true},
				{Name: "kubeconfig", MountPath: "/var/run/secrets/coredns", ReadOnly: true},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/ready", Port: intstr.FromInt32(8181)}}, PeriodSeconds: 1},
			SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
				Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: []corev1.Capability{"ALL"}}},
		}},
		Volumes: []corev1.Volume{
			{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"},
				Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}}}}},
			{Name: "kubeconfig", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "coredns-kubeconfig"}}},
		},
		Tolerations: []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}},
	}
}
