package lbipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Component is the controller's name in Events and logs.
const Component = "shunt-lb-ipam"

// retryAfter is how long a failed status write waits before the next pass
// (a conflict: the Service changed meanwhile, and the informer brings it).
const retryAfter = time.Second

// Run assigns pool's addresses to the LoadBalancer Services of the API
// server client talks to until ctx ends: one pass of Plan over every
// Service after each change (the informer's view), each decision written
// with the status subresource. A Service that gets no address gets a
// Warning Event saying why, once per reason.
func Run(ctx context.Context, client kubernetes.Interface, pool netip.Prefix, log *slog.Logger) error {
	if err := CheckPool(pool); err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster()
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	c := &controller{client: client, lister: services.Lister(), pool: pool, log: log,
		events: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component}), told: map[string]string{}}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("%s: the informer of %v did not sync: %w", Component, typ, context.Cause(ctx))
		}
	}
	log.Info("assigning load balancer addresses", "pool", pool)
	poke()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-retry:
		}
		retry = nil
		if err := c.pass(ctx); err != nil {
			log.Warn("writing load balancer status; retrying", "err", err)
			retry = time.After(retryAfter)
		}
	}
}

type controller struct {
	client kubernetes.Interface
	lister listerscorev1.ServiceLister
	pool   netip.Prefix
	log    *slog.Logger
	events record.EventRecorder
	told   map[string]string // Service -> the problem its last Event told
}

// pass applies one Plan over the informer's Services; the first error
// ends it (the next pass plans again from what the API server then has).
func (c *controller) pass(ctx context.Context) error {
	all, err := c.lister.List(labels.Everything())
	if err != nil {
		return err
	}
	byKey := map[string]*corev1.Service{}
	for _, s := range all {
		byKey[key(s)] = s
	}
	problems := map[string]string{}
	for _, d := range Plan(all, c.pool) {
		s := byKey[d.Namespace+"/"+d.Name]
		switch {
		case d.Problem != "":
			problems[key(s)] = d.Problem
			if c.told[key(s)] != d.Problem {
				c.events.Event(s, corev1.EventTypeWarning, "AddressNotAssigned", d.Problem)
				c.log.Warn("no load balancer address", "service", key(s), "why", d.Problem)
			}
		case d.Assign.IsValid():
			if err := c.writeStatus(ctx, s, []corev1.LoadBalancerIngress{{IP: d.Assign.String()}}); err != nil {
				return err
			}
			c.events.Eventf(s, corev1.EventTypeNormal, "AddressAssigned", "load balancer address %s from pool %s", d.Assign, c.pool)
			c.log.Info("load balancer address assigned", "service", key(s), "address", d.Assign)
		case d.Release:
			if err := c.writeStatus(ctx, s, nil); err != nil {
				return err
			}
			c.log.Info("load balancer address released", "service", key(s))
		}
	}
	c.told = problems
	return nil
}

func (c *controller) writeStatus(ctx context.Context, s *corev1.Service, ingress []corev1.LoadBalancerIngress) error {
	n := s.DeepCopy()
	n.Status.LoadBalancer.Ingress = ingress
	_, err := c.client.CoreV1().Services(n.Namespace).UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: Component})
	if apierrors.IsNotFound(err) {
		return nil // gone meanwhile
	}
	if err != nil {
		return fmt.Errorf("Service %s: writing status.loadBalancer: %w", key(s), err)
	}
	return nil
}
