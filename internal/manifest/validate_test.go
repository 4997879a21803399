package manifest

import (
	"errors"
	"strings"
	"testing"
)

// Small manifest builders keep the table below readable: each case states
// only the part that is wrong.
func podDoc(meta, spec string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata: {name: web" + meta + "}\nspec: " + spec
}

func ctr(extra string) string { // a pod spec with one container
	return "{containers: [{name: c, command: [x]" + extra + "}]}"
}

func svcDoc(spec string) string {
	return "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: " + spec
}

func sliceDoc(labels, rest string) string {
	return "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {" + labels + "}}\n" + rest
}

func npDoc(spec string) string {
	return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: " + spec
}

func snpDoc(spec string) string {
	return "apiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {name: snp}\nspec: " + spec
}

func nodeDoc(spec, status string) string {
	return "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: " + spec + "\nstatus: " + status
}

func routeDoc(spec string) string {
	return "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: rt}\nspec: " + spec
}

// ruleDoc is a route on Service web with one rule.
func ruleDoc(rule string) string {
	return routeDoc(`{parentRefs: [{group: "", kind: Service, name: web}], rules: [` + rule + `]}`)
}

// backendDoc is a route on Service web with one backendRef.
func backendDoc(ref string) string { return ruleDoc("{backendRefs: [" + ref + "]}") }

// grantDoc is a ReferenceGrant in namespace shop with this spec.
func grantDoc(spec string) string {
	return "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: shop}\nspec: " + spec + "\n"
}

const svcLabel = "kubernetes.io/service-name: web"

func TestValidateRejects(t *testing.T) {
	const (
		pod   = "Pod default/web"
		svc   = "Service default/web"
		slice = "EndpointSlice default/web-1"
		np    = "NetworkPolicy default/np"
		snp   = "ShuntNetworkPolicy default/snp"
		rt    = "HTTPRoute default/rt"
		node  = "Node n1"
	)
	for _, tc := range []struct {
		name, doc           string
		object, field, want string // want: a substring of the message
	}{
		// metadata
		{"name required", "apiVersion: v1\nkind: Pod\nmetadata: {namespace: a}\nspec: " + ctr(""), "Pod (unnamed)", "metadata.name", "required"},
		{"name not a subdomain", "apiVersion: v1\nkind: Pod\nmetadata: {name: Web_1}\nspec: " + ctr(""), "Pod default/Web_1", "metadata.name", "RFC 1123 subdomain"},
		{"service name not a label", "apiVersion: v1\nkind: Service\nmetadata: {name: a.b}\nspec: {ports: [{port: 80}]}", "Service default/a.b", "metadata.name", "must not contain dots"},
		{"namespace name not a label", "apiVersion: v1\nkind: Namespace\nmetadata: {name: prod.eu}", "Namespace prod.eu", "metadata.name", "must not contain dots"},
		{"cluster-scoped with namespace", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, namespace: b}", "Namespace b/a", "metadata.namespace", "must be empty"},
		{"bad namespace", podDoc(", namespace: Prod", ctr("")), "Pod Prod/web", "metadata.namespace", "RFC 1123 label"},
		{"bad label key", podDoc(", labels: {'a/b/c': x}", ctr("")), pod, "metadata.labels[a/b/c]", "a valid label key must consist"},
		{"bad label value", podDoc(", labels: {app: 'two words'}", ctr("")), pod, "metadata.labels[app]", "a valid label must be"},

		// Pod
		{"no containers", podDoc("", "{containers: []}"), pod, "spec.containers", "at least one container"},
		{"no command", podDoc("", "{containers: [{name: c, image: nginx}]}"), pod, "spec.containers[0].command", "must not be empty"},
		{"container name required", podDoc("", "{containers: [{command: [x]}]}"), pod, "spec.containers[0].name", "required"},
		{"container name invalid", podDoc("", "{containers: [{name: C_1, command: [x]}]}"), pod, "spec.containers[0].name", "RFC 1123 label"},
		{"duplicate container", podDoc("", "{containers: [{name: c, command: [x]}, {name: c, command: [z]}]}"), pod, "spec.containers[1].name", `duplicate container name "c"`},
		{"containerPort zero", podDoc("", ctr(", ports: [{containerPort: 0}]")), pod, "spec.containers[0].ports[0].containerPort", "0 is out of range 1-65535"},
		{"containerPort too big", podDoc("", ctr(", ports: [{containerPort: 65536}]")), pod, "spec.containers[0].ports[0].containerPort", "65536 is out of range"},
		{"container protocol", podDoc("", ctr(", ports: [{containerPort: 80, protocol: ICMP}]")), pod, "spec.containers[0].ports[0].protocol", `unsupported protocol "ICMP"`},
		{"container protocol is case-sensitive", podDoc("", ctr(", ports: [{containerPort: 80, protocol: tcp}]")), pod, "spec.containers[0].ports[0].protocol", `"tcp"`},
		{"port name invalid", podDoc("", ctr(", ports: [{containerPort: 80, name: http_web}]")), pod, "spec.containers[0].ports[0].name", "must contain only alpha-numeric characters"},
		{"port name too long", podDoc("", ctr(", ports: [{containerPort: 80, name: abcdefghijklmnop}]")), pod, "spec.containers[0].ports[0].name", "no more than 15 characters"},
		{"port name reused across containers", podDoc("", "{containers: [{name: a, command: [x], ports: [{name: http, containerPort: 80}]}, {name: b, command: [x], ports: [{name: http, containerPort: 81}]}]}"),
			pod, "spec.containers[1].ports[0].name", `duplicate port name "http" (also spec.containers[0].ports[0].name)`},

		// Service
		{"service without ports", svcDoc("{selector: {app: web}}"), svc, "spec.ports", "at least one port"},
		{"forwarding mode", "apiVersion: v1\nkind: Service\nmetadata: {name: web, annotations: {shunt.io/forwarding-mode: hybrid}}\nspec: {ports: [{port: 80}]}", svc,
			"metadata.annotations[shunt.io/forwarding-mode]", `"hybrid": give snat or dsr`},
		{"service port zero", svcDoc("{ports: [{port: 0}]}"), svc, "spec.ports[0].port", "0 is out of range"},
		{"service port too big", svcDoc("{ports: [{port: 70000}]}"), svc, "spec.ports[0].port", "70000 is out of range"},
		{"service protocol", svcDoc("{ports: [{port: 80, protocol: HTTP}]}"), svc, "spec.ports[0].protocol", `unsupported protocol "HTTP"`},
		{"unnamed port among several", svcDoc("{ports: [{port: 80}, {name: b, port: 81}]}"), svc, "spec.ports[0].name", "required when the Service has more than one port"},
		{"duplicate port name", svcDoc("{ports: [{name: a, port: 80}, {name: a, port: 81}]}"), svc, "spec.ports[1].name", `duplicate port name "a"`},
		{"duplicate port", svcDoc("{ports: [{name: a, port: 80}, {name: b, port: 80}]}"), svc, "spec.ports[1]", "duplicate port 80/TCP"},
		{"service port name not a label", svcDoc("{ports: [{name: A, port: 80}]}"), svc, "spec.ports[0].name", "RFC 1123 label"},
		{"targetPort out of range", svcDoc("{ports: [{port: 80, targetPort: 70000}]}"), svc, "spec.ports[0].targetPort", "70000 is out of range"},
		{"targetPort bad name", svcDoc("{ports: [{port: 80, targetPort: not_a_name}]}"), svc, "spec.ports[0].targetPort", "must contain only alpha-numeric characters"},
		{"service type", svcDoc("{type: ExternalName, ports: [{port: 80}]}"), svc, "spec.type", `"ExternalName" is not supported in the lab`},
		{"nodePort with ClusterIP", svcDoc("{ports: [{port: 80, nodePort: 30080}]}"), svc, "spec.ports[0].nodePort", "may only be set with type NodePort or LoadBalancer, not ClusterIP"},
		{"nodePort out of range", svcDoc("{type: NodePort, ports: [{port: 80, nodePort: 8080}]}"), svc, "spec.ports[0].nodePort", "8080 is outside the NodePort range 30000-32767"},
		{"nodePort twice", svcDoc("{type: NodePort, ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30080}]}"), svc, "spec.ports[1].nodePort", "duplicate nodePort 30080/TCP"},
		{"headless NodePort", svcDoc("{type: NodePort, clusterIP: None, ports: [{port: 80}]}"), svc, "spec.clusterIP", "None may not be used with type NodePort"},
		{"externalIP invalid", svcDoc("{externalIPs: [1.2.3], ports: [{port: 80}]}"), svc, "spec.externalIPs[0]", `"1.2.3" is not a valid`},
		{"traffic policy", svcDoc("{type: NodePort, externalTrafficPolicy: Nearest, ports: [{port: 80}]}"), svc, "spec.externalTrafficPolicy", `"Nearest": use Cluster or Local`},
		{"Local without outside", svcDoc("{externalTrafficPolicy: Local, ports: [{port: 80}]}"), svc, "spec.externalTrafficPolicy", "Local may only be set with type NodePort or LoadBalancer"},
		{"health check port on NodePort", svcDoc("{type: NodePort, externalTrafficPolicy: Local, healthCheckNodePort: 30500, ports: [{port: 80}]}"), svc, "spec.healthCheckNodePort", "may only be set with type LoadBalancer and externalTrafficPolicy Local"},
		{"health check port range", svcDoc("{type: LoadBalancer, externalTrafficPolicy: Local, healthCheckNodePort: 80, ports: [{port: 80}]}"), svc, "spec.healthCheckNodePort", "80 is outside the NodePort range"},
		{"loadBalancerIP on NodePort", svcDoc("{type: NodePort, loadBalancerIP: 192.168.50.1, ports: [{port: 80}]}"), svc, "spec.loadBalancerIP", "may only be set with type LoadBalancer"},
		{"clusterIP invalid", svcDoc("{clusterIP: 10.0.0.300, ports: [{port: 80}]}"), svc, "spec.clusterIP", `"10.0.0.300" is not a valid IPv4 or IPv6 address`},
		{"clusterIP with zone", svcDoc("{clusterIP: 'fe80::1%eth0', ports: [{port: 80}]}"), svc, "spec.clusterIP", "not a valid"},
		{"clusterIPs mismatch", svcDoc("{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.11], ports: [{port: 80}]}"), svc, "spec.clusterIPs[0]", "must match clusterIP"},
		{"sessionAffinity", svcDoc("{sessionAffinity: Sticky, ports: [{port: 80}]}"), svc, "spec.sessionAffinity", `"Sticky": use None or ClientIP`},
		{"affinity timeout too long", svcDoc("{sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 86401}}, ports: [{port: 80}]}"),
			svc, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "86401 is out of range 1-86400"},
		{"affinity timeout zero", svcDoc("{sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}, ports: [{port: 80}]}"),
			svc, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "0 is out of range"},
		{"affinity config without ClientIP", svcDoc("{sessionAffinityConfig: {clientIP: {timeoutSeconds: 10}}, ports: [{port: 80}]}"),
			svc, "spec.sessionAffinityConfig", "must not be set when sessionAffinity is None"},
		{"bad selector", svcDoc("{selector: {app: 'a b'}, ports: [{port: 80}]}"), svc, "spec.selector[app]", "a valid label must be"},

		// EndpointSlice
		{"slice without service label", sliceDoc("", "addressType: IPv4"), slice, "metadata.labels[kubernetes.io/service-name]", "required"},
		{"slice addressType", sliceDoc(svcLabel, "addressType: IPv5"), slice, "addressType", `"IPv5": use IPv4 or IPv6`},
		{"slice addressType missing", sliceDoc(svcLabel, "endpoints: []"), slice, "addressType", "required"},
		{"slice FQDN", sliceDoc(svcLabel, "addressType: FQDN"), slice, "addressType", "FQDN is not supported"},
		{"slice wrong family", sliceDoc(svcLabel, "addressType: IPv4\nendpoints: [{addresses: ['fd00::1']}]"), slice, "endpoints[0].addresses[0]", `"fd00::1" is not an IPv4 address`},
		{"slice wrong family v6", sliceDoc(svcLabel, "addressType: IPv6\nendpoints: [{addresses: [10.0.0.1]}]"), slice, "endpoints[0].addresses[0]", `"10.0.0.1" is not an IPv6 address`},
		{"slice bad address", sliceDoc(svcLabel, "addressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}, {addresses: [web]}]"), slice, "endpoints[1].addresses[0]", `"web" is not a valid IP address`},
		{"slice endpoint without address", sliceDoc(svcLabel, "addressType: IPv4\nendpoints: [{addresses: []}]"), slice, "endpoints[0].addresses", "at least one address"},
		{"slice port", sliceDoc(svcLabel, "addressType: IPv4\nports: [{port: 0}]"), slice, "ports[0].port", "0 is out of range"},
		{"slice protocol", sliceDoc(svcLabel, "addressType: IPv4\nports: [{port: 80, protocol: ICMP}]"), slice, "ports[0].protocol", "unsupported protocol"},
		{"slice duplicate port name", sliceDoc(svcLabel, "addressType: IPv4\nports: [{name: a, port: 80}, {name: a, port: 81}]"), slice, "ports[1].name", "duplicate port name"},

		// NetworkPolicy
		{"np bad podSelector", npDoc("{podSelector: {matchExpressions: [{key: app, operator: Like}]}}"), np, "spec.podSelector", `"Like" is not a valid label selector operator`},
		{"np bad peer selector", npDoc("{podSelector: {}, ingress: [{from: [{namespaceSelector: {matchLabels: {'a b': c}}}]}]}"), np, "spec.ingress[0].from[0].namespaceSelector", "name part must consist"},
		{"np empty peer", npDoc("{podSelector: {}, egress: [{to: [{}]}]}"), np, "spec.egress[0].to[0]", "must set podSelector, namespaceSelector or ipBlock"},
		{"np ipBlock with selector", npDoc("{podSelector: {}, ingress: [{from: [{podSelector: {}, ipBlock: {cidr: 10.0.0.0/8}}]}]}"), np, "spec.ingress[0].from[0].ipBlock", "cannot be combined"},
		{"np bad cidr", npDoc("{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}"), np, "spec.ingress[0].from[0].ipBlock.cidr", `"10.0.0.0/33" is not a CIDR`},
		{"np cidr host bits", npDoc("{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.1.2.3/8}}]}]}"), np, "spec.ingress[0].from[0].ipBlock.cidr", `use "10.0.0.0/8"`},
		{"np except outside", npDoc("{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16, 11.0.0.0/16]}}]}]}"), np, "spec.egress[0].to[0].ipBlock.except[1]", `"11.0.0.0/16" must be a CIDR strictly inside 10.0.0.0/8`},
		{"np except equal", npDoc("{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]}"), np, "spec.egress[0].to[0].ipBlock.except[0]", "strictly inside"},
		{"np except other family", npDoc("{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: ['::/64']}}]}]}"), np, "spec.egress[0].to[0].ipBlock.except[0]", "strictly inside"},
		{"np port out of range", npDoc("{podSelector: {}, ingress: [{ports: [{port: 0}]}]}"), np, "spec.ingress[0].ports[0].port", "0 is out of range"},
		{"np port bad name", npDoc("{podSelector: {}, ingress: [{ports: [{port: -http}]}]}"), np, "spec.ingress[0].ports[0].port", "must not begin or end with a hyphen"},
		{"np protocol", npDoc("{podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}"), np, "spec.ingress[0].ports[0].protocol", "unsupported protocol"},
		{"np endPort below port", npDoc("{podSelector: {}, ingress: [{ports: [{port: 90, endPort: 80}]}]}"), np, "spec.ingress[0].ports[0].endPort", "80 must not be below port 90"},
		{"np endPort with named port", npDoc("{podSelector: {}, ingress: [{ports: [{port: http, endPort: 80}]}]}"), np, "spec.ingress[0].ports[0].endPort", "requires a numeric port"},
		{"np endPort without port", npDoc("{podSelector: {}, ingress: [{ports: [{endPort: 80}]}]}"), np, "spec.ingress[0].ports[0].endPort", "requires a numeric port"},
		{"np endPort too big", npDoc("{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 65536}]}]}"), np, "spec.ingress[0].ports[0].endPort", "65536 is out of range"},
		{"np policyTypes", npDoc("{podSelector: {}, policyTypes: [Ingress, ingress]}"), np, "spec.policyTypes[1]", `"ingress": use Ingress or Egress`},
		{"np duplicate policyType", npDoc("{podSelector: {}, policyTypes: [Egress, Egress]}"), np, "spec.policyTypes[1]", "duplicate"},

		// ShuntNetworkPolicy
		{"snp action", snpDoc("{podSelector: {}, ingress: [{action: drop}]}"), snp, "spec.ingress[0].action", `"drop": use allow or deny`},
		{"snp entity", snpDoc("{podSelector: {}, egress: [{peers: [{entity: internet}]}]}"), snp, "spec.egress[0].peers[0].entity", `"internet": use host, world, cluster or all`},
		{"snp cidr", snpDoc("{podSelector: {}, egress: [{peers: [{cidr: 10.0.0/8}]}]}"), snp, "spec.egress[0].peers[0].cidr", "is not a CIDR"},
		{"snp except outside", snpDoc("{podSelector: {}, egress: [{peers: [{cidr: 10.0.0.0/8, except: [192.168.0.0/16]}]}]}"), snp, "spec.egress[0].peers[0].except[0]", "strictly inside"},
		{"snp except without cidr", snpDoc("{podSelector: {}, egress: [{peers: [{entity: world, except: [10.0.0.0/8]}]}]}"), snp, "spec.egress[0].peers[0].except", "requires cidr"},
		{"snp empty peer", snpDoc("{podSelector: {}, egress: [{peers: [{}]}]}"), snp, "spec.egress[0].peers[0]", "must set"},
		{"snp mixed peer", snpDoc("{podSelector: {}, egress: [{peers: [{entity: world, cidr: 10.0.0.0/8}]}]}"), snp, "spec.egress[0].peers[0]", "set only one of"},
		{"snp bad selector", snpDoc("{podSelector: {matchLabels: {app: 'a b'}}}"), snp, "spec.podSelector", "a valid label must be"},
		{"snp port", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 70}]}]}"), snp, "spec.ingress[0].ports[0].endPort", "must not be below port 80"},
		{"snp protocol", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80, protocol: ICMP}]}]}"), snp, "spec.ingress[0].ports[0].protocol", "unsupported protocol"},
		{"snp http method", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}], http: [{method: 'GET /'}]}]}"), snp, "spec.ingress[0].http[0].method", `"GET /" is not a valid HTTP method`},
		{"snp http path", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}], http: [{path: /a}, {path: '/a[' }]}]}"), snp, "spec.ingress[0].http[1].path",
			"not a valid RE2 regular expression: missing closing ]"},
		{"snp http path not RE2", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}], http: [{path: '/(?=a)'}]}]}"), snp, "spec.ingress[0].http[0].path", "not a valid RE2 regular expression"},
		{"snp http header name", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}], http: [{headers: {'X Team': a}}]}]}"), snp, "spec.ingress[0].http[0].headers[X Team]", "not a valid HTTP header name"},
		{"snp http header value", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}], http: [{headers: {X-Team: \"a\\nb\"}}]}]}"), snp, "spec.ingress[0].http[0].headers[X-Team]", "control characters"},
		{"snp http without ports", snpDoc("{podSelector: {}, ingress: [{http: [{method: GET}]}]}"), snp, "spec.ingress[0].ports", "required with http"},
		{"snp http port range", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}, {port: 8000, endPort: 8100}], http: [{method: GET}]}]}"), snp, "spec.ingress[0].ports[1].endPort",
			"not allowed with http: the node proxy needs exact ports"},
		{"snp http all ports of a protocol", snpDoc("{podSelector: {}, ingress: [{ports: [{protocol: TCP}], http: [{method: GET}]}]}"), snp, "spec.ingress[0].ports[0].port", "required with http"},
		{"snp http on UDP", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 53, protocol: UDP}], http: [{method: GET}]}]}"), snp, "spec.ingress[0].ports[0].protocol", "UDP: http rules apply to TCP ports only"},
		{"snp http on egress", snpDoc("{podSelector: {}, egress: [{ports: [{port: 80}]}, {ports: [{port: 80}], http: [{method: GET}]}]}"), snp, "spec.egress[1].http",
			"HTTP rules are supported on ingress only"},

		// HTTPRoute
		{"route without parents", routeDoc("{rules: [{backendRefs: [{name: web, port: 80}]}]}"), rt, "spec.parentRefs", "required: shunt supports the GAMMA mesh pattern"},
		{"route on a Gateway", routeDoc("{parentRefs: [{name: gw}]}"), rt, "spec.parentRefs[0].kind", `"Gateway" is not supported: shunt supports the GAMMA mesh pattern: parentRefs must name a Service: set group: "" and kind: Service (omitted, group and kind mean a Gateway)`},
		{"route on another kind", routeDoc("{parentRefs: [{group: '', kind: Pod, name: web}]}"), rt, "spec.parentRefs[0].kind", `"Pod" is not supported: shunt supports the GAMMA mesh pattern`},
		{"route on a Service without the core group", routeDoc("{parentRefs: [{kind: Service, name: web}]}"), rt, "spec.parentRefs[0].group",
			`"gateway.networking.k8s.io" is not supported: shunt supports the GAMMA mesh pattern: parentRefs must name a Service: set group: "" and kind: Service (an omitted group means gateway.networking.k8s.io)`},
		{"route on another namespace", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, namespace: shop}]}"), rt, "spec.parentRefs[0].namespace",
			`"shop": cross-namespace parentRefs are not supported`},
		{"parent without name", routeDoc("{parentRefs: [{group: '', kind: Service}]}"), rt, "spec.parentRefs[0].name", "required"},
		{"parent name", routeDoc("{parentRefs: [{group: '', kind: Service, name: a.b}]}"), rt, "spec.parentRefs[0].name", "must not contain dots"},
		{"parent port", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, port: 0}]}"), rt, "spec.parentRefs[0].port", "0 is out of range"},
		{"parent sectionName", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, sectionName: http}]}"), rt, "spec.parentRefs[0].sectionName", "not supported"},
		{"parent twice without port", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, port: 80}, {group: '', kind: Service, name: web}]}"), rt, "spec.parentRefs[1].port",
			`required: 2 parentRefs name Service "web", each must set a different port`},
		{"parent twice", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, port: 80}, {group: '', kind: Service, name: web, port: 80}]}"), rt, "spec.parentRefs[1].port",
			`duplicate: spec.parentRefs[0] names Service "web" port 80 already`},
		{"hostnames", routeDoc("{parentRefs: [{group: '', kind: Service, name: web}], hostnames: [web.shop]}"), rt, "spec.hostnames", "not supported with Service parents"},
		{"path type", ruleDoc("{matches: [{path: {type: Prefix, value: /}}]}"), rt, "spec.rules[0].matches[0].path.type", `"Prefix": use Exact, PathPrefix or RegularExpression`},
		{"exact path relative", ruleDoc("{matches: [{path: {type: Exact, value: api}}]}"), rt, "spec.rules[0].matches[0].path.value", `"api" must start with "/" for type Exact`},
		{"prefix path relative", ruleDoc("{matches: [{path: {value: api}}]}"), rt, "spec.rules[0].matches[0].path.value", `"api" must start with "/" for type PathPrefix`},
		{"prefix path not normalized", ruleDoc("{matches: [{path: {value: /a/../b}}]}"), rt, "spec.rules[0].matches[0].path.value", `must not contain "/../"`},
		{"prefix path ends in a dot", ruleDoc("{matches: [{path: {value: /a/.}}]}"), rt, "spec.rules[0].matches[0].path.value", `must not end with "/."`},
		{"path characters", ruleDoc("{matches: [{path: {value: '/a b'}}]}"), rt, "spec.rules[0].matches[0].path.value", "characters a path may not hold"},
		{"path regexp", ruleDoc("{matches: [{path: {type: RegularExpression, value: '/a(b'}}]}"), rt, "spec.rules[0].matches[0].path.value",
			"not a valid RE2 regular expression: missing closing )"},
		{"path regexp not RE2", ruleDoc("{matches: [{path: {type: RegularExpression, value: '(a)\\1'}}]}"), rt, "spec.rules[0].matches[0].path.value", "not a valid RE2 regular expression"},
		{"header type", ruleDoc("{matches: [{headers: [{type: Prefix, name: x, value: a}]}]}"), rt, "spec.rules[0].matches[0].headers[0].type", `"Prefix": use Exact or RegularExpression`},
		{"header name", ruleDoc("{matches: [{headers: [{name: 'x:y', value: a}]}]}"), rt, "spec.rules[0].matches[0].headers[0].name", `"x:y" is not a valid header name`},
		{"header name twice", ruleDoc("{matches: [{headers: [{name: x, value: a}, {name: x, value: b}]}]}"), rt, "spec.rules[0].matches[0].headers[1].name", `duplicate header "x"`},
		{"header value empty", ruleDoc("{matches: [{headers: [{name: x, value: ''}]}]}"), rt, "spec.rules[0].matches[0].headers[0].value", "required"},
		{"header regexp", ruleDoc("{matches: [{headers: [{type: RegularExpression, name: x, value: '[a'}]}]}"), rt, "spec.rules[0].matches[0].headers[0].value", "not a valid RE2 regular expression"},
		{"query param regexp", ruleDoc("{matches: [{queryParams: [{type: RegularExpression, name: q, value: '*'}]}]}"), rt, "spec.rules[0].matches[0].queryParams[0].value", "not a valid RE2 regular expression"},
		{"method", ruleDoc("{matches: [{method: get}]}"), rt, "spec.rules[0].matches[0].method", `"get": use GET, HEAD, POST`},
		{"CORS filter", ruleDoc("{filters: [{type: CORS, cors: {allowOrigins: ['https://a.example']}}]}"), rt, "spec.rules[0].filters[0].type",
			`"CORS" is not supported: shunt's proxy implements RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite and RequestMirror`},
		{"mirror without port", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web}}}]}"), rt,
			"spec.rules[0].filters[0].requestMirror.backendRef.port", "required"},
		{"mirror to a Gateway", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {kind: Gateway, name: web, port: 80}}}]}"), rt,
			"spec.rules[0].filters[0].requestMirror.backendRef.kind", `"Gateway" is not supported`},
		{"mirror percent", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}, percent: 101}}]}"), rt,
			"spec.rules[0].filters[0].requestMirror.percent", "101 is out of range 0-100"},
		{"mirror percent and fraction", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}, percent: 5, fraction: {numerator: 1}}}]}"), rt,
			"spec.rules[0].filters[0].requestMirror", "only one of percent or fraction"},
		{"mirror fraction", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}, fraction: {numerator: 3, denominator: 2}}}]}"), rt,
			"spec.rules[0].filters[0].requestMirror.fraction.numerator", "3 is out of range 0-2"},
		{"mirror fraction denominator", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}, fraction: {numerator: 0, denominator: 0}}}]}"), rt,
			"spec.rules[0].filters[0].requestMirror.fraction.denominator", "0: must be at least 1"},
		{"backend mirror", backendDoc("{name: web, port: 80, filters: [{type: RequestMirror, requestMirror: {backendRef: {name: web, port: 80}}}]}"), rt,
			"spec.rules[0].backendRefs[0].filters[0].type", "RequestMirror is not supported on a backendRef"},
		{"backend rewrite", backendDoc("{name: web, port: 80, filters: [{type: URLRewrite, urlRewrite: {hostname: a}}]}"), rt, "spec.rules[0].backendRefs[0].filters[0].type",
			"URLRewrite is not supported on a backendRef"},
		{"filter without its field", ruleDoc("{filters: [{type: URLRewrite}]}"), rt, "spec.rules[0].filters[0].urlRewrite", "required for type URLRewrite"},
		{"filter twice", ruleDoc("{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: [a]}}, {type: RequestHeaderModifier, requestHeaderModifier: {remove: [b]}}]}"), rt,
			"spec.rules[0].filters[1].type", "RequestHeaderModifier filter cannot be repeated"},
		{"header name to set", ruleDoc("{filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: 'a b', value: v}]}}]}"), rt,
			"spec.rules[0].filters[0].responseHeaderModifier.set[0].name", `"a b" is not a valid header name`},
		{"header added twice", ruleDoc("{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x, value: a}, {name: X, value: b}]}}]}"), rt,
			"spec.rules[0].filters[0].requestHeaderModifier.add[1].name", `duplicate header "X"`},
		{"redirect with backends", ruleDoc("{filters: [{type: RequestRedirect, requestRedirect: {hostname: example.org}}], backendRefs: [{name: web, port: 80}]}"), rt,
			"spec.rules[0].filters", "RequestRedirect filter must not be used together with backendRefs"},
		{"redirect scheme", ruleDoc("{filters: [{type: RequestRedirect, requestRedirect: {scheme: ftp}}]}"), rt, "spec.rules[0].filters[0].requestRedirect.scheme", `"ftp": use http or https`},
		{"redirect status", ruleDoc("{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 200}}]}"), rt, "spec.rules[0].filters[0].requestRedirect.statusCode", "200: use 301"},
		{"redirect and rewrite", ruleDoc("{filters: [{type: RequestRedirect, requestRedirect: {port: 8080}}, {type: URLRewrite, urlRewrite: {hostname: a}}]}"), rt,
			"spec.rules[0].filters", "either a RequestRedirect or a URLRewrite filter, not both"},
		{"prefix rewrite after an exact match", ruleDoc("{matches: [{path: {type: Exact, value: /a}}], filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}"), rt,
			"spec.rules[0].filters[0].urlRewrite.path.type", "exactly one PathPrefix match"},
		{"header value to set with CR LF", ruleDoc(`{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: "a\r\nX-Evil: 1"}]}}]}`), rt,
			"spec.rules[0].filters[0].requestHeaderModifier.set[0].value", "no control characters"},
		{"header value to add with NUL", ruleDoc(`{filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: X-A, value: "a\0"}]}}]}`), rt,
			"spec.rules[0].filters[0].responseHeaderModifier.add[0].value", "no control characters"},
		{"header value with DEL", backendDoc(`{name: web, port: 80, filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-A, value: "\x7f"}]}}]}`), rt,
			"spec.rules[0].backendRefs[0].filters[0].responseHeaderModifier.set[0].value", "no control characters"},
		{"header name with LF", ruleDoc(`{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: ["X-A\n"]}}]}`), rt,
			"spec.rules[0].filters[0].requestHeaderModifier.remove[0]", "is not a valid header name"},
		{"rewrite path with CR LF", ruleDoc(`{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: "/a\r\nX-Evil: 1"}}}]}`), rt,
			"spec.rules[0].filters[0].urlRewrite.path.replaceFullPath", "contains control characters"},
		{"redirect path with LF", ruleDoc(`{filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: "/a\n"}}}]}`), rt,
			"spec.rules[0].filters[0].requestRedirect.path.replacePrefixMatch", "contains control characters"},
		{"redirect hostname with CR", ruleDoc(`{filters: [{type: RequestRedirect, requestRedirect: {hostname: "a\rb"}}]}`), rt,
			"spec.rules[0].filters[0].requestRedirect.hostname", "RFC 1123 subdomain"},
		{"full path rewrite without its value", ruleDoc("{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath}}}]}"), rt,
			"spec.rules[0].filters[0].urlRewrite.path.replaceFullPath", "required for type ReplaceFullPath"},
		{"backend kind", backendDoc("{kind: ServiceImport, group: multicluster.x-k8s.io, name: web, port: 80}"), rt, "spec.rules[0].backendRefs[0].kind",
			`"ServiceImport" is not supported: backendRefs must name a Service (group: "", kind: Service)`},
		{"backend group", backendDoc("{group: example.com, name: web, port: 80}"), rt, "spec.rules[0].backendRefs[0].group", `"example.com" is not supported`},
		{"grant without from", grantDoc(`{to: [{group: "", kind: Service}]}`), "ReferenceGrant shop/g", "spec.from", "required"},
		{"grant from without namespace", grantDoc(`{from: [{group: gateway.networking.k8s.io, kind: HTTPRoute}], to: [{group: "", kind: Service}]}`),
			"ReferenceGrant shop/g", "spec.from[0].namespace", "required"},
		{"grant without to", grantDoc(`{from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]}`), "ReferenceGrant shop/g", "spec.to", "required"},
		{"backend without port", backendDoc("{name: web}"), rt, "spec.rules[0].backendRefs[0].port", "required: the port of the Service"},
		{"backend port", backendDoc("{name: web, port: 65536}"), rt, "spec.rules[0].backendRefs[0].port", "65536 is out of range"},
		{"backend without name", backendDoc("{port: 80}"), rt, "spec.rules[0].backendRefs[0].name", "required"},
		{"negative weight", backendDoc("{name: web, port: 80, weight: -1}"), rt, "spec.rules[0].backendRefs[0].weight", "-1 is out of range 0-1000000"},
		{"weight too big", backendDoc("{name: web, port: 80, weight: 1000001}"), rt, "spec.rules[0].backendRefs[0].weight", "1000001 is out of range"},
		{"request timeout", ruleDoc("{timeouts: {request: 1.5s}}"), rt, "spec.rules[0].timeouts.request", `"1.5s" is not a Gateway API duration`},
		{"request timeout unit", ruleDoc("{timeouts: {request: 1us}}"), rt, "spec.rules[0].timeouts.request", "is not a Gateway API duration"},
		{"backendRequest timeout", ruleDoc("{timeouts: {backendRequest: '-1s'}}"), rt, "spec.rules[0].timeouts.backendRequest", "is not a Gateway API duration"},
		{"backendRequest longer than request", ruleDoc("{timeouts: {request: 1s, backendRequest: 2s}}"), rt, "spec.rules[0].timeouts.backendRequest",
			"2s is longer than the request timeout 1s"},
		{"retry attempts", ruleDoc("{retry: {attempts: -1}}"), rt, "spec.rules[0].retry.attempts", "-1 is below 1"},
		{"retry code", ruleDoc("{retry: {codes: [503, 302]}}"), rt, "spec.rules[0].retry.codes[1]", "302 is out of range 400-599"},
		{"retry code twice", ruleDoc("{retry: {codes: [503, 503]}}"), rt, "spec.rules[0].retry.codes[1]", "duplicate 503"},
		{"retry backoff", ruleDoc("{retry: {backoff: 1m1}}"), rt, "spec.rules[0].retry.backoff", "is not a Gateway API duration"},
		{"session persistence", ruleDoc("{sessionPersistence: {type: Cookie}}"), rt, "spec.rules[0].sessionPersistence", "not supported"},
		{"rule name", ruleDoc("{name: Rule_1}"), rt, "spec.rules[0].name", "RFC 1123 subdomain"},
		{"route name", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: Rt}\nspec: {parentRefs: [{group: '', kind: Service, name: web}]}",
			"HTTPRoute default/Rt", "metadata.name", "RFC 1123 subdomain"},
		// Node
		{"node pod CIDR", nodeDoc("{podCIDR: 10.244.1.0/33}", "{}"), node, "spec.podCIDR", "is not a CIDR"},
		{"node pod CIDR host bits", nodeDoc("{podCIDR: 10.244.1.1/24}", "{}"), node, "spec.podCIDR", `use "10.244.1.0/24"`},
		{"node pod CIDRs disagree", nodeDoc("{podCIDR: 10.244.1.0/24, podCIDRs: [10.244.2.0/24]}", "{}"), node, "spec.podCIDRs[0]", "must equal spec.podCIDR"},
		{"node address", nodeDoc("{}", "{addresses: [{type: Hostname, address: n1}, {type: InternalIP, address: 10.0.0.300}]}"), node, "status.addresses[1].address", "not a valid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Parse("x.yaml", []byte(tc.doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			assertHasError(t, Validate(objs), FieldError{"x.yaml#1", tc.object, tc.field, tc.want})
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"headless service without ports", svcDoc("{clusterIP: None, selector: {app: web}}")},
		{"dual-stack clusterIPs", svcDoc("{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10, 'fd00::10'], ports: [{port: 80}]}")},
		{"one unnamed service port", svcDoc("{ports: [{port: 80, protocol: UDP, targetPort: 8053}]}")},
		{"ipv6 slice", sliceDoc(svcLabel, "addressType: IPv6\nendpoints: [{addresses: ['fd00::5']}]\nports: [{name: dns, port: 53, protocol: UDP}]")},
		{"slice port without number", sliceDoc(svcLabel, "addressType: IPv4\nports: [{name: all}]")},
		{"np named port", npDoc("{podSelector: {}, ingress: [{ports: [{port: http, protocol: SCTP}]}]}")},
		{"np deny all", npDoc("{podSelector: {}, policyTypes: [Ingress, Egress]}")},
		{"snp selectors together", snpDoc("{podSelector: {}, egress: [{peers: [{podSelector: {}, namespaceSelector: {matchLabels: {team: a}}}]}]}")},
		{"snp any HTTP method token", snpDoc("{podSelector: {}, ingress: [{ports: [{port: 80}], http: [{method: PROPFIND}]}]}")},
		{"snp http on named ports", snpDoc("{podSelector: {}, ingress: [{ports: [{port: http}, {port: 8080, protocol: TCP}], http: [{path: '/metrics|/healthz'}]}]}")},
		{"snp egress without http", snpDoc("{podSelector: {}, egress: [{ports: [{port: 80, endPort: 90}]}]}")},
		{"route on a port", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, port: 80}, {group: '', kind: Service, name: web, port: 81}, {group: '', kind: Service, name: api}]}")},
		{"route with a namespace set to its own", routeDoc("{parentRefs: [{group: '', kind: Service, name: web, namespace: default}]}")},
		{"route without rules", routeDoc("{parentRefs: [{group: '', kind: Service, name: web}]}")},
		{"route regexp, header and query matches", ruleDoc("{matches: [{path: {type: RegularExpression, value: '/v[12]/.*'}, headers: [{name: X-Canary, value: 'true'}, " +
			"{type: RegularExpression, name: user-agent, value: '.*curl.*'}], queryParams: [{name: q, value: a}], method: PATCH}]}")},
		{"route zero timeout disables", ruleDoc("{timeouts: {request: 0s, backendRequest: 1h30m}, retry: {attempts: 3, codes: [500, 429], backoff: 1s500ms}}")},
		{"route weights at the bounds", backendDoc("{name: a, port: 80, weight: 0}, {name: b, port: 80, weight: 1000000}")},
		{"route header values with a tab", ruleDoc(`{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: "a\tb"}], add: [{name: X-B, value: "c\td"}]}}]}`)},
		{"route filters the proxy applies", ruleDoc("{matches: [{path: {value: /old}}], filters: [" +
			"{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Set, value: v}], add: [{name: X-Add, value: a}], remove: [X-Gone]}}, " +
			"{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-Resp, value: v}]}}, " +
			"{type: URLRewrite, urlRewrite: {hostname: new.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}], " +
			"backendRefs: [{name: web, port: 80, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Backend, value: b}]}}]}]}")},
		{"route mirrors, repeated", ruleDoc("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}}}, " +
			"{type: RequestMirror, requestMirror: {backendRef: {name: canary, namespace: other, port: 8080}, percent: 0}}, " +
			"{type: RequestMirror, requestMirror: {backendRef: {name: audit, port: 80}, fraction: {numerator: 1, denominator: 1000}}}], " +
			"backendRefs: [{name: web, port: 80}]}")},
		{"route redirect", ruleDoc("{filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.org, port: 8443, statusCode: 308, " +
			"path: {type: ReplacePrefixMatch, replacePrefixMatch: /moved}}}]}")},
		{"pod without image", podDoc("", "{containers: [{name: c, command: [sleep, '1']}]}")},
		{"node as the controller-manager and kubelet leave it", nodeDoc("{podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24]}",
			"{addresses: [{type: InternalIP, address: 192.168.50.11}, {type: Hostname, address: n1}]}")},
		{"node without pod CIDR yet", nodeDoc("{}", "{}")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Parse("x.yaml", []byte(tc.doc))
			if err == nil {
				err = Validate(objs)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
}

func TestValidateReportsEverything(t *testing.T) {
	doc := podDoc("", "{hostNetwork: true, containers: [{name: c}, {name: c, command: [x], ports: [{containerPort: 0}]}]}") + "\n---\n" +
		podDoc("", ctr("")) // a duplicate of the first
	objs, err := Parse("x.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	err = Validate(objs)
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("got %v", err)
	}
	want := []string{
		"x.yaml#1: Pod default/web: spec.containers[0].command: must not be empty: the lab runs command + args as the container's process (the image is not run)",
		`x.yaml#1: Pod default/web: spec.containers[1].name: duplicate container name "c"`,
		"x.yaml#1: Pod default/web: spec.containers[1].ports[0].containerPort: 0 is out of range 1-65535",
		"x.yaml#2: Pod default/web: metadata.name: duplicate: Pod default/web is also defined in x.yaml#1",
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

func TestDuplicateAcrossNamespacesIsFine(t *testing.T) {
	doc := podDoc(", namespace: a", ctr("")) + "\n---\n" + podDoc(", namespace: b", ctr("")) + "\n---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: a}\nspec: {ports: [{port: 80}]}"
	if err := Validate(mustParse(t, "x.yaml", doc)); err != nil {
		t.Error(err)
	}
}
