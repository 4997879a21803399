package kubeclient_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestClientAgainstTheAPIServer: every call the agent makes, against a real
// API server, with the client's small scheme: the readiness probe,
// discovery of an installed and of a missing custom kind, an informer's
// listing and watch, binding a pod, its status update, and an Event through
// client-go's recorder.
func TestClientAgainstTheAPIServer(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.Apply(t, "../../deploy/crds/gateway.networking.k8s.io_httproutes.yaml")
	api, err := kubeclient.New(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Ready(ctx); err != nil {
		t.Fatalf("readyz: %v", err)
	}
	for gvr, want := range map[schema.GroupVersionResource]bool{
		{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}: true,
		{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "tcproutes"}:  false,
		{Group: "shunt.io", Version: "v1alpha1", Resource: "shuntnetworkpolicies"}:  false,
	} {
		got, err := api.Serves(ctx, gvr)
		if err != nil || got != want {
			t.Errorf("Serves(%s) = %v, %v; want %v", gvr, got, err, want)
		}
	}

	inf := api.Informer(kubeclient.Pods, 0)
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("the pod informer never listed")
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.BindPod(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}); err != nil {
		t.Fatalf("binding: %v", err)
	}
	var seen *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		o, ok, _ := inf.GetStore().GetByKey("default/p")
		if ok {
			seen = o.(*corev1.Pod)
		}
		return ok && seen.Spec.NodeName == "n1", nil
	}); err != nil {
		t.Fatalf("the informer never saw the bound pod: %v (last: %+v)", err, seen)
	}
	seen = seen.DeepCopy()
	seen.Status.PodIP = "10.1.2.3"
	if _, err := api.Pods("default").UpdateStatus(ctx, seen, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("status update: %v", err)
	}
	got, err := api.Pods("default").Get(ctx, "p", metav1.GetOptions{})
	if err != nil || got.Status.PodIP != "10.1.2.3" {
		t.Fatalf("pod after the status update: %v, %v", got, err)
	}
	if n, err := api.Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil || n.Name != "n1" {
		t.Fatalf("node: %v, %v", n, err)
	}

	b := record.NewBroadcaster()
	defer b.Shutdown()
	b.StartRecordingToSink(api.EventSink())
	rec := b.NewRecorder(kubeclient.Scheme, corev1.EventSource{Component: "shuntd-test"})
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "default", Name: "p", UID: got.UID}
	// Twice: the recorder creates the Event, then patches its count.
	rec.Event(ref, corev1.EventTypeWarning, "Test", "first")
	rec.Event(ref, corev1.EventTypeWarning, "Test", "first")
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=p,reason=Test"})
		return err == nil && len(evs.Items) == 1 && evs.Items[0].Count == 2, nil
	}); err != nil {
		t.Fatalf("the Event was never created and counted twice: %v", err)
	}
}
