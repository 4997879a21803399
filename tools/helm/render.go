package main

import (
	"fmt"
	"io"
	"log"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/strvals"
)

// Release names the rendering: the release and namespace shunt's manifest
// and docs use.
type Release struct {
	Name, Namespace string
	KubeVersion     string   // "" : Helm's default (its client library's)
	APIVersions     []string // extra API versions the cluster serves (e.g. monitoring.coreos.com/v1)
}

// DefaultRelease is how deploy/shunt.yaml is rendered and how the docs
// install it.
// The Kubernetes version is the one shunt's tests run (tools/kube/go.mod):
// Helm's own default is its client library's build setting (1.20), older
// than the chart's kubeVersion.
var DefaultRelease = Release{Name: "shunt", Namespace: "shunt-system", KubeVersion: "v1.37.2"}

func init() {
	// Helm's loader logs, for every load, that crds/ is a symbolic link
	// (to deploy/crds, on purpose: one copy of the CRDs); nothing else of
	// Helm's used here logs.
	log.SetOutput(io.Discard)
}

// ParseSets reads --set style assignments (a.b=c,d=e) into values, as
// `helm template --set` does.
func ParseSets(sets []string) (map[string]any, error) {
	vals := map[string]any{}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	return vals, nil
}

// Template renders the chart as `helm template` does (client only, no
// cluster) and returns the manifest: every object of templates/, sorted
// the way Helm installs them, without the CRDs (crds/, which Helm applies
// before and never upgrades) unless includeCRDs.
func Template(chartDir string, rel Release, vals map[string]any, includeCRDs bool) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", fmt.Errorf("loading the chart %s: %w", chartDir, err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun, install.DryRunOption = true, "true"
	install.ClientOnly, install.Replace = true, true
	install.ReleaseName, install.Namespace = rel.Name, rel.Namespace
	install.IncludeCRDs = includeCRDs
	install.APIVersions = chartutil.VersionSet(rel.APIVersions)
	if rel.KubeVersion != "" {
		kv, err := chartutil.ParseKubeVersion(rel.KubeVersion)
		if err != nil {
			return "", fmt.Errorf("kube version %q: %w", rel.KubeVersion, err)
		}
		install.KubeVersion = kv
	}
	r, err := install.Run(chrt, vals)
	if err != nil {
		return "", fmt.Errorf("rendering %s: %w", chartDir, err)
	}
	return strings.TrimSpace(r.Manifest) + "\n", nil
}

// Package writes the chart as the archive `helm package` makes
// (NAME-VERSION.tgz in outDir), for `helm install` from a file or an OCI
// registry (`helm push`); crds/ is stored as files, not as the link.
// appVersion, when given, replaces the chart's (the image tag it
// defaults to).
func Package(chartDir, outDir, appVersion string) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", fmt.Errorf("loading the chart %s: %w", chartDir, err)
	}
	if appVersion != "" {
		chrt.Metadata.AppVersion = appVersion
	}
	if err := chrt.Validate(); err != nil {
		return "", err
	}
	return chartutil.Save(chrt, outDir)
}

// Lint runs `helm lint`'s rules on the chart with vals; it returns every
// message at or above severity (support.WarningSev: warnings and errors).
func Lint(chartDir string, rel Release, vals map[string]any, severity int) []support.Message {
	var kv *chartutil.KubeVersion
	if rel.KubeVersion != "" {
		kv, _ = chartutil.ParseKubeVersion(rel.KubeVersion)
	}
	l := lint.AllWithKubeVersion(chartDir, vals, rel.Namespace, kv)
	var out []support.Message
	for _, m := range l.Messages {
		if m.Severity >= severity {
			out = append(out, m)
		}
	}
	return out
}

// writeManifest writes what `make generate` commits as deploy/shunt.yaml:
// a header, the namespace (Helm creates it with --create-namespace), and
// the rendered chart.
func writeManifest(w io.Writer, rel Release, manifest string) error {
	_, err := fmt.Fprintf(w, `# Generated from the Helm chart deploy/helm/shunt with its default values
# (tools/helm, 'make generate'); do not edit: change the chart. The same as
#   helm template %s deploy/helm/shunt --namespace %s
# with the namespace. Install the CRDs first (Helm does it from the chart):
#   kubectl apply -f deploy/crds/
#   kubectl apply -f deploy/shunt.yaml
# The image is ghcr.io/shuntnet/shunt:<appVersion>; build it with 'make image'
# (docs/install.md).
apiVersion: v1
kind: Namespace
metadata:
  name: %s
---
%s`, rel.Name, rel.Namespace, rel.Namespace, strings.TrimPrefix(manifest, "---\n"))
	return err
}
