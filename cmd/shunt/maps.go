package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
)

func newMapCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "map", Short: "inspect the datapath's BPF maps, decoded"}
	var output string
	dump := &cobra.Command{
		Use:   "dump services|backends|policy POD [-o json]",
		Short: "print a map's contents as the kernel holds them",
		Args:  cobra.RangeArgs(1, 2),
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
				return fmt.Errorf("unknown map %q: use services, backends or policy", args[0])
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
	cmd.AddCommand(dump)
	return cmd
}
