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
