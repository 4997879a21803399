package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPolicyWithServicesDNSAndShuntPolicy: policy holds for connections to
// a ClusterIP (the backend's policy applies after translation), an
// egress-isolated pod still resolves names through the DNS service, and
// ShuntNetworkPolicy's deny rules win over allows, entities included.
func TestPolicyWithServicesDNSAndShuntPolicy(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab(servicesManifest, "testdata/dns.yaml", "testdata/other-pod.yaml")
		web, dns := l.clusterIP("web"), l.clusterIP("dns")
		web1 := l.podIP("web-1")
		l.probe("client", "connected", "--tcp", web+":80", "--tcp", web1+":8080")
		l.probe("other", "connected", "--tcp", web+":80")

		l.apply("testdata/policy-services.yaml")
		l.probe("client", "connected", "--count", "6", "--tcp", web+":80") // both backends, by named port
		l.probe("other", "timeout", "--tcp", web+":80", "--tcp", web1+":8080")
		l.probe("client", "timeout", "--udp", web+":53") // the client's egress allows only the api port of web
		l.probe("client", "timeout", "--tcp", l.podIP("other")+":22")
		dig := []string{"lab", "exec", "client", "--", "dig", "@" + dns, "web.shunt.test", "+short", "+time=1", "+tries=3"}
		var out string
		for i := 0; i < 20; i++ { // dnsmasq needs a moment to bind
			if o, code := l.shunt(dig...); code == 0 && strings.TrimSpace(o) == "10.1.2.3" {
				out = o
				break
			} else {
				out = o
			}
			time.Sleep(100 * time.Millisecond)
		}
		if strings.TrimSpace(out) != "10.1.2.3" {
			t.Errorf("dig @%s from the egress-isolated client: %q", dns, out)
		}
		out, code := l.shunt("policy", "trace", "--from", "other", "--to", "web-1", "--port", "8080")
		if code != 1 || !strings.Contains(out, "isolated for ingress by [NetworkPolicy default/web-from-client]") {
			t.Errorf("trace other -> web-1: exit %d:\n%s", code, out)
		}
		l.delete("testdata/policy-services.yaml")

		if l.kube == nil {
			out = l.mustShunt("apply", "-f", "testdata/shunt-policy.yaml")
			if strings.Contains(out, "Warning:") {
				t.Errorf("an ingress HTTP rule on its port is enforced by the proxy, without a warning:\n%s", out)
			}
		} else {
			l.apply("testdata/shunt-policy.yaml")
		}
		l.probe("other", "connected", "--udp", web1+":5353", "--tcp", web1+":8080")
		l.probe("other", "timeout", "--http", "http://"+web1+":9090/")
		l.probe("client", "connected", "--http", "http://"+web1+":9090/")
		l.probe("client", "timeout", "--tcp", l.podIP("web-2")+":8081") // the deny-only egress policy
		l.probe("client", "connected", "--tcp", web1+":8080", "--udp", web+":53")
		l.probe("", "timeout", "--tcp", web1+":8080")
		l.probe("", "connected", "--http", "http://"+web1+":9090/")
		out, code = l.shunt("policy", "trace", "--from", "other", "--to", "web-1", "--port", "9090")
		if code != 1 || !strings.Contains(out, "denied by ShuntNetworkPolicy default/web-shunt ingress[1] (deny)") {
			t.Errorf("trace of the denied HTTP port: exit %d:\n%s", code, out)
		}
		dump := l.mustShunt("map", "dump", "policy", "web-1")
		for _, want := range []string{"isolated by ShuntNetworkPolicy default/web-shunt", "ns=default app=other", "9090/TCP  deny", "host"} {
			if !strings.Contains(dump, want) {
				t.Errorf("map dump policy web-1 lacks %q:\n%s", want, dump)
			}
		}
		var denied uint64
		for _, c := range l.status().Counters {
			if c.Reason == "policy-denied" {
				denied += c.Packets
			}
		}
		if denied == 0 {
			t.Error("no policy-denied drops counted")
		}
	})
}

func TestPolicyBadInput(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	dir := t.TempDir()
	np := func(spec string) string {
		return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad}\nspec:\n" + spec + "\n"
	}
	cases := []struct{ name, doc, want string }{
		{"endport.yaml", np("  podSelector: {}\n  ingress: [{ports: [{port: 90, endPort: 80}]}]"),
			"endport.yaml#1: NetworkPolicy default/bad: spec.ingress[0].ports[0].endPort: 80 must not be below port 90"},
		{"cidr.yaml", np("  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.300/8}}]}]"),
			"spec.ingress[0].from[0].ipBlock.cidr"},
		{"except.yaml", np("  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/24, except: [10.1.0.0/24]}}]}]"),
			"must be a CIDR strictly inside 10.0.0.0/24"},
		{"selector.yaml", np("  podSelector: {matchExpressions: [{key: app, operator: Near, values: [x]}]}"),
			"spec.podSelector"},
		{"field.yaml", np("  podSelector: {}\n  ingres: []"), "unknown field"},
		{"action.yaml", "apiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {name: bad}\nspec:\n  podSelector: {}\n  ingress: [{action: drop}]\n",
			"spec.ingress[0].action"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.name)
		os.WriteFile(p, []byte(c.doc), 0o644)
		out, code := l.shunt("apply", "-f", p)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d:\n%s\nwant %q", c.name, code, out, c.want)
		}
	}
	// A named port that no pod declares is valid and selects nothing.
	p := filepath.Join(dir, "named.yaml")
	os.WriteFile(p, []byte(np("  podSelector: {matchLabels: {app: server}}\n  ingress: [{ports: [{port: nosuch}]}]")), 0o644)
	l.mustShunt("apply", "-f", p)
	l.probe("client", "timeout", "--tcp", l.podIP("server")+":7000")
	l.probe("", "connected", "--tcp", l.podIP("server")+":7000") // the node always may
}
