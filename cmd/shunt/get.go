package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/shuntnet/shunt/internal/api"
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
}

func newGetCmd(g *globals) *cobra.Command {
	o := &getOptions{}
	cmd := &cobra.Command{
		Use:   "get KIND [NAME] [-n NS|-A] [-o wide|json|yaml|name]",
		Short: "list objects with their status (pods, services, endpointslices, namespaces, identities)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch o.output {
			case "", "wide", "json", "yaml", "name":
			default:
				return fmt.Errorf("unknown output format %q: use wide, json, yaml or name", o.output)
			}
			c, _, err := g.client()
			if err != nil {
				return err
			}
			name := ""
			if len(args) == 2 {
				name = args[1]
			}
			switch strings.ToLower(args[0]) {
			case "pods", "pod", "po":
				return getPods(c, o, name)
			case "namespaces", "namespace", "ns":
				return getNamespaces(c, o, name)
			case "services", "service", "svc":
				return getServices(c, o, name)
			case "endpointslices", "endpointslice":
				return getEndpointSlices(c, o, name)
			case "identities", "identity":
				return getIdentities(c, o)
			default:
				return fmt.Errorf("unknown kind %q: use pods, services, endpointslices, namespaces or identities", args[0])
			}
		},
	}
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "default", "namespace")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list across all namespaces")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: wide, json, yaml or name")
	return cmd
}

// fetchPods returns the pods selected by namespace and name.
func fetchPods(c *api.Client, o *getOptions, name string) (*corev1.PodList, error) {
	var list corev1.PodList
	if err := c.Do("GET", "/v1/pods", nil, &list); err != nil {
		return nil, err
	}
	list.Items = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return !inScope(o, p.Namespace, p.Name, name) })
	if name != "" && len(list.Items) == 0 {
		return nil, fmt.Errorf("pods %q not found in namespace %q", name, o.namespace)
	}
	return &list, nil
}

func getPods(c *api.Client, o *getOptions, name string) error {
	list, err := fetchPods(c, o, name)
	if err != nil {
		return err
	}
	var obj any = list
	if name != "" {
		obj = &list.Items[0] // as kubectl: a named object prints as itself, not a List
	}
	if done, err := printStructured(o.output, obj, len(list.Items), func(i int) string { return "pod/" + list.Items[i].Name }); done {
		return err
	}
	w := newTable(o, "NAME\tREADY\tSTATUS\tRESTARTS\tAGE", "\tIP\tNODE")
	defer w.Flush()
	for _, p := range list.Items {
		ready := 0
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Ready {
				ready++
			}
		}
		row := fmt.Sprintf("%s\t%d/%d\t%s\t0\t%s", p.Name, ready, len(p.Spec.Containers), podStatus(p), age(p.CreationTimestamp.Time))
		if o.allNamespaces {
			row = p.Namespace + "\t" + row
		}
		if o.output == "wide" {
			row += "\t" + orNone(p.Status.PodIP) + "\t" + orNone(p.Spec.NodeName)
		}
		fmt.Fprintln(w, row)
	}
	if len(list.Items) == 0 {
		fmt.Fprintf(os.Stderr, "No resources found in %s namespace.\n", o.namespace)
	}
	return nil
}

// newTable starts a kubectl-style table: a NAMESPACE column with -A, the
// wide columns with -o wide.
func newTable(o *getOptions, header, wide string) *tabwriter.Writer {
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 3, ' ', 0)
	if o.allNamespaces {
		header = "NAMESPACE\t" + header
	}
	if o.output == "wide" {
		header += wide
	}
	fmt.Fprintln(w, header)
	return w
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

func getNamespaces(c *api.Client, o *getOptions, name string) error {
	var list corev1.NamespaceList
	if err := c.Do("GET", "/v1/namespaces", nil, &list); err != nil {
		return err
	}
	if name != "" {
		items := list.Items[:0]
		for _, n := range list.Items {
			if n.Name == name {
				items = append(items, n)
			}
		}
		if len(items) == 0 {
			return fmt.Errorf("namespaces %q not found", name)
		}
		list.Items = items
	}
	var obj any = &list
	if name != "" {
		obj = &list.Items[0]
	}
	if done, err := printStructured(o.output, obj, len(list.Items), func(i int) string { return "namespace/" + list.Items[i].Name }); done {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 3, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "NAME\tSTATUS\tLABELS")
	for _, n := range list.Items {
		fmt.Fprintf(w, "%s\t%s\t%s\n", n.Name, n.Status.Phase, orNone(labelText(n.Labels)))
	}
	return nil
}

// printStructured handles -o json|yaml|name; done is false for tables.
func printStructured(format string, v any, n int, name func(int) string) (done bool, err error) {
	switch format {
	case "json":
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "    ")
		return true, enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = os.Stdout.Write(data)
		return true, err
	case "name":
		for i := range n {
			fmt.Println(name(i))
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

func inScope(o *getOptions, ns, objName, name string) bool {
	return (o.allNamespaces || ns == o.namespace) && (name == "" || objName == name)
}

func getServices(c *api.Client, o *getOptions, name string) error {
	var list corev1.ServiceList
	if err := c.Do("GET", "/v1/services", nil, &list); err != nil {
		return err
	}
	list.Items = slices.DeleteFunc(list.Items, func(s corev1.Service) bool { return !inScope(o, s.Namespace, s.Name, name) })
	if name != "" && len(list.Items) == 0 {
		return fmt.Errorf("services %q not found in namespace %q", name, o.namespace)
	}
	var obj any = &list
	if name != "" {
		obj = &list.Items[0]
	}
	if done, err := printStructured(o.output, obj, len(list.Items), func(i int) string { return "service/" + list.Items[i].Name }); done {
		return err
	}
	var slices discoveryv1.EndpointSliceList
	if o.output == "wide" {
		if err := c.Do("GET", "/v1/endpointslices", nil, &slices); err != nil {
			return err
		}
	}
	w := newTable(o, "NAME\tTYPE\tCLUSTER-IP\tPORT(S)\tAGE", "\tSELECTOR\tENDPOINTS")
	defer w.Flush()
	for _, s := range list.Items {
		var ports []string
		for _, p := range s.Spec.Ports {
			ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", s.Name, s.Spec.Type, orNone(s.Spec.ClusterIP), strings.Join(ports, ","), age(s.CreationTimestamp.Time))
		if o.allNamespaces {
			row = s.Namespace + "\t" + row
		}
		if o.output == "wide" {
			var sel []string
			for k, v := range s.Spec.Selector {
				sel = append(sel, k+"="+v)
			}
			row += "\t" + orNone(strings.Join(sel, ",")) + "\t" + orNone(strings.Join(readyEndpoints(slices, s.Namespace, s.Name), ","))
		}
		fmt.Fprintln(w, row)
	}
	return nil
}

// readyEndpoints lists ip:port of a service's ready endpoints, as
// kubectl's ENDPOINTS column.
func readyEndpoints(slices discoveryv1.EndpointSliceList, ns, svc string) []string {
	var out []string
	for _, sl := range slices.Items {
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

func getEndpointSlices(c *api.Client, o *getOptions, name string) error {
	var list discoveryv1.EndpointSliceList
	if err := c.Do("GET", "/v1/endpointslices", nil, &list); err != nil {
		return err
	}
	list.Items = slices.DeleteFunc(list.Items, func(s discoveryv1.EndpointSlice) bool { return !inScope(o, s.Namespace, s.Name, name) })
	if done, err := printStructured(o.output, &list, len(list.Items), func(i int) string { return "endpointslice/" + list.Items[i].Name }); done {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 3, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "NAME\tADDRESSTYPE\tPORTS\tENDPOINTS")
	for _, s := range list.Items {
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.Name, s.AddressType, orNone(strings.Join(ports, ",")), orNone(strings.Join(addrs, ",")))
	}
	return nil
}
