package agent

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"

	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
)

// problemEvents tells the owners of objects what shunt leaves out of them:
// each problem becomes a Warning Event on its object (kubectl describe
// shows it), once per problem while it lasts. The client-go recorder
// aggregates repeats and rate-limits, as a kubelet's does.
type problemEvents struct {
	rec     record.EventRecorder
	objects func() *model.Store
	current func() []policy.Problem
	log     *slog.Logger
	told    map[policy.Problem]bool
}

func newProblemEvents(api *kubeclient.Client, node string, objects func() *model.Store, current func() []policy.Problem, log *slog.Logger) (*problemEvents, error) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(api.EventSink())
	return &problemEvents{
		rec:     b.NewRecorder(kubeclient.Scheme, corev1.EventSource{Component: "shuntd", Host: node}),
		objects: objects, current: current, log: log, told: map[policy.Problem]bool{},
	}, nil
}

// run reports new problems every interval until ctx ends.
func (e *problemEvents) run(ctx context.Context, every time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) { e.report() }, every)
}

func (e *problemEvents) report() {
	now := map[policy.Problem]bool{}
	store := e.objects()
	for _, p := range e.current() {
		now[p] = true
		if e.told[p] {
			continue
		}
		ref := &corev1.ObjectReference{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}
		if apiVersion, ok := manifest.APIVersion(p.Kind); ok {
			ref.APIVersion = apiVersion
		}
		if o, ok := store.Get(manifest.Key{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}); ok {
			if m, ok := o.Obj.(metav1.Object); ok {
				ref.UID, ref.ResourceVersion = m.GetUID(), m.GetResourceVersion()
			}
		}
		e.rec.Event(ref, corev1.EventTypeWarning, p.Reason, p.Message)
		e.log.Warn("object problem", "kind", p.Kind, "namespace", p.Namespace, "name", p.Name, "reason", p.Reason, "message", p.Message)
	}
	e.told = now
}
