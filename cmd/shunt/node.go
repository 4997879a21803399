package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/kubeproxy"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "checks of the node this runs on",
	}
	cmd.AddCommand(newNodeCheckCmd(g))
	return cmd
}

// nodeCheck is what `shunt node check` found.
type nodeCheck struct {
	KubeProxy     string `json:"kubeProxy"`     // kube-proxy's rules found
	KubeProxyLive bool   `json:"kubeProxyLive"` // they translate Services
	Agent         bool   `json:"agent"`         // shunt's agent answers (--instance)
	// BesideKubeProxy: the agent leaves NodePorts to kube-proxy
	// (--kube-proxy-replacement=false), so both running is the plan.
	BesideKubeProxy bool   `json:"besideKubeProxy,omitempty"`
	CNI             string `json:"cni"`        // the node's first CNI configuration ("" none)
	CNIPlugins      string `json:"cniPlugins"` // its plugin types
	Verdict         string `json:"verdict"`
	OK              bool   `json:"ok"`
}

func newNodeCheckCmd(g *globals) *cobra.Command {
	var confDir, output string
	cmd := &cobra.Command{
		Use:   "check [--cni-conf-dir DIR] [-o json]",
		Short: "say who translates Services on this node (kube-proxy, shunt, both or none) and which CNI network pods get: run before and after migrating a node",
		Long: "Reads this network namespace's netfilter for kube-proxy's rules (its nftables table, its\n" +
			"iptables chains), asks shunt's agent of --instance whether it runs, and reads the node's first\n" +
			"CNI configuration (the one the container runtime uses). Exit 0 when exactly one of kube-proxy\n" +
			"and shunt translates Services, or when shunt runs beside kube-proxy as told\n" +
			"(--kube-proxy-replacement=false: ClusterIPs shunt's, NodePorts kube-proxy's); 1 when both\n" +
			"translate every Service (they would fight) or nothing serves them.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "json" {
				return usageError{fmt.Errorf("unknown output %q: use json or leave it out", output)}
			}
			var c nodeCheck
			rules, err := kubeproxy.Detect()
			if err != nil {
				return err
			}
			c.KubeProxy, c.KubeProxyLive = rules.String(), rules.Live()
			client, _, err := g.client()
			if err != nil {
				return err
			}
			c.Agent = client.Alive()
			if c.Agent {
				var st api.Status
				if err := client.Do("GET", "/v1/status", nil, &st); err != nil {
					return fmt.Errorf("shunt's agent answers but its status does not: %w", err)
				}
				c.BesideKubeProxy = st.ExternalByKubeProxy
			}
			c.CNI, c.CNIPlugins = firstCNIConfig(confDir)
			switch {
			case c.Agent && c.BesideKubeProxy && c.KubeProxyLive:
				c.Verdict, c.OK = "shunt translates ClusterIPs, kube-proxy NodePorts, load balancer addresses and externalIPs (shunt's --kube-proxy-replacement=false)", true
			case c.Agent && c.BesideKubeProxy:
				c.Verdict = "shunt translates ClusterIPs and leaves NodePorts to kube-proxy (--kube-proxy-replacement=false), but kube-proxy's rules are not here: nothing serves NodePorts, load balancer addresses and externalIPs; start kube-proxy or restart shunt's agent with --kube-proxy-replacement=true"
			case c.KubeProxyLive && c.Agent:
				c.Verdict = "both kube-proxy and shunt translate Services: stop kube-proxy on this node and restart shunt's agent with --remove-kube-proxy-rules"
			case c.KubeProxyLive:
				c.Verdict, c.OK = "kube-proxy translates Services (shunt's agent does not run)", true
			case c.Agent:
				c.Verdict, c.OK = "shunt translates Services (no rules of kube-proxy)", true
			default:
				c.Verdict = "nothing translates Services on this node: neither kube-proxy's rules nor shunt's agent"
			}
			if c.Agent && !strings.Contains(c.CNIPlugins, "shunt-cni") && c.CNI != "" {
				c.Verdict += fmt.Sprintf("; new pods get the network of %s (%s), not shunt's", c.CNI, c.CNIPlugins)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				json.NewEncoder(out).Encode(c)
			} else {
				fmt.Fprintf(out, "kube-proxy: %s\n", c.KubeProxy)
				fmt.Fprintf(out, "shunt agent: %s\n", map[bool]string{true: "running", false: "not running"}[c.Agent])
				cni := "no configuration in " + confDir
				if c.CNI != "" {
					cni = c.CNI + " (" + c.CNIPlugins + ")"
				}
				fmt.Fprintf(out, "CNI: %s\n", cni)
				fmt.Fprintf(out, "verdict: %s\n", c.Verdict)
			}
			if !c.OK {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&confDir, "cni-conf-dir", "/etc/cni/net.d", "the node's CNI configuration directory")
	cmd.Flags().StringVarP(&output, "output", "o", "", "json: the findings as one JSON object")
	return cmd
}

// firstCNIConfig is the configuration a container runtime takes from dir
// (the lexically first .conflist, .conf or .json, as libcni lists them)
// and its plugins' types.
func firstCNIConfig(dir string) (file, plugins string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", ""
	}
	var names []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".conflist", ".conf", ".json":
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return "", ""
	}
	slices.Sort(names)
	path := filepath.Join(dir, names[0])
	data, err := os.ReadFile(path)
	if err != nil {
		return path, "unreadable: " + err.Error()
	}
	var conf struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		return path, "not JSON: " + err.Error()
	}
	var types []string
	if conf.Type != "" {
		types = append(types, conf.Type)
	}
	for _, p := range conf.Plugins {
		types = append(types, p.Type)
	}
	return path, strings.Join(types, ", ")
}
