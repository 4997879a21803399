package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
)

// newSyncCmd: `shunt sync --verify` asks the agent to compare the kernel's
// maps with the desired state now and repair what differs.
func newSyncCmd(g *globals) *cobra.Command {
	var verify, dryRun bool
	var output string
	cmd := &cobra.Command{
		Use:   "sync --verify [--dry-run] [-o json]",
		Short: "compare the maps the agent fully determines with the desired state now, print what differs and repair it",
		Long: "The agent compares every map whose content it decides (services, backends, policy, ipcache, endpoints,\n" +
			"L7 redirects, masquerade exclusions, configuration) with what its last sync wrote, between two syncs,\n" +
			"prints each entry that differs (map, key, expected, found), rewrites or deletes it, and counts it\n" +
			"(shunt_drift_repaired_total, `shunt status`). It does the same every --drift-check-period on its own.\n" +
			"Runtime state (conntrack, NAT, affinity, reverse NAT, sockets, flows) is not compared.\n\n" +
			"Exit status: 0 when every map was as the agent wrote it, 1 when something differed (repaired, or\n" +
			"only reported with --dry-run) or the comparison failed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !verify {
				return usageError{errors.New("shunt sync needs --verify: it compares the maps with the desired state (the agent syncs changes on its own)")}
			}
			c, inst, err := g.client()
			if err != nil {
				return err
			}
			path := api.PathVerify
			if dryRun {
				path += "?dryRun=true"
			}
			clients, names := []*api.Client{c}, []string{""}
			if insts, layout, err := nodeInstances(inst); err != nil {
				return err
			} else if layout != nil && g.socket == "" {
				// A lab of several nodes: every node's agent, in turn.
				clients, names = nil, nil
				for i, n := range layout.Nodes {
					clients, names = append(clients, api.NewClient(insts[i].Socket())), append(names, n.Name)
				}
			}
			var all []api.VerifyResponse
			var errs []error
			differed := false
			for i, c := range clients {
				var resp api.VerifyResponse
				if err := c.Do("POST", path, nil, &resp); err != nil {
					if names[i] != "" {
						err = fmt.Errorf("node %s: %w", names[i], err)
					}
					errs = append(errs, err)
					continue
				}
				all = append(all, resp)
				differed = differed || resp.Differs()
				if output == "" {
					if names[i] != "" {
						fmt.Printf("== node %s ==\n", names[i])
					}
					printVerify(os.Stdout, resp)
				}
			}
			if output != "" {
				var v any = all
				if len(clients) == 1 && len(all) == 1 {
					v = all[0]
				}
				if _, err := printStructured(output, v, 0, nil); err != nil {
					errs = append(errs, err)
				}
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			if differed {
				return exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&verify, "verify", false, "compare the maps with the desired state now (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "with --verify: only report what differs, repair nothing (the next periodic check will)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	return cmd
}

// printVerify prints one agent's comparison for people.
func printVerify(w io.Writer, r api.VerifyResponse) {
	entries := 0
	for _, n := range r.Checked {
		entries += n
	}
	for _, m := range slices.Sorted(maps.Keys(r.Skipped)) {
		fmt.Fprintf(w, "not compared: %s: %s\n", m, r.Skipped[m])
	}
	if !r.Differs() {
		fmt.Fprintf(w, "no differences: %d entries in %d maps as the agent wrote them (%.1f ms)\n",
			entries, len(r.Checked), float64(r.Took.Microseconds())/1000)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "MAP\tKEY\tEXPECTED\tFOUND")
	for _, e := range r.Entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Map, e.Key, orAbsent(e.Expected), orAbsent(e.Found))
	}
	tw.Flush()
	counts := r.DifferingByMap()
	what := "repaired"
	if r.DryRun {
		what = "differ (dry run: left as they are)"
	}
	fmt.Fprintf(w, "%d entries %s (%d expected in %d maps): %s\n", len(r.Entries), what, entries, len(r.Checked), strings.Join(counts, ", "))
}

// driftLine is the drift checks' line of `shunt status`.
func driftLine(d *api.DriftStatus) string {
	if d == nil {
		return "unknown (an older agent)"
	}
	s := "only on demand (shunt sync --verify)"
	if d.PeriodSeconds > 0 {
		s = fmt.Sprintf("every %s", time.Duration(d.PeriodSeconds*float64(time.Second)))
	}
	if d.Checks == 0 {
		return s + ", not checked yet"
	}
	s += fmt.Sprintf(", last %s ago (%.1f ms), %d checks", time.Since(d.LastCheck).Round(time.Second), d.LastTookMs, d.Checks)
	if d.LastError != "" {
		s += ", last FAILED: " + d.LastError
	}
	if len(d.Repaired) == 0 {
		return s + "; nothing repaired"
	}
	var counts []string
	for _, m := range slices.Sorted(maps.Keys(d.Repaired)) {
		counts = append(counts, fmt.Sprintf("%s %d", m, d.Repaired[m]))
	}
	return s + "; repaired " + strings.Join(counts, ", ")
}

func orAbsent(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}
