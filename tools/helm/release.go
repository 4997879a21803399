package main

import (
	"fmt"
	"log"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// The release commands: helm install, upgrade and uninstall of the chart
// on the cluster a kubeconfig names, through the Helm Go module's actions
// (what the helm CLI runs), so that the lab installs shunt the way users
// do (scripts/helm-lab.sh).

func actionConfig(kubeconfig, namespace string) (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", log.Printf); err != nil {
		return nil, fmt.Errorf("helm against %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// configAndChart are what install and upgrade start from.
func configAndChart(kubeconfig, chartDir, namespace string) (*action.Configuration, *chart.Chart, error) {
	cfg, err := actionConfig(kubeconfig, namespace)
	if err != nil {
		return nil, nil, err
	}
	chrt, err := loader.Load(chartDir)
	return cfg, chrt, err
}

// Install is `helm install --create-namespace`.
func Install(kubeconfig, chartDir string, rel Release, vals map[string]any, wait time.Duration) (*release.Release, error) {
	cfg, chrt, err := configAndChart(kubeconfig, chartDir, rel.Namespace)
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = rel.Name, rel.Namespace, true
	in.Wait, in.Timeout = wait > 0, wait
	return in.Run(chrt, vals)
}

// Upgrade is `helm upgrade`.
func Upgrade(kubeconfig, chartDir string, rel Release, vals map[string]any, wait time.Duration) (*release.Release, error) {
	cfg, chrt, err := configAndChart(kubeconfig, chartDir, rel.Namespace)
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = rel.Namespace
	up.Wait, up.Timeout = wait > 0, wait
	return up.Run(rel.Name, chrt, vals)
}

// Uninstall is `helm uninstall` (--wait: until the release's objects are gone).
func Uninstall(kubeconfig string, rel Release, wait time.Duration) error {
	cfg, err := actionConfig(kubeconfig, rel.Namespace)
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.Wait, un.Timeout = wait > 0, wait
	_, err = un.Run(rel.Name)
	return err
}
