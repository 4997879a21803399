package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/manifest"
)

// readObjects loads and validates manifest files before anything is sent,
// so a bad file is reported with its name and nothing is applied.
func readObjects(files []string) ([]api.Object, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("no manifests: give -f FILE|DIR|-")
	}
	objs, err := manifest.Load(files, os.Stdin)
	if err != nil {
		return nil, err
	}
	out := make([]api.Object, len(objs))
	for i, o := range objs {
		raw, err := json.Marshal(o.Obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.Source, err)
		}
		out[i] = api.Object{Source: o.Source, Object: raw}
	}
	return out, nil
}

func sendObjects(g *globals, path string, files []string) ([]api.Change, error) {
	objs, err := readObjects(files)
	if err != nil {
		return nil, err
	}
	c, _, err := g.client()
	if err != nil {
		return nil, err
	}
	var resp api.ChangesResponse
	if err := c.Do("POST", path, api.ObjectsRequest{Objects: objs}, &resp); err != nil {
		return nil, err
	}
	for _, w := range resp.Warnings {
		fmt.Fprintln(os.Stderr, "Warning:", w)
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
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|-",
		Short: "create or update objects from Kubernetes manifests (all or nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			changes, err := sendObjects(g, "/v1/apply", files)
			printChanges(changes)
			return err
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	return cmd
}

func newDeleteCmd(g *globals) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "delete -f FILE|DIR|-",
		Short: "delete the objects named in Kubernetes manifests (all or nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			changes, err := sendObjects(g, "/v1/delete", files)
			printChanges(changes)
			return err
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	return cmd
}
