package lbipam_test

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/shuntnet/shunt/internal/kubetest"
	"github.com/shuntnet/shunt/internal/lbipam"
)

// TestRunAssignsOnARealAPIServer: against a real API server, the
// controller gives a new LoadBalancer Service the pool's first address and
// one asking for spec.loadBalancerIP that address; a Service asking for an
// address outside the pool gets a Warning Event naming the field; a
// Service turned into a ClusterIP gives its address back, which the next
// new Service then gets.
func TestRunAssignsOnARealAPIServer(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lbipam.Run(ctx, c.Client, netip.MustParsePrefix("192.0.2.0/29"), slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	services := c.Client.CoreV1().Services("default")
	create := func(name, ask string) {
		t.Helper()
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerIP: ask,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
		if _, err := services.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("web", "")
	waitIngress(t, c.Client, "web", "192.0.2.1")
	create("asks", "192.0.2.5")
	waitIngress(t, c.Client, "asks", "192.0.2.5")
	create("outside", "198.51.100.7")
	waitEvent(t, c.Client, "outside", "spec.loadBalancerIP: 198.51.100.7 is not in the load balancer pool 192.0.2.0/29")

	s, err := services.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	for i := range s.Spec.Ports {
		s.Spec.Ports[i].NodePort = 0
	}
	if _, err := services.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIngress(t, c.Client, "web", "")
	create("next", "")
	waitIngress(t, c.Client, "next", "192.0.2.1")
}

// waitIngress waits until Service name's load balancer status is ip
// ("": empty).
func waitIngress(t *testing.T, client kubernetes.Interface, name, ip string) {
	t.Helper()
	var last []corev1.LoadBalancerIngress
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		s, err := client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = s.Status.LoadBalancer.Ingress
		if ip == "" {
			return len(last) == 0, nil
		}
		return len(last) == 1 && last[0].IP == ip, nil
	})
	if err != nil {
		t.Fatalf("Service %s: status.loadBalancer.ingress %+v, want %q: %v", name, last, ip, err)
	}
}

// waitEvent waits for a Warning Event on Service name whose message holds
// want.
func waitEvent(t *testing.T, client kubernetes.Interface, name, want string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
			if e.Type == corev1.EventTypeWarning && e.Source.Component == lbipam.Component && strings.Contains(e.Message, want) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no Warning Event on Service %s saying %q; events: %q", name, want, seen)
	}
}
