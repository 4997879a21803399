package main

import (
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/dpinfo"
)

func newMapCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "map", Short: "inspect the datapath's BPF maps, decoded"}
	var output string
	var raw bool
	list := &cobra.Command{
		Use:   "list",
		Short: "list the datapath's maps with their fill level",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			var maps []dpinfo.MapInfo
			if err := c.Do("GET", "/v1/maps", nil, &maps); err != nil {
				return err
			}
			if done, err := printStructured(output, maps, 0, nil); done {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
			defer w.Flush()
			fmt.Fprintln(w, "NAME\tTYPE\tENTRIES\tCAPACITY\tUSED\tHOLDS")
			for _, m := range maps {
				entries, used := "-", "-"
				if m.Entries >= 0 {
					entries = fmt.Sprint(m.Entries)
					used = fmt.Sprintf("%.1f%%", 100*float64(m.Entries)/float64(m.Capacity))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", m.Name, m.Type, entries, m.Capacity, used, m.About)
			}
			return nil
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	cmd.AddCommand(list)
	dump := &cobra.Command{
		Use:   "dump services|backends|policy POD|MAP [--raw] [-o json]",
		Short: "print a map's contents as the kernel holds them, decoded (names from the agent)",
		Long: "services, backends and policy POD are summarised views; any map name from `shunt map list`\n" +
			"(e.g. shunt_ct, shunt_ipcache, shunt_endpoints) prints its entries decoded, --raw in hex.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			switch args[0] {
			case "services", "backends":
			case "policy":
				if len(args) != 2 {
					return usageError{fmt.Errorf("map dump policy needs a pod: shunt map dump policy NS/NAME")}
				}
				return dumpPolicyMap(c, args[1], output)
			default:
				return dumpRawMap(c, args[0], raw, output)
			}
			var entries []api.ServiceEntry
			if err := c.Do("GET", "/v1/maps/services", nil, &entries); err != nil {
				return err
			}
			if done, err := printStructured(output, entries, 0, nil); done {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
			defer w.Flush()
			if args[0] == "backends" {
				fmt.Fprintln(w, "BACKEND\tUSED BY")
				users := map[string][]string{}
				var order []string
				for _, e := range entries {
					for _, b := range e.Backends {
						if users[b] == nil {
							order = append(order, b)
						}
						users[b] = append(users[b], e.Service)
					}
				}
				for _, b := range order {
					fmt.Fprintf(w, "%s\t%s\n", b, strings.Join(users[b], ","))
				}
				return nil
			}
			fmt.Fprintln(w, "FRONTEND\tSERVICE\tID\tAFFINITY\tBACKENDS")
			for _, e := range entries {
				aff := "-"
				if e.Affinity > 0 {
					aff = fmt.Sprintf("ClientIP %ds", e.Affinity)
				}
				backends := strings.Join(e.Backends, ", ")
				if len(e.Backends) == 0 {
					backends = "<none: connections refused>"
				}
				fmt.Fprintf(w, "%s:%d/%s\t%s\t%d\t%s\t%s\n", e.VIP, e.Port, e.Protocol, orNone(e.Service), e.ID, aff, backends)
			}
			return nil
		},
	}
	dump.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	dump.Flags().BoolVar(&raw, "raw", false, "keys and values in hex, as the kernel holds them")
	cmd.AddCommand(dump)
	flush := &cobra.Command{
		Use:   "flush conntrack|nat|affinity|MAP...",
		Short: "empty maps of per-connection state (connection tracking, translations, affinity): the programs rebuild them from the next packets",
		Long: `Flush deletes every entry a map holds now, as conntrack -F does for netfilter.
What it does to the traffic, per group:
  conntrack  shunt_ct, shunt_ct_new: every connection is recorded anew from its next
             packet, whichever end sends it: one policy admits either way goes on,
             one it refuses both ways ends. Policy decides a connection at its
             start, so a pod quarantined by a policy keeps the connections it had
             open until this flush, which ends them. Connections accelerated
             between local sockets (shunt accel) leave the redirect at their
             next send and take the stack, where they are judged the same way
             (counted accel-untracked). With native routing, another node's
             proxy connecting for its client is judged as remote-node then:
             the client's identity rode only its SYN (identity-carried).
  nat        shunt_tc_nat, shunt_masq_nat, shunt_nodeport_nat: connections translated
             in tc (NodePort, load balancer, externalIPs, masquerade, the tc fallback)
             lose their translation; most of them end. Connections the socket layer
             translated (pods and the node to a ClusterIP) keep theirs.
  affinity   shunt_affinity: ClientIP clients get a backend chosen anew.
A map name flushes that map alone. The maps the agent writes from the desired
state (services, endpoints, policy, ...) are refused: shunt sync repairs those.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, a := range args {
				if group, ok := dpinfo.FlushGroups[a]; ok {
					names = append(names, group...)
				} else {
					names = append(names, a)
				}
			}
			c, _, err := g.client()
			if err != nil {
				return err
			}
			var done []dpinfo.MapFlush
			for _, name := range names {
				var res dpinfo.MapFlush
				if err := c.Do("POST", "/v1/maps/"+url.PathEscape(name)+"/flush", nil, &res); err != nil {
					if len(done) > 0 {
						printFlushed(os.Stdout, done)
					}
					return err
				}
				done = append(done, res)
			}
			if ok, err := printStructured(output, done, 0, nil); ok {
				return err
			}
			printFlushed(os.Stdout, done)
			return nil
		},
	}
	flush.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	cmd.AddCommand(flush)
	return cmd
}

// printFlushed says, per map, how many entries a flush removed.
func printFlushed(out io.Writer, done []dpinfo.MapFlush) {
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "MAP\tREMOVED")
	for _, f := range done {
		fmt.Fprintf(w, "%s\t%d\n", f.Map, f.Removed)
	}
}

// dumpRawMap prints any map: one row per entry, one column per field.
func dumpRawMap(c *api.Client, name string, raw bool, output string) error {
	path := "/v1/maps/" + url.PathEscape(name)
	if raw {
		path += "?raw=true"
	}
	var rows []map[string]any
	if err := c.Do("GET", path, nil, &rows); err != nil {
		return err
	}
	if done, err := printStructured(output, rows, 0, nil); done {
		return err
	}
	cols := map[string]bool{}
	for _, r := range rows {
		for k := range r {
			cols[k] = true
		}
	}
	order := slices.Sorted(maps.Keys(cols))
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, strings.ToUpper(strings.Join(order, "\t")))
	for _, r := range rows {
		vals := make([]string, len(order))
		for i, k := range order {
			if v, ok := r[k]; ok {
				vals[i] = cellText(v)
			} else {
				vals[i] = "-"
			}
		}
		fmt.Fprintln(w, strings.Join(vals, "\t"))
	}
	if len(rows) == 0 {
		fmt.Fprintf(os.Stderr, "%s is empty\n", name)
	}
	return nil
}

// cellText prints a decoded JSON value; numbers as JSON wrote them (a
// float64 would print 16651037 as 1.6651037e+07).
func cellText(v any) string {
	if f, ok := v.(float64); ok {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

func newMetricsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "metrics",
		Short: "print the agent's Prometheus metrics (what /metrics serves)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			return c.Stream("/metrics", func(line []byte) error {
				_, err := fmt.Printf("%s\n", line)
				return err
			})
		},
	}
}
