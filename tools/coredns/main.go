// Command coredns is CoreDNS (github.com/coredns/coredns at the version
// pinned in go.mod) with the plugins a cluster DNS uses, for the lab
// kubelet's registry.k8s.io/coredns/coredns image (internal/lab/images.go).
// It is upstream's coremain with a shorter plugin list than upstream's
// core/plugin (which also links the clouds' DNS SDKs): the plugins of the
// Corefile kubeadm writes, plus those the Kubernetes DNS tests' and users'
// Corefiles commonly add. The order is upstream's plugin.cfg order, which
// is the order a query passes them in.
package main

import (
	_ "github.com/coredns/caddy/onevent"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/any"
	_ "github.com/coredns/coredns/plugin/autopath"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/chaos"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/header"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/k8s_external"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metadata"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives are the plugins linked in, in upstream plugin.cfg's order.
var directives = []string{
	"metadata",
	"reload",
	"bind",
	"debug",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"any",
	"chaos",
	"loadbalance",
	"cache",
	"rewrite",
	"header",
	"autopath",
	"template",
	"hosts",
	"k8s_external",
	"kubernetes",
	"loop",
	"forward",
	"whoami",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
