package relay

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/api"
)

// PodLister lists the pods of one namespace (client-go's typed pod
// client, or kubeclient's).
type PodLister interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
}

// KubernetesAgents finds the agents of a cluster: the running pods that
// selector picks among pods (the DaemonSet's namespace), each reached at
// its pod address (the node's: the agent runs in the host network) and
// port, by mutual TLS with tlsConfig. A pod that is not running or has no
// address yet is left until it has.
func KubernetesAgents(pods PodLister, selector string, port int, tlsConfig *tls.Config) Discover {
	return func(ctx context.Context) ([]Peer, error) {
		pods, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, fmt.Errorf("listing the agent pods (selector %q): %w", selector, err)
		}
		var peers []Peer
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
				continue
			}
			addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port))
			client := api.NewRemoteClient(addr, tlsConfig)
			peers = append(peers, Peer{Node: p.Spec.NodeName, Addr: addr, Stream: client.StreamContext})
		}
		return peers, nil
	}
}
