package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/manifest"
)

// readObjects reads manifest files into documents for the agent, which
// decodes and validates them (it is the API server: every client's input
// is checked there, once). Syntax errors are reported here, with the file,
// and nothing is sent.
func readObjects(files []string) ([]api.Object, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("no manifests: give -f FILE|DIR|-")
	}
	docs, err := manifest.ReadDocuments(files, os.Stdin)
	if err != nil {
		return nil, err
	}
	out := make([]api.Object, len(docs))
	for i, d := range docs {
		out[i] = api.Object{Source: d.Source, Object: d.JSON}
	}
	return out, nil
}

// sendObjects sends the manifests to the agent; with timing, it tells how
// long the agent took (programming time, without this process' start).
func sendObjects(g *globals, path string, files []string, timing bool) ([]api.Change, error) {
	objs, err := readObjects(files)
	if err != nil {
		return nil, err
	}
	c, _, err := g.client()
	if err != nil {
		return nil, err
	}
	body, err := api.EncodeObjects(objs)
	if err != nil {
		return nil, err
	}
	var resp api.ChangesResponse
	if err := c.Do("POST", path, body, &resp); err != nil {
		return nil, err
	}
	for _, w := range resp.Warnings {
		fmt.Fprintln(os.Stderr, "Warning:", w)
	}
	if timing {
		fmt.Fprintf(os.Stderr, "agent took %.3f ms\n", resp.TookMs)
	}
	return resp.Changes, nil
}

func printChanges(changes []api.Change) {
	for _, ch := range changes {
		fmt.Printf("%s %s\n", kubectlName(ch.Key), ch.Action)
	}
}

func newApplyCmd(g *globals) *cobra.Command {
	var files []string
	var timing bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|-",
		Short: "create or update objects from Kubernetes manifests (all or nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			changes, err := sendObjects(g, "/v1/apply", files, timing)
			printChanges(changes)
			return err
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	cmd.Flags().BoolVar(&timing, "timing", false, "print how long the agent took (check, program, persist) on stderr")
	return cmd
}

func newDeleteCmd(g *globals) *cobra.Command {
	var files []string
	var timing bool
	cmd := &cobra.Command{
		Use:   "delete -f FILE|DIR|-",
		Short: "delete the objects named in Kubernetes manifests (all or nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			changes, err := sendObjects(g, "/v1/delete", files, timing)
			printChanges(changes)
			return err
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	cmd.Flags().BoolVar(&timing, "timing", false, "print how long the agent took (check, program, persist) on stderr")
	return cmd
}
