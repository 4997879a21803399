package main

import (
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/policy"
)

func newPolicyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "explain network policy decisions"}
	var from, to, port, output, method, path string
	trace := &cobra.Command{
		Use:   "trace --from POD|IP --to POD|IP --port N[/tcp|udp|sctp] [--http-method M --http-path P]",
		Short: "say whether a new connection would be allowed, and which policy rule decides (no traffic is sent)",
		Long: "Evaluates the sender's egress and the receiver's ingress policy against the policy state the\n" +
			"datapath holds. PODs are ns/name (or a name in the default namespace). Exits 1 when denied,\n" +
			"as `kubectl auth can-i` does.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" || to == "" || port == "" {
				return usageError{fmt.Errorf("policy trace needs --from, --to and --port")}
			}
			c, _, err := g.client()
			if err != nil {
				return err
			}
			q := url.Values{"from": {from}, "to": {to}, "port": {port}}
			if method != "" || path != "" {
				q.Set("http-method", method)
				q.Set("http-path", path)
			}
			var t policy.Trace
			if err := c.Do("GET", "/v1/policy/trace?"+q.Encode(), nil, &t); err != nil {
				return err
			}
			if done, err := printStructured(output, t, 0, nil); !done {
				printTrace(t)
			} else if err != nil {
				return err
			}
			if t.Verdict != "allowed" {
				return exitError{1}
			}
			return nil
		},
	}
	trace.Flags().StringVar(&from, "from", "", "sending pod (ns/name) or address")
	trace.Flags().StringVar(&to, "to", "", "receiving pod (ns/name) or address")
	trace.Flags().StringVar(&port, "port", "", "destination port and protocol, e.g. 80, 53/udp")
	trace.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	trace.Flags().StringVar(&method, "http-method", "", "also decide this HTTP request (with --http-path) as the node proxy would")
	trace.Flags().StringVar(&path, "http-path", "", "the HTTP request's path (default /)")
	cmd.AddCommand(trace)
	return cmd
}

func peerText(p policy.Peer) string {
	if p.Pod != "" {
		return fmt.Sprintf("%s (%s)", p.Pod, p.IP)
	}
	return p.IP.String()
}

func printTrace(t policy.Trace) {
	proto := dpinfo.ProtoName(t.Proto)
	verdict := strings.ToUpper(t.Verdict)
	if t.Reason != "" {
		verdict += " (" + t.Reason + ")"
	}
	fmt.Printf("%s -> %s %d/%s: %s\n", peerText(t.From), peerText(t.To), t.Port, proto, verdict)
	for _, s := range t.Steps {
		fmt.Printf("  %-7s of %s: %s\n", s.Direction, s.Pod, s.Explanation)
	}
	if len(t.Steps) == 0 {
		fmt.Println("  neither end is a pod of this node: no policy applies here")
	}
}

// getIdentities lists the policy identities; -l selects by their labels.
func getIdentities(c *api.Client, o *getOptions, r *resource, _ string) error {
	var ids []policy.Identity
	if err := c.Do("GET", "/v1/identities", nil, &ids); err != nil {
		return err
	}
	ids = slices.DeleteFunc(ids, func(id policy.Identity) bool { return !o.sel.Matches(labels.Set(id.Labels)) })
	if done, err := printStructuredTo(o.out, o.output, ids, 0, nil); done {
		return err
	}
	if len(ids) == 0 {
		noResources(o, r)
		return nil
	}
	w := tabwriter.NewWriter(o.out, 0, 8, 3, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "ID\tNAMESPACE\tLABELS\tPODS")
	for _, id := range ids {
		if id.Reserved != "" {
			fmt.Fprintf(w, "%d\t-\treserved:%s\t-\n", id.ID, id.Reserved)
			continue
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", id.ID, id.Namespace, orNone(labelText(id.Labels)), strings.Join(id.Pods, ","))
	}
	return nil
}

func labelText(l map[string]string) string {
	var out []string
	for k, v := range l {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func dumpPolicyMap(c *api.Client, pod, output string) error {
	var m api.PolicyMap
	if err := c.Do("GET", "/v1/maps/policy?"+url.Values{"pod": {pod}}.Encode(), nil, &m); err != nil {
		return err
	}
	if done, err := printStructured(output, m, 0, nil); done {
		return err
	}
	iso := func(by []string) string {
		if len(by) == 0 {
			return "not isolated (all allowed)"
		}
		return "isolated by " + strings.Join(by, ", ")
	}
	fmt.Printf("pod %s (%s), identity %d\ningress: %s\negress:  %s\n\n", m.Pod, m.IP, m.Identity,
		iso(m.IngressIsolatedBy), iso(m.EgressIsolatedBy))
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "DIRECTION\tIDENTITY\tPEER\tPORTS\tVERDICT\tRULE")
	for _, e := range m.Entries {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\n", e.Direction, e.Identity, e.Peer, e.Ports, e.Verdict, orNone(e.Rule))
	}
	return nil
}
