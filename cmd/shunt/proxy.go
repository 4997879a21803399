package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
)

// newProxyCmd groups the node L7 proxy's commands.
func newProxyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "proxy", Short: "the node L7 proxy (HTTP policy, routes)"}
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "the proxy's health and configuration version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			var st api.Status
			if err := c.Do("GET", "/v1/status", nil, &st); err != nil {
				return err
			}
			fmt.Println(proxyLine(st.Proxy))
			return nil
		},
	}, &cobra.Command{
		Use:   "restart",
		Short: "start a new proxy, then drain the old one (connections not in flight on it lose nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			var st api.ProxyStatus
			if err := c.Do("POST", "/v1/proxy/restart", nil, &st); err != nil {
				return err
			}
			fmt.Println(proxyLine(&st))
			return nil
		},
	})
	return cmd
}

// proxyLine is the proxy's one-line summary in `shunt status`.
func proxyLine(p *api.ProxyStatus) string {
	if p == nil {
		return "none"
	}
	health := "healthy"
	if !p.Healthy {
		health = "DOWN: " + p.Error
	} else if p.Version < p.WantedVersion {
		health = "configuring"
		if p.Error != "" {
			health += ": " + p.Error
		}
	}
	return fmt.Sprintf("%s on %s (pid %d), config %d, %d routes, %d HTTP-policy ports, %d redirected destinations, %d requests, %d connections",
		health, p.Listen, p.PID, p.Version, p.Routes, p.Policies, p.Redirected, p.Requests, p.Active)
}

// newAccelCmd shows or switches socket acceleration.
func newAccelCmd(g *globals) *cobra.Command {
	var nodeProcesses, withoutBackpressure bool
	cmd := &cobra.Command{
		Use:   "accel [on|off]",
		Short: "show or switch socket acceleration (sockops + sk_msg) for new local TCP connections",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			var st api.AccelStatus
			if len(args) == 0 {
				var s api.Status
				if err := c.Do("GET", "/v1/status", nil, &s); err != nil {
					return err
				}
				st = s.Accel
			} else {
				on := map[string]string{"on": "true", "off": "false"}[args[0]]
				if on == "" {
					return usageError{fmt.Errorf("accel %q: want on or off", args[0])}
				}
				q := fmt.Sprintf("/v1/accel?on=%s&nodeProcesses=%t&withoutBackpressure=%t", on, nodeProcesses, withoutBackpressure)
				if err := c.Do("POST", q, nil, &st); err != nil {
					return err
				}
			}
			fmt.Println(accelLine(st))
			return nil
		},
	}
	cmd.Flags().BoolVar(&nodeProcesses, "node-processes", false, "with on: also the node's own processes (host network namespace), not only pods and the node proxy")
	cmd.Flags().BoolVar(&withoutBackpressure, "without-backpressure", false, "with on: also on a kernel that cannot hold a fast writer back (no msg_tot_len in struct sk_psock, e.g. Linux 6.1), where a writer faster than its reader gets ENOMEM; refused there without it")
	return cmd
}

func accelLine(a api.AccelStatus) string {
	if !a.Enabled {
		line := fmt.Sprintf("off (%d sockets still accelerated)", a.Sockets)
		if a.Refused != "" {
			line += "; asked for at start but refused: " + a.Refused
		}
		return line
	}
	who := "pods and the node proxy"
	if a.NodeProcesses {
		who = "pods, the node proxy and node processes"
	}
	line := fmt.Sprintf("on for %s, %d sockets accelerated", who, a.Sockets)
	if a.Caveat != "" {
		line += "; " + a.Caveat
	}
	return line
}
