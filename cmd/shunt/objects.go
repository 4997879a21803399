package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

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

// argsSource names objects given on the command line in the agent's
// messages, as "<stdin>" names those read from stdin.
const argsSource = "<args>"

// referenceObjects names objects of one kind by name for a delete: what a
// three-line manifest says (apiVersion, kind, metadata), as kubectl's
// `delete KIND NAME` does.
func referenceObjects(kind, namespace string, names []string) ([]api.Object, error) {
	r, err := lookupResource(kind)
	if err != nil {
		return nil, err
	}
	apiVersion, ok := manifest.APIVersion(r.kind)
	if !ok {
		return nil, fmt.Errorf("%s are not objects and cannot be deleted", r.name)
	}
	out := make([]api.Object, len(names))
	for i, name := range names {
		metadata := map[string]string{"name": name}
		if r.namespaced {
			metadata["namespace"] = namespace
		}
		ref, err := json.Marshal(map[string]any{"apiVersion": apiVersion, "kind": r.kind, "metadata": metadata})
		if err != nil {
			return nil, err
		}
		out[i] = api.Object{Source: argsSource, Object: ref}
	}
	return out, nil
}

// sendObjects sends the objects to the agent; with timing, it tells how
// long the agent took (programming time, without this process' start).
func sendObjects(g *globals, path string, objs []api.Object, timing bool) ([]api.Change, error) {
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
			objs, err := readObjects(files)
			if err != nil {
				return err
			}
			changes, err := sendObjects(g, "/v1/apply", objs, timing)
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
	var namespace string
	var timing bool
	cmd := &cobra.Command{
		Use:   "delete (-f FILE|DIR|- | KIND NAME...) [-n NS]",
		Short: "delete objects named in Kubernetes manifests or by kind and name (all or nothing)",
		Long: "Delete the objects named in manifests (-f), or objects of one KIND by NAME, as kubectl does.\n" +
			"KIND is any kind `shunt get` lists, by any of its names, except identities.",
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(files) > 0 && len(args) > 0:
				return fmt.Errorf("give either -f FILE or KIND NAME, not both")
			case len(files) == 0 && len(args) < 2:
				return fmt.Errorf("give -f FILE|DIR|- or KIND NAME...")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var objs []api.Object
			var err error
			if len(args) > 0 {
				objs, err = referenceObjects(args[0], namespace, args[1:])
			} else {
				objs, err = readObjects(files)
			}
			if err != nil {
				return err
			}
			changes, err := sendObjects(g, "/v1/delete", objs, timing)
			printChanges(changes)
			return err
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the objects named by KIND NAME")
	cmd.Flags().BoolVar(&timing, "timing", false, "print how long the agent took (check, program, persist) on stderr")
	return cmd
}

func newWaitCmd(g *globals) *cobra.Command {
	var files []string
	var deleted bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait -f FILE|DIR|- [--deleted]",
		Short: "wait until this node's datapath reflects objects changed through the API server",
		Long: "Objects changed through a Kubernetes API server reach the node a moment later. `shunt wait` returns once\n" +
			"each object is on this node at the resourceVersion given (or later), or gone with --deleted, and the\n" +
			"datapath has been programmed from it:\n\n" +
			"  kubectl apply -f policy.yaml -o json | shunt wait -f -\n" +
			"  kubectl delete -f policy.yaml && shunt wait --deleted -f policy.yaml",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			objs, err := readObjects(files)
			if err != nil {
				return err
			}
			c, _, err := g.client()
			if err != nil {
				return err
			}
			body, err := api.EncodeObjects(objs)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
			defer cancel()
			path := fmt.Sprintf("/v1/wait?timeout=%s&deleted=%t", timeout, deleted)
			return c.DoContext(ctx, "POST", path, body, nil)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "objects as the API server returned them (kubectl -o json|yaml), or manifests; - for stdin (repeatable)")
	cmd.Flags().BoolVar(&deleted, "deleted", false, "wait until the objects are gone from this node")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}
