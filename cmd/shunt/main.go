// Command shunt is the CLI of shunt: it drives the local lab, applies
// Kubernetes manifests to the node agent and shows what the dataplane does.
// Its habits are kubectl's: get/apply/delete, -n/-A, -o wide|json|yaml.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/instance"
)

// exitError carries a command's exit code through cobra (lab exec passes
// the executed command's code through).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError exits with code 2, as a bad invocation.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

func main() {
	err := newRootCmd().Execute()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// globals are the flags every command shares.
type globals struct {
	instance string
	socket   string // the agent's socket, when not the instance's (tests)
}

func (g *globals) inst() (instance.Instance, error) { return instance.New(g.instance) }

func (g *globals) client() (*api.Client, instance.Instance, error) {
	i, err := g.inst()
	if err != nil {
		return nil, i, err
	}
	if g.socket != "" {
		return api.NewClient(g.socket), i, nil
	}
	return api.NewClient(i.Socket()), i, nil
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "shunt",
		Short:         "shunt: an eBPF dataplane for container and Kubernetes networking",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	def := os.Getenv("SHUNT_INSTANCE")
	if def == "" {
		def = instance.Default
	}
	root.PersistentFlags().StringVar(&g.instance, "instance", def, "shunt node (lab) to talk to (env SHUNT_INSTANCE)")
	root.AddCommand(
		newLabCmd(g),
		newApplyCmd(g),
		newDeleteCmd(g),
		newWaitCmd(g),
		newGetCmd(g),
		newStatusCmd(g),
		newMapCmd(g),
		newPolicyCmd(g),
		newObserveCmd(g),
		newRelayCmd(g),
		newNodeCmd(g),
		newUICmd(g),
		newFlowSamplingCmd(g),
		newMetricsCmd(g),
		newProxyCmd(g),
		newAccelCmd(g),
		newSyncCmd(g),
		newUninstallCmd(g),
		newDevCmd(),
	)
	return root
}
