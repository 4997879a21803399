package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestImageIsReproducible builds the image twice, from the go build on,
// and wants the same digest and byte-identical outputs; then checks what
// the image says about itself and holds. With no uncommitted change the
// second build is of a fresh clone of the commit elsewhere (another path,
// a plain .git where this may be a worktree): what another machine would
// build from that commit.
func TestImageIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every shunt program twice")
	}
	src, err := ReadSource("../..")
	if err != nil {
		t.Fatal(err)
	}
	repos := [2]string{"../..", "../.."}
	if strings.HasSuffix(src.Revision, "-dirty") {
		t.Logf("uncommitted changes: both builds from this tree (a clone would not hold them)")
	} else {
		clone := filepath.Join(t.TempDir(), "shunt")
		if out, err := exec.Command("git", "clone", "--quiet", "--no-hardlinks", "../..", clone).CombinedOutput(); err != nil {
			t.Fatalf("git clone: %v\n%s", err, out)
		}
		if out, err := exec.Command("git", "-C", clone, "checkout", "--quiet", "--detach", src.Revision).CombinedOutput(); err != nil {
			t.Fatalf("git checkout: %v\n%s", err, out)
		}
		repos[1] = clone
	}
	var results [2]*Result
	var dirs [2]string
	for i := range results {
		dirs[i] = t.TempDir()
		r, err := Build(Options{Repo: repos[i], Arch: runtime.GOARCH, Tag: "ghcr.io/shuntnet/shunt:test",
			Layout: filepath.Join(dirs[i], "oci"), Tar: filepath.Join(dirs[i], "shunt.tar")})
		if err != nil {
			t.Fatal(err)
		}
		results[i] = r
	}
	if results[0].Digest != results[1].Digest {
		t.Fatalf("two builds of one commit (%s and %s): digests %s and %s", repos[0], repos[1], results[0].Digest, results[1].Digest)
	}
	if a, b := fileSHA256(t, filepath.Join(dirs[0], "shunt.tar")), fileSHA256(t, filepath.Join(dirs[1], "shunt.tar")); a != b {
		t.Errorf("docker archives differ: sha256 %s and %s", a, b)
	}
	if a, b := fileSHA256(t, filepath.Join(dirs[0], "oci", "index.json")), fileSHA256(t, filepath.Join(dirs[1], "oci", "index.json")); a != b {
		t.Errorf("OCI layouts' index.json differ: %s and %s", a, b)
	}
	t.Logf("digest %s (revision %s)", results[0].Digest, results[0].Source.Revision)

	// What a runtime reads: the layout's image and the archive's are the
	// image built, with its config.
	lp, err := layout.FromPath(filepath.Join(dirs[0], "oci"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != results[0].Digest || im.Manifests[0].MediaType != types.OCIManifestSchema1 {
		t.Fatalf("layout index: %+v, want one OCI manifest %s", im.Manifests, results[0].Digest)
	}
	if a := im.Manifests[0].Annotations; a["org.opencontainers.image.ref.name"] != "test" || a["io.containerd.image.name"] != "ghcr.io/shuntnet/shunt:test" {
		t.Errorf("layout annotations %q", a)
	}
	img, err := tarball.ImageFromPath(filepath.Join(dirs[0], "shunt.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if results[0].Source != src || results[1].Source.Time != src.Time {
		t.Errorf("sources %+v and %+v, want %+v", results[0].Source, results[1].Source, src)
	}
	if want := []string{"/usr/local/bin/shuntd"}; !slices.Equal(cf.Config.Entrypoint, want) {
		t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, want)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if !cf.Created.Time.Equal(src.Time) {
		t.Errorf("created %s, want the commit time %s", cf.Created.Time, src.Time)
	}
	if got := cf.Config.Labels["org.opencontainers.image.revision"]; got != src.Revision || len(strings.TrimSuffix(got, "-dirty")) != 40 {
		t.Errorf("revision label %q, want the commit %q", got, src.Revision)
	}
	for _, k := range []string{"org.opencontainers.image.source", "org.opencontainers.image.created", "org.opencontainers.image.title"} {
		if cf.Config.Labels[k] == "" {
			t.Errorf("label %s missing", k)
		}
	}
	if !slices.ContainsFunc(cf.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=/usr/local/bin") }) {
		t.Errorf("env %q: the chart runs the programs by name", cf.Config.Env)
	}

	// The layer: the programs, executable, owned by root, at the commit
	// time, in sorted order, and nothing else but the few root files.
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v, want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	eachEntry(t, rc, func(h *tar.Header, _ io.Reader) {
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(src.Time) {
			t.Errorf("%s: uid %d gid %d mtime %s, want 0 0 %s", h.Name, h.Uid, h.Gid, h.ModTime, src.Time)
		}
		if strings.HasPrefix(h.Name, "usr/local/bin/") && h.Typeflag == tar.TypeReg && h.Mode != 0o755 {
			t.Errorf("%s mode %o", h.Name, h.Mode)
		}
	})
	if !slices.IsSorted(names) {
		t.Errorf("layer entries not sorted: %q", names)
	}
	for _, p := range Programs {
		if !slices.Contains(names, "usr/local/bin/"+p.Name) {
			t.Errorf("layer lacks usr/local/bin/%s: %q", p.Name, names)
		}
	}

	t.Run("runs with nothing but the image", func(t *testing.T) { runInImage(t, img) })
}

// eachEntry calls fn with every entry of the tar stream r and its content.
func eachEntry(t *testing.T, r io.Reader, fn func(h *tar.Header, data io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

// runInImage unpacks the image and runs its programs chrooted into it, as
// a runtime would with no base image: no libc, no shell, nothing of the
// host. The init container's job (shunt-install-cni) is done for real,
// into the unpacked tree's /tmp.
func runInImage(t *testing.T, img v1.Image) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	eachEntry(t, rc, func(h *tar.Header, data io.Reader) {
		path := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			mode := os.FileMode(h.Mode).Perm()
			if h.Mode&0o1000 != 0 {
				mode |= os.ModeSticky // /tmp
			}
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode).Perm())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, data); err != nil {
				t.Fatal(err)
			}
			f.Close()
		default:
			t.Fatalf("unexpected entry %s (type %c)", h.Name, h.Typeflag)
		}
	})
	run := func(args ...string) (string, error) {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/bin"}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for prog, want := range map[string]string{"shuntd": "--in-cluster", "shunt": "status", "shunt-proxy": "sage", "shunt-install-cni": "cni-bin-dir"} {
		out, err := run("/usr/local/bin/"+prog, "--help")
		// flag's --help exits 0 (cobra) or 2 (the flag package): either way
		// it ran, which a binary needing a loader would not.
		if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 2) || !strings.Contains(out, want) {
			t.Errorf("%s --help in the image: %v\n%s", prog, err, out)
		}
	}
	if out, err := run("/usr/local/bin/shunt-install-cni", "--cni-bin-dir=/tmp/opt/cni/bin", "--cni-conf-dir=/tmp/etc/cni/net.d"); err != nil {
		t.Fatalf("shunt-install-cni in the image: %v\n%s", err, out)
	}
	plugin, err := os.ReadFile(filepath.Join(root, "tmp/opt/cni/bin/shunt-cni"))
	orig, _ := os.ReadFile(filepath.Join(root, "usr/local/bin/shunt-cni"))
	if err != nil || len(plugin) == 0 || !bytes.Equal(plugin, orig) {
		t.Errorf("the plugin the init container installs: %d bytes, %v", len(plugin), err)
	}
	if conf, err := os.ReadFile(filepath.Join(root, "tmp/etc/cni/net.d/10-shunt.conflist")); err != nil || !bytes.Contains(conf, []byte(`"type": "shunt-cni"`)) {
		t.Errorf("the network configuration: %v\n%s", err, conf)
	}
	// The probe's command runs; with no agent it says so and fails.
	if out, err := run("/usr/local/bin/shunt", "status"); err == nil || !strings.Contains(out, "shuntd.sock") {
		t.Errorf("shunt status with no agent: %v\n%s", err, out)
	}
}
