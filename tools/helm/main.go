// Command helm lints and renders shunt's Helm chart (deploy/helm/shunt)
// with the Helm Go module, in a module of its own so that shunt's go.mod
// does not carry Helm. Its tests (chart_test.go) run in `make test`;
// `make generate` writes deploy/shunt.yaml with it:
//
//	go run . lint [-set k=v]... CHART
//	go run . template [-set k=v]... [-include-crds] CHART     # helm template
//	go run . manifest CHART > deploy/shunt.yaml              # the default install, with its namespace
//	go run . package [-app-version V] [-out DIR] CHART       # helm package
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
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s: give the chart's directory", args[0])
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
	case "manifest":
		m, err := Template(chart, rel, vals, false)
		if err != nil {
			return err
		}
		return writeManifest(os.Stdout, rel, m)
	}
	return fmt.Errorf("unknown command %q: lint, template, manifest or package", args[0])
}
