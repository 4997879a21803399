package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/flows"
)

func newObserveCmd(g *globals) *cobra.Command {
	var (
		f                         flows.Filter
		pod, from, to, since, out string
		port                      uint16
		last                      int
		follow, allNodes          bool
		node, relayAddr, relayTLS string
	)
	cmd := &cobra.Command{
		Use:   "observe [-f] [--pod P] [--verdict DROPPED|FORWARDED|TRANSLATED|REDIRECTED] [filters] [-o compact|table|json]",
		Short: "show the datapath's flows: who talked to whom, what was dropped and why",
		Long: "Prints the flows the agent keeps (the last 20 unless --last says otherwise) and, with -f,\n" +
			"follows new ones. Pods are NAMESPACE/NAME, or NAME in --namespace (default: default).\n" +
			"What the datapath reports is set with `shunt flow-sampling`\n" +
			"(default: " + dpinfo.FlowModeDefaultReports + ").\n" +
			"-o json prints one flow per line, stable fields:\n" +
			flows.JSONFields() + ".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch out {
			case "compact", "table", "json":
			default:
				return usageError{fmt.Errorf("unknown output %q: use compact, table or json", out)}
			}
			ns := f.Namespace
			qualify := func(p string) string {
				if p == "" || strings.Contains(p, "/") {
					return p
				}
				if ns == "" {
					return "default/" + p
				}
				return ns + "/" + p
			}
			f.Pod, f.FromPod, f.ToPod = qualify(pod), qualify(from), qualify(to)
			if pod != "" || from != "" || to != "" {
				f.Namespace = "" // it qualified the pod names
			}
			f.Port = port
			if since != "" {
				if d, err := time.ParseDuration(since); err == nil {
					f.Since = time.Now().Add(-d)
				} else if t, err := time.Parse(time.RFC3339, since); err == nil {
					f.Since = t
				} else {
					return usageError{fmt.Errorf("bad --since %q: give a duration (5m) or an RFC 3339 time", since)}
				}
			}
			q := f.Query()
			if _, err := flows.ParseFilter(q); err != nil {
				return usageError{err}
			}
			if last == 0 && !follow && since == "" {
				last = 20
			}
			if last > 0 {
				q.Set("last", fmt.Sprint(last))
			}
			if follow {
				q.Set("follow", "true")
			}
			var streams []flowStream
			var err error
			many := true
			if allNodes {
				if streams, err = relayStream(relayAddr, relayTLS); err != nil {
					return err
				}
			} else if streams, many, err = flowStreams(g, node); err != nil {
				return err
			}
			var tw *tabwriter.Writer
			if out == "table" {
				tw = tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
				fmt.Fprintln(tw, "TIME\tSOURCE\tDESTINATION\tPROTO\tVERDICT\tSUMMARY")
				if follow {
					tw.Flush()
				}
			}
			err = mergeFlows(streams, "/v1/flows?"+q.Encode(), follow, last, func(line []byte, fl flows.Flow) error {
				if allNodes && node != "" && fl.Node != node {
					return nil
				}
				if out == "json" {
					_, err := fmt.Printf("%s\n", line)
					return err
				}
				where := ""
				if many {
					where = "[" + fl.Node + "] "
				}
				if tw != nil {
					fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\n", where, fl.Time.Local().Format("15:04:05.000"),
						endpointText(fl.Source), endpointText(fl.Destination), fl.Protocol, fl.Verdict, summary(fl))
					if follow {
						tw.Flush()
					}
					return nil
				}
				fmt.Println(where + compact(fl))
				return nil
			})
			if tw != nil {
				tw.Flush()
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing new flows")
	fl.IntVar(&last, "last", 0, "only the last N flows of the history (default 20 without -f or --since)")
	fl.StringVar(&pod, "pod", "", "flows from or to this pod")
	fl.StringVarP(&f.Namespace, "namespace", "n", "", "flows from or to pods of this namespace (and the namespace of bare pod names)")
	fl.StringVar(&from, "from-pod", "", "flows from this pod")
	fl.StringVar(&to, "to-pod", "", "flows to this pod")
	fl.StringVar(&f.Verdict, "verdict", "", "FORWARDED, DROPPED, TRANSLATED or REDIRECTED")
	fl.StringVar(&f.Protocol, "protocol", "", "TCP, UDP, ICMP, SCTP, or HTTP (the node proxy's requests)")
	fl.StringVar(&f.HTTPStatus, "http-status", "", "HTTP requests with this status (403), class (5xx) or 0 (no response)")
	fl.StringVar(&f.HTTPMethod, "http-method", "", "HTTP requests with this method")
	fl.StringVar(&f.HTTPPath, "http-path", "", "HTTP requests whose path starts with this")
	fl.Uint16Var(&port, "port", 0, "source, destination or service port")
	fl.StringVar(&f.Service, "service", "", "flows translated from this service (NAMESPACE/NAME)")
	fl.StringVar(&since, "since", "", "flows since a duration ago (5m) or an RFC 3339 time")
	fl.StringVarP(&out, "output", "o", "compact", "compact, table or json (one flow per line)")
	fl.StringVar(&node, "node", "", "a lab of several nodes, or with --all-nodes: only the flows this node saw (default: every node's, merged by time)")
	fl.BoolVar(&allNodes, "all-nodes", false, "the flows of every node of a cluster, through a relay (shunt relay) at --relay")
	fl.StringVar(&relayAddr, "relay", DefaultRelayAddr, "with --all-nodes: the relay's address")
	fl.StringVar(&relayTLS, "relay-tls-dir", "", "with --all-nodes: reach the relay by mutual TLS with this client certificate, key and CA (ca.crt, tls.crt, tls.key)")
	return cmd
}

func endpointText(e flows.Endpoint) string {
	who := e.Pod
	if who == "" {
		who = e.IP
	}
	if who == "" && len(e.Labels) > 0 {
		who = e.Labels[0]
	}
	if who == "" {
		who = "?"
	}
	if e.Port != 0 {
		who = fmt.Sprintf("%s:%d", who, e.Port)
	}
	return who
}

// summary says what happened beyond the verdict: the event, flags, reason,
// service and deciding rule.
func summary(fl flows.Flow) string {
	var parts []string
	switch fl.Event {
	case "new":
		parts = append(parts, "new connection")
	case "answer":
		// Source and destination are this packet's: the connection was
		// opened the other way, before its entry was lost.
		parts = append(parts, "connection recorded again from its answer (opened by the destination)")
	case "end":
		parts = append(parts, "connection end")
	case "icmp-error":
		if fl.ICMPError != "" {
			parts = append(parts, "ICMP error "+fl.ICMPError+" about a tracked connection")
		} else {
			parts = append(parts, "ICMP error about a tracked connection")
		}
	}
	switch fl.Reason {
	case "accel-added":
		parts = append(parts, "accelerated (sockmap)")
	case "accel-ended":
		parts = append(parts, fmt.Sprintf("accelerated socket closed, sent %d bytes in %d messages", fl.Bytes, fl.Messages))
	case "dsr-encap":
		parts = append(parts, "DSR: IPIP to the backend's node, the reply leaves from there")
	case "dsr-unknown-node":
		parts = append(parts, "DSR's IPIP from a host that is no node of the cluster")
	}
	if fl.TCPFlags != "" {
		parts = append(parts, fl.TCPFlags)
	}
	if fl.DropReason != "" {
		parts = append(parts, "reason "+fl.DropReason)
	} else if dpinfo.InsertFailed(fl.Reason) {
		parts = append(parts, "reason "+fl.Reason) // went on, but something was not recorded
	}
	if fl.Service != nil {
		name := fl.Service.Name
		if name == "" {
			name = "service"
		}
		svc := fmt.Sprintf("%s %s:%d", name, fl.Service.IP, fl.Service.Port)
		if k := fl.Service.Kind; k != "" && k != "clusterip" {
			svc += " (" + k + ")" // reached from outside: the flow's node is the ingress node
		}
		parts = append(parts, svc)
	}
	if fl.Reason == flows.ReasonMirrored {
		parts = append(parts, "a copy (RequestMirror), its answer thrown away")
	}
	if h := fl.HTTP; h != nil {
		req := fmt.Sprintf("%s %s %s", h.Method, h.Path, h.Protocol)
		if h.Status != 0 {
			req += fmt.Sprintf(" -> %d", h.Status)
		} else {
			req += " -> no response"
		}
		req += fmt.Sprintf(" in %s", time.Duration(h.LatencyMicros)*time.Microsecond)
		parts = append(parts, req)
		if h.Route != "" {
			parts = append(parts, "route "+h.Route)
		}
		if h.BackendPod != "" {
			parts = append(parts, "backend "+h.BackendPod)
		} else if h.Backend != "" {
			parts = append(parts, "backend "+h.Backend)
		}
		if h.Error != "" {
			parts = append(parts, "error "+h.Error)
		}
	}
	if fl.Policy != "" {
		parts = append(parts, "by "+fl.Policy)
	}
	return strings.Join(parts, ", ")
}

func compact(fl flows.Flow) string {
	arrow := "->"
	if fl.Verdict == "DROPPED" {
		arrow = "-x"
	}
	s := fmt.Sprintf("%s %s %s %s %s %s", fl.Time.Local().Format("Jan _2 15:04:05.000"), endpointText(fl.Source),
		arrow, endpointText(fl.Destination), fl.Protocol, fl.Verdict)
	if sum := summary(fl); sum != "" {
		s += " (" + sum + ")"
	}
	return s
}

func newFlowSamplingCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "flow-sampling [off|default|all]",
		Short: "show or set what the datapath reports as flows",
		Long:  "Without an argument prints the agent's flow sampling; with one sets it: " + dpinfo.FlowModeChoices + ".",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := g.client()
			if err != nil {
				return err
			}
			var resp map[string]string
			if len(args) == 0 {
				err = c.Do("GET", "/v1/flows/sampling", nil, &resp)
			} else {
				err = c.Do("POST", "/v1/flows/sampling?"+url.Values{"mode": {args[0]}}.Encode(), nil, &resp)
			}
			if err != nil {
				return err
			}
			fmt.Println(resp["sampling"])
			return nil
		},
	}
}
