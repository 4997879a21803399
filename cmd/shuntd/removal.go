package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/shuntnet/shunt/internal/kubesource"
)

// An agent run by a DaemonSet cannot tell from SIGTERM alone whether its
// pod is being replaced (a rolling update, a node drained: keep the
// datapath, the next agent adopts its pins and pods keep their
// connections) or shunt is being removed from the cluster (`helm
// uninstall`, `kubectl delete -f`: leave nothing on the node). Its
// DaemonSet says: deleted, or being deleted, means removal. The agent
// watches it while it runs, because by the time its pod is stopped (the
// garbage collector deletes the pods after their DaemonSet) helm has also
// deleted the agent's service account and RBAC, and it can ask nothing.

var (
	podsResource       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	daemonSetsResource = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
)

// removalWatch follows this agent's DaemonSet (the owner of POD_NAMESPACE/
// POD_NAME) and remembers when it is deleted or being deleted.
type removalWatch struct {
	removed atomic.Bool
}

func watchRemoval(ctx context.Context, kubeconfig string, log *slog.Logger) (*removalWatch, error) {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return nil, errors.New("--uninstall-when-removed: POD_NAMESPACE and POD_NAME are not set (the DaemonSet gives them from the downward API, as deploy/helm/shunt does)")
	}
	rc, err := kubesource.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	getCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pod, err := dyn.Resource(podsResource).Namespace(ns).Get(getCtx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("--uninstall-when-removed: reading this agent's pod %s/%s: %w", ns, name, err)
	}
	var owner *metav1.OwnerReference
	for _, o := range pod.GetOwnerReferences() {
		if o.Kind == "DaemonSet" {
			owner = &o
		}
	}
	if owner == nil {
		return nil, fmt.Errorf("--uninstall-when-removed: pod %s/%s has no DaemonSet owner", ns, name)
	}
	w := &removalWatch{}
	dss := dyn.Resource(daemonSetsResource).Namespace(ns)
	gone := func(u *unstructured.Unstructured) bool {
		return u.GetUID() != owner.UID || u.GetDeletionTimestamp() != nil
	}
	go func() {
		for ctx.Err() == nil {
			ds, err := dss.Get(ctx, owner.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				w.removed.Store(true)
				return
			case err != nil:
				log.Warn("following this agent's DaemonSet", "err", err)
				time.Sleep(5 * time.Second)
				continue
			case gone(ds):
				w.removed.Store(true)
				return
			}
			wi, err := dss.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", owner.Name).String(), ResourceVersion: ds.GetResourceVersion()})
			if err != nil {
				log.Warn("following this agent's DaemonSet", "err", err)
				time.Sleep(5 * time.Second)
				continue
			}
			for ev := range wi.ResultChan() {
				u, _ := ev.Object.(*unstructured.Unstructured)
				if ev.Type == watch.Deleted || (u != nil && ev.Type == watch.Modified && gone(u)) {
					w.removed.Store(true)
					wi.Stop()
					return
				}
			}
		}
	}()
	return w, nil
}
