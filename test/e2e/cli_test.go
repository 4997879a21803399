package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGetAndDeleteLikeKubectl: `get` lists every kind apply accepts, selects
// by labels and shows them, names the known kinds for an unknown one, and
// `delete -f` needs only what names an object.
func TestGetAndDeleteLikeKubectl(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	netpol := write("netpol.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-client, labels: {team: shop}}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}]}]
`)
	l.mustShunt("apply", "-f", netpol, "-f", "testdata/shunt-policy.yaml")

	// NetworkPolicies: kubectl's table.
	out := l.mustShunt("get", "netpol")
	if ls := fields(out); len(ls) != 2 || ls[0] != "NAME POD-SELECTOR AGE" || !strings.HasPrefix(ls[1], "web-from-client app=web ") {
		t.Errorf("get netpol:\n%s", out)
	}
	out = l.mustShunt("get", "networkpolicies", "-l", "team=shop", "-o", "name")
	if strings.TrimSpace(out) != "networkpolicy/web-from-client" {
		t.Errorf("get networkpolicies -l team=shop -o name:\n%s", out)
	}

	// ShuntNetworkPolicies: a List of Kubernetes-shaped objects.
	var snps struct {
		APIVersion, Kind string
		Items            []struct {
			APIVersion, Kind string
			Metadata         struct{ Name, Namespace, CreationTimestamp string }
		}
	}
	out = l.mustShunt("get", "shuntnetworkpolicies", "-o", "json")
	if err := json.Unmarshal([]byte(out), &snps); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	var names []string
	for _, it := range snps.Items {
		if it.APIVersion != "shunt.io/v1alpha1" || it.Kind != "ShuntNetworkPolicy" || it.Metadata.Namespace != "default" || it.Metadata.CreationTimestamp == "" {
			t.Errorf("item %+v", it)
		}
		names = append(names, it.Metadata.Name)
	}
	if snps.APIVersion != "v1" || snps.Kind != "List" || !slices.Equal(names, []string{"client-deny-only", "web-shunt"}) {
		t.Errorf("get shuntnetworkpolicies -o json: %s %s %v", snps.APIVersion, snps.Kind, names)
	}
	out = l.mustShunt("get", "snp")
	if !strings.Contains(out, "INGRESS") || !strings.Contains(fieldsText(out), "web-shunt app=web 2 allow, 2 deny <none>") {
		t.Errorf("get snp:\n%s", out)
	}

	// Label selectors and the LABELS column on pods.
	out = l.mustShunt("get", "pods", "-l", "app=web", "-o", "name")
	if got := strings.Fields(out); !slices.Equal(got, []string{"pod/web-1", "pod/web-2"}) {
		t.Errorf("get pods -l app=web: %v", got)
	}
	out = l.mustShunt("get", "pods", "-l", "app in (client, nothing)", "-o", "name")
	if got := strings.Fields(out); !slices.Equal(got, []string{"pod/client"}) {
		t.Errorf("get pods -l 'app in (client, nothing)': %v", got)
	}
	out = l.mustShunt("get", "pods", "--show-labels")
	ls := fields(out)
	if len(ls) != 4 || !strings.HasSuffix(ls[0], " AGE LABELS") || !strings.HasSuffix(ls[2], " app=web") {
		t.Errorf("get pods --show-labels:\n%s", out)
	}
	if out, code := l.shunt("get", "pods", "-l", "app in (web"); code == 0 || !strings.Contains(out, `invalid label selector "app in (web"`) {
		t.Errorf("bad selector: exit %d:\n%s", code, out)
	}

	// An unknown kind names the known ones.
	out, code := l.shunt("get", "deployments")
	if code != 1 || !strings.Contains(out, `error: the server doesn't have a resource type "deployments"`) ||
		!strings.Contains(out, "networkpolicies (netpol)") || !strings.Contains(out, "shuntnetworkpolicies (snp)") {
		t.Errorf("get deployments: exit %d:\n%s", code, out)
	}

	// delete -f with only apiVersion, kind and metadata: the Service goes,
	// its EndpointSlices with it, the other Service stays.
	if !strings.Contains(l.mustShunt("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "name"), "endpointslice/") {
		t.Fatal("the web service has no EndpointSlice to begin with")
	}
	minimal := write("minimal.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n")
	out = l.mustShunt("delete", "-f", minimal)
	if !strings.Contains(out, "service/web deleted") {
		t.Errorf("delete -f minimal.yaml:\n%s", out)
	}
	if out, code := l.shunt("get", "svc", "web"); code == 0 || !strings.Contains(out, `services "web" not found`) {
		t.Errorf("get svc web after delete: exit %d:\n%s", code, out)
	}
	if got := strings.Fields(l.mustShunt("get", "svc", "-o", "name")); !slices.Equal(got, []string{"service/empty"}) {
		t.Errorf("services after delete: %v", got)
	}
	if out := l.mustShunt("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "name"); out != "" {
		t.Errorf("EndpointSlices of the deleted service remain:\n%s", out)
	}
	// The policies too, named the same way; a reference without a name is
	// refused with file, object and field, and nothing is deleted.
	l.mustShunt("delete", "-f", write("netpol-ref.yaml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-from-client}\n"))
	if out := l.mustShunt("get", "netpol"); strings.Contains(out, "web-from-client") || !strings.Contains(out, "No resources found in default namespace.") {
		t.Errorf("get netpol after delete:\n%s", out)
	}
	bad := write("bad-ref.yaml", "apiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {name: web-shunt}\n---\n"+
		"apiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {namespace: default}\n")
	if out, code := l.shunt("delete", "-f", bad); code == 0 || !strings.Contains(out, bad+"#2: ShuntNetworkPolicy (unnamed): metadata.name: required") {
		t.Errorf("delete without a name: exit %d:\n%s", code, out)
	}
	if got := strings.Fields(l.mustShunt("get", "snp", "-o", "name")); len(got) != 2 {
		t.Errorf("a refused delete deleted something: %v", got)
	}
}

// fields splits output into lines with the column spacing collapsed.
func fields(out string) []string {
	var ls []string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		ls = append(ls, strings.Join(strings.Fields(l), " "))
	}
	return ls
}

func fieldsText(out string) string { return strings.Join(fields(out), "\n") }
