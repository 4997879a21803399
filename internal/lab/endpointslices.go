package lab

import (
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/services"
)

// The lab's EndpointSlice controller: for every Service with a selector it
// writes the EndpointSlices of the pods it selects (their status.podIP and
// Ready condition, named target ports resolved per pod), and removes those
// no longer wanted. Slices it manages carry its managed-by label; others
// (hand-written, for Services without selector) are left alone.

const sliceManager = "shunt.io/lab"

// sliceChanges returns the slice objects to write and the keys to remove
// so the selector services that changes touch have the slices their pods
// call for.
func sliceChanges(old, next *model.Store, changes []model.Change) (put []manifest.Object, remove []manifest.Key) {
	podsIn := map[string][]services.Pod{} // by namespace, described once
	for _, key := range services.SelectorServicesTouched(old, next, changes) {
		var want []*discoveryv1.EndpointSlice
		if svc, ok := next.Service(key.Namespace, key.Name); ok && svc.Spec.Selector != nil {
			pods, ok := podsIn[key.Namespace]
			if !ok {
				for _, p := range next.PodsIn(key.Namespace) {
					pods = append(pods, services.PodOf(p))
				}
				podsIn[key.Namespace] = pods
			}
			want = services.DeriveSlices(svc, pods)
		}
		existing := map[string]bool{} // name -> managed by us
		for _, sl := range next.EndpointSlicesFor(key.Namespace, key.Name) {
			existing[sl.Name] = sl.Labels[discoveryv1.LabelManagedBy] == sliceManager
		}
		// Named <service>-<n>, skipping names a hand-written slice holds.
		n := 0
		for _, sl := range want {
			for {
				n++
				sl.Name = fmt.Sprintf("%s-%d", key.Name, n)
				if managed, taken := existing[sl.Name]; !taken || managed {
					break
				}
			}
			delete(existing, sl.Name)
			put = append(put, manifest.Object{Source: "endpointslice-controller", Obj: sl})
		}
		for name, managed := range existing {
			if managed {
				remove = append(remove, manifest.Key{Kind: manifest.KindEndpointSlice, Namespace: key.Namespace, Name: name})
			}
		}
	}
	return put, remove
}
