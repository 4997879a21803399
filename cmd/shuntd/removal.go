package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/shuntnet/shunt/internal/kubesource"
)

// An agent run by a DaemonSet cannot tell from SIGTERM alone whether its
// pod is being replaced (a rolling update, a node drained: keep the
// datapath, the next agent adopts its pins and pods keep their
// connections) or shunt is being removed from the cluster (`helm
// uninstall`, `kubectl delete -f`: leave nothing on the node). The
// DaemonSet says: deleted, or being deleted, means removal. Helm deletes
// it before its pods (the garbage collector deletes those after their
// owner), so it is already gone when an agent gets SIGTERM.

var (
	podsResource       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	daemonSetsResource = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
)

// daemonSetRemoved says whether the DaemonSet owning this agent's pod
// (POD_NAMESPACE/POD_NAME) is gone or being deleted.
func daemonSetRemoved(kubeconfig string) (bool, error) {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return false, errors.New("POD_NAMESPACE and POD_NAME are not set: the DaemonSet gives them from the downward API (deploy/helm/shunt does)")
	}
	rc, err := kubesource.RESTConfig(kubeconfig)
	if err != nil {
		return false, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := dyn.Resource(podsResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading this agent's pod %s/%s: %w", ns, name, err)
	}
	for _, o := range pod.GetOwnerReferences() {
		if o.Kind != "DaemonSet" {
			continue
		}
		ds, err := dyn.Resource(daemonSetsResource).Namespace(ns).Get(ctx, o.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, fmt.Errorf("reading DaemonSet %s/%s: %w", ns, o.Name, err)
		}
		return ds.GetDeletionTimestamp() != nil || ds.GetUID() != o.UID, nil
	}
	return false, fmt.Errorf("pod %s/%s has no DaemonSet owner", ns, name)
}
