package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/manifest"
)

// kubectlName turns a store key "Pod/ns/name" into kubectl's "pod/name".
func kubectlName(key string) string {
	parts := strings.Split(key, "/")
	return strings.ToLower(parts[0]) + "/" + parts[len(parts)-1]
}

type getOptions struct {
	namespace     string
	allNamespaces bool
	output        string
	selector      string
	showLabels    bool

	sel    labels.Selector // -l parsed; labels.Everything() without it
	out    io.Writer       // tables and objects
	errOut io.Writer       // "No resources found"
}

// resource is one kind `get` lists. Every kind `apply` accepts is one, so
// whatever was applied can be looked at; all of them have labels, so -l
// and --show-labels apply to each.
type resource struct {
	name       string   // plural, as kubectl names resources: "pods"
	singular   string   // -o name prints singular/NAME, as apply does
	kind       string   // the object kind ("Pod"); "" for what is not an object (identities)
	short      []string // short names, as kubectl's: "po"
	aliases    []string // other accepted names: group-qualified ones
	namespaced bool     // -n/-A select; the table gets NAMESPACE with -A
	showsLabel bool     // the table has a LABELS column already
	list       func(c *api.Client, o *getOptions, r *resource, name string) error
}

// resources are the kinds `get` knows, in the order they are listed.
var resources = []resource{
	{name: "pods", singular: "pod", kind: manifest.KindPod, short: []string{"po"}, namespaced: true, list: getPods},
	{name: "services", singular: "service", kind: manifest.KindService, short: []string{"svc"}, namespaced: true, list: getServices},
	{name: "endpointslices", singular: "endpointslice", kind: manifest.KindEndpointSlice, aliases: []string{"endpointslices.discovery.k8s.io"},
		namespaced: true, list: getEndpointSlices},
	{name: "namespaces", singular: "namespace", kind: manifest.KindNamespace, short: []string{"ns"}, showsLabel: true, list: getNamespaces},
	{name: "nodes", singular: "node", kind: manifest.KindNode, short: []string{"no"}, list: getNodes},
	{name: "networkpolicies", singular: "networkpolicy", kind: manifest.KindNetworkPolicy, short: []string{"netpol"},
		aliases: []string{"networkpolicies.networking.k8s.io"}, namespaced: true, list: getNetworkPolicies},
	{name: "shuntnetworkpolicies", singular: "shuntnetworkpolicy", kind: manifest.KindShuntNetworkPolicy, short: []string{"snp"},
		aliases: []string{"shuntnetworkpolicies.shunt.io"}, namespaced: true, list: getShuntPolicies},
	{name: "httproutes", singular: "httproute", kind: manifest.KindHTTPRoute, short: []string{"hr"},
		aliases: []string{"httproutes.gateway.networking.k8s.io"}, namespaced: true, list: getHTTPRoutes},
	{name: "grpcroutes", singular: "grpcroute", kind: manifest.KindGRPCRoute,
		aliases: []string{"grpcroutes.gateway.networking.k8s.io"}, namespaced: true, list: getGRPCRoutes},
	{name: "identities", singular: "identity", showsLabel: true, list: getIdentities},
}

// lookupResource finds a kind by any of its names, case-insensitively.
func lookupResource(kind string) (*resource, error) {
	k := strings.ToLower(kind)
	for i := range resources {
		r := &resources[i]
		if k == r.name || k == r.singular || slices.Contains(r.short, k) || slices.Contains(r.aliases, k) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("the server doesn't have a resource type %q\nknown resource types (short names): %s", kind, knownResources())
}

// knownResources lists the kinds with their short names:
// "pods (po), services (svc), endpointslices, ...".
func knownResources() string {
	names := make([]string, len(resources))
	for i, r := range resources {
		names[i] = r.name
		if len(r.short) > 0 {
			names[i] += " (" + strings.Join(r.short, ", ") + ")"
		}
	}
	return strings.Join(names, ", ")
}

func newGetCmd(g *globals) *cobra.Command {
	o := &getOptions{}
	cmd := &cobra.Command{
		Use:   "get KIND [NAME] [-n NS|-A] [-l SELECTOR] [--show-labels] [-o wide|json|yaml|name]",
		Short: "list objects with their status (pods, services, endpointslices, namespaces, policies, httproutes, grpcroutes, identities)",
		Long: "List objects as kubectl does: a table, or with -o json|yaml Kubernetes-shaped objects\n" +
			"(a List with items; a named object as itself).\n\n" +
			"KIND is one of (short names in parentheses): " + knownResources() + ".\n\n" +
			"-l selects by labels with kubectl's syntax: app=web, app!=web, 'tier in (a,b)', 'tier notin (a)',\n" +
			"key (has the label), !key (has not); requirements separated by commas must all hold.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("you must specify the type of resource to get: %s", knownResources())
			}
			return cobra.RangeArgs(1, 2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			o.out, o.errOut = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runGet(c, o, args)
		},
	}
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "default", "namespace")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list across all namespaces")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: wide, json, yaml or name")
	cmd.Flags().StringVarP(&o.selector, "selector", "l", "", "label selector, e.g. app=web,tier!=db or 'tier in (a,b)'")
	cmd.Flags().BoolVar(&o.showLabels, "show-labels", false, "add a LABELS column to the table")
	return cmd
}

// runGet checks the invocation before asking the agent anything: a wrong
// kind, format or selector is reported whether or not an agent runs.
func runGet(c *api.Client, o *getOptions, args []string) error {
	switch o.output {
	case "", "wide", "json", "yaml", "name":
	default:
		return fmt.Errorf("unknown output format %q: use wide, json, yaml or name", o.output)
	}
	r, err := lookupResource(args[0])
	if err != nil {
		return err
	}
	name := ""
	if len(args) == 2 {
		name = args[1]
	}
	o.sel = labels.Everything()
	if o.selector != "" {
		if name != "" {
			return fmt.Errorf("a NAME cannot be given with a selector (-l %q): use one or the other", o.selector)
		}
		if o.sel, err = labels.Parse(o.selector); err != nil {
			return fmt.Errorf("invalid label selector %q: %v", o.selector, err)
		}
	}
	return r.list(c, o, r, name)
}

// list is a Kubernetes List of one kind, as the agent sends it and as
// -o json|yaml prints it.
type list[T any] struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []T `json:"items"`
}

// object is a pointer to a Kubernetes object type: *corev1.Pod for T
// corev1.Pod.
type object[T any] interface {
	*T
	metav1.Object
}

// selectItems keeps the objects -n/-A, NAME and -l select. A NAME that
// matches nothing is an error, as kubectl's NotFound. The result is never
// nil, so -o json prints "items": [].
func selectItems[T any, P object[T]](items []T, o *getOptions, r *resource, name string) ([]T, error) {
	out := []T{}
	for i := range items {
		m := P(&items[i])
		if (!r.namespaced || o.allNamespaces || m.GetNamespace() == o.namespace) &&
			(name == "" || m.GetName() == name) && o.sel.Matches(labels.Set(m.GetLabels())) {
			out = append(out, items[i])
		}
	}
	if name != "" && len(out) == 0 {
		if r.namespaced && !o.allNamespaces {
			return nil, fmt.Errorf("%s %q not found in namespace %q", r.name, name, o.namespace)
		}
		return nil, fmt.Errorf("%s %q not found", r.name, name)
	}
	return out, nil
}

// columns says how a kind is shown as a table: its header, the extra
// columns of -o wide, and the cells of one object (wide is only used with
// -o wide).
type columns[P any] struct {
	header, wide []string
	row          func(P) (cells, wide []string)
}

// getObjects fetches a kind's List from the agent, keeps what the flags
// select and prints it.
func getObjects[T any, P object[T]](c *api.Client, o *getOptions, r *resource, name, path string, cols columns[P]) error {
	var l list[T]
	if err := c.Do("GET", path, nil, &l); err != nil {
		return err
	}
	items, err := selectItems[T, P](l.Items, o, r, name)
	if err != nil {
		return err
	}
	l.Items = items
	var obj any = &l
	if name != "" {
		obj = &l.Items[0] // as kubectl: a named object prints as itself, not a List
	}
	if done, err := printStructuredTo(o.out, o.output, obj, len(items), func(i int) string {
		return r.singular + "/" + P(&items[i]).GetName()
	}); done {
		return err
	}
	if len(items) == 0 {
		noResources(o, r)
		return nil
	}
	t := newTable(o, r, cols.header, cols.wide)
	for i := range items {
		m := P(&items[i])
		cells, wide := cols.row(m)
		t.row(m.GetNamespace(), m.GetLabels(), cells, wide)
	}
	return t.flush()
}

// noResources says so on stderr, as kubectl does, so the output stays empty.
func noResources(o *getOptions, r *resource) {
	if r.namespaced && !o.allNamespaces {
		fmt.Fprintf(o.errOut, "No resources found in %s namespace.\n", o.namespace)
		return
	}
	fmt.Fprintln(o.errOut, "No resources found")
}

// table is a kubectl-style table: NAMESPACE first with -A (namespaced
// kinds), the wide columns with -o wide, LABELS last with --show-labels.
type table struct {
	w                 *tabwriter.Writer
	wide              bool
	namespace, labels bool
}

func newTable(o *getOptions, r *resource, header, wide []string) *table {
	t := &table{
		w:         tabwriter.NewWriter(o.out, 0, 8, 3, ' ', 0),
		wide:      o.output == "wide",
		namespace: r.namespaced && o.allNamespaces,
		labels:    o.showLabels && !r.showsLabel,
	}
	t.line("NAMESPACE", header, wide, "LABELS")
	return t
}

func (t *table) row(ns string, l map[string]string, cells, wide []string) {
	t.line(ns, cells, wide, orNone(labelText(l)))
}

func (t *table) line(ns string, cells, wide []string, labelCell string) {
	var out []string
	if t.namespace {
		out = append(out, ns)
	}
	out = append(out, cells...)
	if t.wide {
		out = append(out, wide...)
	}
	if t.labels {
		out = append(out, labelCell)
	}
	fmt.Fprintln(t.w, strings.Join(out, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

func getPods(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/pods", columns[*corev1.Pod]{
		header: []string{"NAME", "READY", "STATUS", "RESTARTS", "AGE"},
		wide:   []string{"IP", "NODE"},
		row: func(p *corev1.Pod) ([]string, []string) {
			ready := 0
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Ready {
					ready++
				}
			}
			return []string{p.Name, fmt.Sprintf("%d/%d", ready, len(p.Spec.Containers)), podStatus(*p), "0", age(p.CreationTimestamp.Time)},
				[]string{orNone(p.Status.PodIP), orNone(p.Spec.NodeName)}
		},
	})
}

// podStatus is kubectl's STATUS column: a terminated container's reason
// wins over the phase.
func podStatus(p corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return t.Reason
		}
	}
	if p.Status.Phase == corev1.PodSucceeded {
		return "Completed"
	}
	return string(p.Status.Phase)
}

// getNamespaces shows LABELS always (namespaceSelectors match them).
func getNamespaces(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/namespaces", columns[*corev1.Namespace]{
		header: []string{"NAME", "STATUS", "LABELS"},
		row: func(n *corev1.Namespace) ([]string, []string) {
			return []string{n.Name, string(n.Status.Phase), orNone(labelText(n.Labels))}, nil
		},
	})
}

func getNodes(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/nodes", columns[*corev1.Node]{
		header: []string{"NAME", "STATUS", "POD-CIDR", "INTERNAL-IP", "AGE"},
		row: func(n *corev1.Node) ([]string, []string) {
			status := "Unknown"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					status = map[corev1.ConditionStatus]string{corev1.ConditionTrue: "Ready", corev1.ConditionFalse: "NotReady"}[c.Status]
				}
			}
			ip := ""
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP && ip == "" {
					ip = a.Address
				}
			}
			return []string{n.Name, orNone(status), orNone(n.Spec.PodCIDR), orNone(ip), age(n.CreationTimestamp.Time)}, nil
		},
	})
}

func getServices(c *api.Client, o *getOptions, r *resource, name string) error {
	var eps discoveryv1.EndpointSliceList
	if o.output == "wide" {
		if err := c.Do("GET", "/v1/endpointslices", nil, &eps); err != nil {
			return err
		}
	}
	return getObjects(c, o, r, name, "/v1/services", columns[*corev1.Service]{
		header: []string{"NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"},
		wide:   []string{"SELECTOR", "ENDPOINTS"},
		row: func(s *corev1.Service) ([]string, []string) {
			cells := []string{s.Name, string(s.Spec.Type), orNone(s.Spec.ClusterIP), externalIPText(s), servicePortsText(s), age(s.CreationTimestamp.Time)}
			if o.output != "wide" {
				return cells, nil
			}
			return cells, []string{orNone(labelText(s.Spec.Selector)), orNone(strings.Join(readyEndpoints(eps, s.Namespace, s.Name), ","))}
		},
	})
}

// externalIPText is kubectl's EXTERNAL-IP column: the load balancer's
// ingress addresses and the externalIPs, <pending> for a LoadBalancer
// without an address yet, <none> otherwise.
func externalIPText(s *corev1.Service) string {
	var out []string
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, ing := range s.Status.LoadBalancer.Ingress {
			out = append(out, cmp.Or(ing.IP, ing.Hostname))
		}
	}
	out = append(out, s.Spec.ExternalIPs...)
	switch {
	case len(out) > 0:
		return strings.Join(out, ",")
	case s.Spec.Type == corev1.ServiceTypeLoadBalancer:
		return "<pending>"
	}
	return "<none>"
}

// servicePortsText is kubectl's PORT(S) column: port/protocol, with the
// nodePort after a colon when there is one (80:30080/TCP).
func servicePortsText(s *corev1.Service) string {
	var ports []string
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			ports = append(ports, fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol))
		} else {
			ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
	}
	return strings.Join(ports, ",")
}

// readyEndpoints lists ip:port of a service's ready endpoints, as
// kubectl's ENDPOINTS column.
func readyEndpoints(eps discoveryv1.EndpointSliceList, ns, svc string) []string {
	var out []string
	for _, sl := range eps.Items {
		if sl.Namespace != ns || sl.Labels[discoveryv1.LabelServiceName] != svc {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				for _, p := range sl.Ports {
					if p.Port != nil {
						out = append(out, fmt.Sprintf("%s:%d", a, *p.Port))
					}
				}
			}
		}
	}
	return out
}

func getEndpointSlices(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/endpointslices", columns[*discoveryv1.EndpointSlice]{
		header: []string{"NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS"},
		row: func(s *discoveryv1.EndpointSlice) ([]string, []string) {
			var ports, addrs []string
			for _, p := range s.Ports {
				if p.Port != nil {
					ports = append(ports, fmt.Sprint(*p.Port))
				}
			}
			for _, ep := range s.Endpoints {
				state := ""
				if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
					state = " (terminating)"
				} else if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					state = " (not ready)"
				}
				for _, a := range ep.Addresses {
					addrs = append(addrs, a+state)
				}
			}
			return []string{s.Name, string(s.AddressType), orNone(strings.Join(ports, ",")), orNone(strings.Join(addrs, ","))}, nil
		},
	})
}

// getNetworkPolicies prints kubectl's columns; -o wide adds the
// directions the policy isolates.
func getNetworkPolicies(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/networkpolicies", columns[*networkingv1.NetworkPolicy]{
		header: []string{"NAME", "POD-SELECTOR", "AGE"},
		wide:   []string{"POLICY-TYPES"},
		row: func(np *networkingv1.NetworkPolicy) ([]string, []string) {
			var types []string
			for _, t := range np.Spec.PolicyTypes {
				types = append(types, string(t))
			}
			return []string{np.Name, metav1.FormatLabelSelector(&np.Spec.PodSelector), age(np.CreationTimestamp.Time)},
				[]string{orNone(strings.Join(types, ","))}
		},
	})
}

// getShuntPolicies prints what a ShuntNetworkPolicy selects and its rules
// per direction by action ("2 allow, 1 deny"); -o wide adds how many HTTP
// matches the rules have.
func getShuntPolicies(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/shuntnetworkpolicies", columns[*manifest.ShuntNetworkPolicy]{
		header: []string{"NAME", "POD-SELECTOR", "INGRESS", "EGRESS", "AGE"},
		wide:   []string{"HTTP-RULES"},
		row: func(p *manifest.ShuntNetworkPolicy) ([]string, []string) {
			http := 0
			for _, rule := range append(append([]manifest.ShuntRule{}, p.Spec.Ingress...), p.Spec.Egress...) {
				http += len(rule.HTTP)
			}
			return []string{p.Name, metav1.FormatLabelSelector(&p.Spec.PodSelector), ruleSummary(p.Spec.Ingress), ruleSummary(p.Spec.Egress),
					age(p.CreationTimestamp.Time)},
				[]string{fmt.Sprint(http)}
		},
	})
}

// ruleSummary counts rules by action: "2 allow, 1 deny", "<none>".
func ruleSummary(rules []manifest.ShuntRule) string {
	allow, deny := 0, 0
	for _, r := range rules {
		if r.Action == manifest.ActionDeny {
			deny++
		} else {
			allow++
		}
	}
	var parts []string
	if allow > 0 {
		parts = append(parts, fmt.Sprintf("%d allow", allow))
	}
	if deny > 0 {
		parts = append(parts, fmt.Sprintf("%d deny", deny))
	}
	return orNone(strings.Join(parts, ", "))
}

// getHTTPRoutes prints what each route takes requests from (its parent
// Services, with the port if it names one) and where it sends them: the
// backends of each rule with their weights, rules apart by ";" (a rule
// without backends answers its requests itself: <none>). ACCEPTED
// and RESOLVED sum up the conditions the mesh controller wrote for every
// parent; -o wide adds the messages of the conditions that are not True.
func getHTTPRoutes(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/httproutes", columns[*gatewayv1.HTTPRoute]{
		header: routeHeader, wide: routeWide,
		row: func(rt *gatewayv1.HTTPRoute) ([]string, []string) {
			rules := make([][]gatewayv1.BackendRef, len(rt.Spec.Rules))
			for i, rule := range rt.Spec.Rules {
				for _, b := range rule.BackendRefs {
					rules[i] = append(rules[i], b.BackendRef)
				}
			}
			return routeRow(&rt.ObjectMeta, &rt.Spec.CommonRouteSpec, rules, &rt.Status.RouteStatus)
		},
	})
}

// getGRPCRoutes prints GRPCRoutes with getHTTPRoutes' columns.
func getGRPCRoutes(c *api.Client, o *getOptions, r *resource, name string) error {
	return getObjects(c, o, r, name, "/v1/grpcroutes", columns[*gatewayv1.GRPCRoute]{
		header: routeHeader, wide: routeWide,
		row: func(rt *gatewayv1.GRPCRoute) ([]string, []string) {
			rules := make([][]gatewayv1.BackendRef, len(rt.Spec.Rules))
			for i, rule := range rt.Spec.Rules {
				for _, b := range rule.BackendRefs {
					rules[i] = append(rules[i], b.BackendRef)
				}
			}
			return routeRow(&rt.ObjectMeta, &rt.Spec.CommonRouteSpec, rules, &rt.Status.RouteStatus)
		},
	})
}

var (
	routeHeader = []string{"NAME", "PARENTS", "BACKENDS", "ACCEPTED", "RESOLVED", "AGE"}
	routeWide   = []string{"MESSAGE"}
)

// routeRow is a route's row of either kind: its parents, its rules'
// backends (weight 1 where none is given, as the Gateway API defaults it),
// its conditions summed up, and -o wide's messages.
func routeRow(meta *metav1.ObjectMeta, spec *gatewayv1.CommonRouteSpec, rules [][]gatewayv1.BackendRef,
	status *gatewayv1.RouteStatus) ([]string, []string) {
	var parents, ruleTexts []string
	for _, p := range spec.ParentRefs {
		parents = append(parents, refText(p.Name, p.Port))
	}
	for _, refs := range rules {
		var backends []string
		for _, b := range refs {
			weight := int32(1)
			if b.Weight != nil {
				weight = *b.Weight
			}
			backends = append(backends, fmt.Sprintf("%s=%d", refText(b.Name, b.Port), weight))
		}
		ruleTexts = append(ruleTexts, orNone(strings.Join(backends, ",")))
	}
	return []string{meta.Name, orNone(strings.Join(parents, ",")), orNone(strings.Join(ruleTexts, ";")),
			routeCondition(status, gatewayv1.RouteConditionAccepted), routeCondition(status, gatewayv1.RouteConditionResolvedRefs),
			age(meta.CreationTimestamp.Time)},
		[]string{orNone(routeProblems(status))}
}

// refText is "name:port", or "name" for a reference without port.
func refText(name gatewayv1.ObjectName, port *gatewayv1.PortNumber) string {
	if port == nil {
		return string(name)
	}
	return fmt.Sprintf("%s:%d", name, *port)
}

// routeCondition sums up one condition over a route's parents: False when
// it is False for one, True when it is True for every one, Unknown
// otherwise (no status written yet).
func routeCondition(status *gatewayv1.RouteStatus, typ gatewayv1.RouteConditionType) string {
	sum := metav1.ConditionTrue
	if len(status.Parents) == 0 {
		sum = metav1.ConditionUnknown
	}
	for _, p := range status.Parents {
		switch c := meta.FindStatusCondition(p.Conditions, string(typ)); {
		case c != nil && c.Status == metav1.ConditionFalse:
			return string(metav1.ConditionFalse)
		case c == nil || c.Status != metav1.ConditionTrue:
			sum = metav1.ConditionUnknown
		}
	}
	return string(sum)
}

// routeProblems lists the messages of a route's conditions that are not
// True, each once (ResolvedRefs is the same for every parent).
func routeProblems(status *gatewayv1.RouteStatus) string {
	var msgs []string
	for _, p := range status.Parents {
		for _, c := range p.Conditions {
			if c.Status != metav1.ConditionTrue && !slices.Contains(msgs, c.Message) {
				msgs = append(msgs, c.Message)
			}
		}
	}
	return strings.Join(msgs, "; ")
}

// printStructured handles -o json|yaml|name on stdout; done is false for
// tables.
func printStructured(format string, v any, n int, name func(int) string) (done bool, err error) {
	return printStructuredTo(os.Stdout, format, v, n, name)
}

func printStructuredTo(w io.Writer, format string, v any, n int, name func(int) string) (done bool, err error) {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "    ")
		return true, enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(data)
		return true, err
	case "name":
		for i := range n {
			fmt.Fprintln(w, name(i))
		}
		return true, nil
	}
	return false, nil
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// age prints durations the way kubectl does: 45s, 3m12s, 5h, 2d.
func age(t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	d := time.Since(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 10*time.Minute:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		if d < time.Hour {
			return fmt.Sprintf("%dm", int(d.Minutes()))
		}
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}
