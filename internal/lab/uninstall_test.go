package lab

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/instance"
)

// listCountingPods is a pod API holding one pod of node n1, being
// deleted (so that a pass that reads it only finishes its deletion and
// builds nothing on the machine), that counts how often a kubelet pass
// read it.
type listCountingPods struct{ listed atomic.Int32 }

func (f *listCountingPods) run(context.Context, func()) error { return nil }
func (f *listCountingPods) pods() []*corev1.Pod {
	f.listed.Add(1)
	deleted := metav1.Now()
	return []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", UID: "u1", DeletionTimestamp: &deleted},
		Spec: corev1.PodSpec{NodeName: "n1"}}}
}
func (f *listCountingPods) bind(context.Context, *corev1.Pod, string) error { return nil }
func (f *listCountingPods) remove(context.Context, *corev1.Pod) error       { return nil }
func (f *listCountingPods) updateStatus(context.Context, *corev1.Pod) error { return nil }

// TestNoPassAfterUninstall: once a kubelet uninstalled (its agent removes
// itself from the node), a pass that comes after it (a pod event, a
// probe's result) does not read the pods to build their sandboxes again:
// the agent exits meanwhile, and an exit in the middle of building one
// leaves it half made. (The lab's control plane has the same guard; its
// passes need a store and a datapath this test does not build.)
func TestNoPassAfterUninstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the kubelet saves its pod records under /var/lib/shunt")
	}
	// Its own instance: Uninstall saves the (empty) pod records in the
	// instance's state directory.
	inst := instance.Instance{Name: fmt.Sprintf("tnpau%d", os.Getpid())}
	t.Cleanup(func() { os.RemoveAll(inst.StateDir()) })
	api := &listCountingPods{}
	cfg := Config{Instance: inst, NodeName: "n1", Log: slog.New(slog.DiscardHandler)}
	k := &APIKubelet{cfg: cfg, api: api, kick: make(chan struct{}, 1), kubelet: kubelet{cfg: cfg, pods: map[string]*PodRecord{}}}
	if err := k.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := k.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := api.listed.Load(); n != 0 {
		t.Errorf("a pass after Uninstall read the pods %d times, want none", n)
	}
}
