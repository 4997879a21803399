package kubecluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// KubeVersion is the Kubernetes release tools/kube/go.mod pins; the
// binaries of this version are what Up runs (a test checks the two agree).
const KubeVersion = "v1.37.2"

// kubePrograms are built by scripts/kube-build.sh into BinDir.
var kubePrograms = []string{"kube-apiserver", "kube-controller-manager", "kube-proxy", "kubectl"}

// DefaultBinDir is where scripts/kube-build.sh keeps the binaries of
// KubeVersion: ${SHUNT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shunt/kube}/<version>/bin.
// Keep the two in step.
func DefaultBinDir() string {
	cache := os.Getenv("SHUNT_KUBE_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				home = "/root"
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "shunt", "kube")
	}
	return filepath.Join(cache, KubeVersion, "bin")
}

// CheckBinaries says which Kubernetes program is missing from binDir, with
// how to build it, or nil.
func CheckBinaries(binDir string) error {
	for _, p := range kubePrograms {
		if st, err := os.Stat(filepath.Join(binDir, p)); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s %s is not built in %s: run scripts/kube-build.sh (or make kube) once; a cold build takes 15-20 minutes", p, KubeVersion, binDir)
		}
	}
	return nil
}

// etcdPath finds etcd, which comes from Debian's etcd-server package.
func etcdPath() (string, error) {
	p, err := exec.LookPath("etcd")
	if err != nil {
		return "", fmt.Errorf("etcd is not installed: run scripts/setup.sh (it installs Debian's etcd-server)")
	}
	return p, nil
}
