// Command helm lints and renders shunt's Helm chart (deploy/helm/shunt)
// with the Helm Go module, in a module of its own so that shunt's go.mod
// does not carry Helm. Its tests (chart_test.go) run in `make test`;
// `make generate` writes deploy/shunt.yaml with it:
//
//	go run . lint [-set k=v]... CHART
//	go run . template [-set k=v]... [-include-crds] CHART     # helm template
//	go run . manifest CHART > deploy/shunt.yaml              # the default install, with its namespace
//	go run . package [-app-version V] [-out DIR] CHART       # helm package
//	go run . install -kubeconfig F [-set k=v]... [-wait D] CHART   # helm install --create-namespace
//	go run . upgrade -kubeconfig F [-set k=v]... [-wait D] CHART   # helm upgrade
//	go run . uninstall -kubeconfig F [-wait D] NAME                # helm uninstall
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"helm.sh/helm/v3/pkg/lint/support"
)

type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "helm:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("give a command: lint, template, manifest or package")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	var sets setFlags
	rel := DefaultRelease
	fs.Var(&sets, "set", "a value, as helm's --set (repeatable)")
	fs.StringVar(&rel.Name, "name", rel.Name, "release name")
	fs.StringVar(&rel.Namespace, "namespace", rel.Namespace, "release namespace")
	fs.StringVar(&rel.KubeVersion, "kube-version", rel.KubeVersion, "Kubernetes version the rendering assumes")
	includeCRDs := fs.Bool("include-crds", false, "template: also the CRDs of crds/")
	appVersion := fs.String("app-version", "", "package: the chart's appVersion (the default image tag)")
	out := fs.String("out", ".", "package: the directory to write NAME-VERSION.tgz to")
	kubeconfig := fs.String("kubeconfig", "", "install, upgrade, uninstall: the cluster's kubeconfig")
	wait := fs.Duration("wait", 0, "install, upgrade, uninstall: wait this long for the release's objects to be ready (or gone)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s: give the chart's directory (uninstall: the release's name)", args[0])
	}
	chart := fs.Arg(0)
	vals, err := ParseSets(sets)
	if err != nil {
		return err
	}
	switch args[0] {
	case "lint":
		msgs := Lint(chart, rel, vals, support.InfoSev)
		failed := false
		for _, m := range msgs {
			fmt.Println(m)
			failed = failed || m.Severity >= support.WarningSev
		}
		if failed {
			return fmt.Errorf("lint: %s has warnings or errors", chart)
		}
		fmt.Printf("%s: linted, no warnings\n", chart)
		return nil
	case "template":
		m, err := Template(chart, rel, vals, *includeCRDs)
		if err != nil {
			return err
		}
		_, err = os.Stdout.WriteString(m)
		return err
	case "package":
		path, err := Package(chart, *out, *appVersion)
		if err != nil {
			return err
		}
		fmt.Println(path)
		return nil
	case "install", "upgrade":
		do := Install
		if args[0] == "upgrade" {
			do = Upgrade
		}
		r, err := do(*kubeconfig, chart, rel, vals, *wait)
		if err != nil {
			return fmt.Errorf("%s %s: %w", args[0], rel.Name, err)
		}
		fmt.Printf("release %s revision %d in %s: %s\n", r.Name, r.Version, r.Namespace, r.Info.Status)
		return nil
	case "uninstall":
		rel.Name = chart
		if err := Uninstall(*kubeconfig, rel, *wait); err != nil {
			return fmt.Errorf("uninstall %s: %w", rel.Name, err)
		}
		fmt.Printf("release %s uninstalled\n", rel.Name)
		return nil
	case "manifest":
		m, err := Template(chart, rel, vals, false)
		if err != nil {
			return err
		}
		return writeManifest(os.Stdout, rel, m)
	}
	return fmt.Errorf("unknown command %q: lint, template, manifest, package, install, upgrade or uninstall", args[0])
}
