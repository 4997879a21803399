package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Programs are the commands the image carries, each built from the
// package beside it in the shunt module, all into /usr/local/bin (on the
// default PATH, where the chart's command and probes find them).
var Programs = []struct{ Name, Package string }{
	{"shuntd", "./cmd/shuntd"},
	{"shunt", "./cmd/shunt"},
	{"shunt-cni", "./cmd/shunt-cni"},
	{"shunt-proxy", "./cmd/shunt-proxy"},
	// Copies shunt-cni and its network configuration onto the node (the
	// chart's init container): the image has no shell to do it with.
	{"shunt-install-cni", "./deploy/shunt-install-cni"},
}

// BinDir is where the programs are in the image.
const BinDir = "/usr/local/bin"

// Options says what to build and where to write it.
type Options struct {
	Repo   string // the shunt module's root (a git checkout)
	Arch   string // GOARCH of the binaries and the image
	Tag    string // the name the docker archive and the layout's ref carry
	Layout string // the OCI image layout directory to write (replaced)
	Tar    string // the docker-archive tarball to write (`docker load -i`)
}

// Source is the commit the image is built from.
type Source struct {
	Revision string    // commit hash, "-dirty" appended when the tree has changes
	Time     time.Time // the commit's committer time: every timestamp of the image
}

// Result is what was built.
type Result struct {
	Source   Source
	Digest   v1.Hash // the image manifest's digest: what a registry names it by
	Image    v1.Image
	Binaries map[string]int64 // program name -> size in bytes
}

// ReadSource reads the commit and its time from git, so that the same
// commit gives the same timestamps, hence the same digest.
func ReadSource(repo string) (Source, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = strings.TrimSpace(string(ee.Stderr))
			}
			return "", fmt.Errorf("git %s in %s: %v %s (the image is built from a git checkout of shunt)", strings.Join(args, " "), repo, err, stderr)
		}
		return strings.TrimSpace(string(out)), nil
	}
	rev, err := git("rev-parse", "HEAD")
	if err != nil {
		return Source{}, err
	}
	ct, err := git("log", "-1", "--format=%ct", "HEAD")
	if err != nil {
		return Source{}, err
	}
	var secs int64
	if _, err := fmt.Sscan(ct, &secs); err != nil {
		return Source{}, fmt.Errorf("commit time %q of %s: %v", ct, rev, err)
	}
	status, err := git("status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return Source{}, err
	}
	if status != "" {
		// Not that commit: say so in the label rather than claim it.
		rev += "-dirty"
	}
	return Source{Revision: rev, Time: time.Unix(secs, 0).UTC()}, nil
}

// BuildBinaries builds every program into dir: static (CGO_ENABLED=0),
// -trimpath so no path of this machine is inside, no build ID of the link
// (-buildid=), and -buildvcs=false: Go stamps VCS information only where
// .git is a directory, so the same commit built in a clone and in a git
// worktree (where .git is a file) would differ; the commit is in the
// image's revision label instead. The same sources give the same bytes.
func BuildBinaries(repo, arch, dir string) (map[string]int64, error) {
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", dir + "/"}
	for _, p := range Programs {
		args = append(args, p.Package)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOWORK=off")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s (in %s): %w", strings.Join(args, " "), repo, err)
	}
	sizes := map[string]int64{}
	for _, p := range Programs {
		path := filepath.Join(dir, p.Name)
		if err := checkStatic(path); err != nil {
			return nil, err
		}
		fi, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		sizes[p.Name] = fi.Size()
	}
	return sizes, nil
}

// checkStatic refuses a binary that needs a dynamic loader or shared
// libraries: the image has none.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it has an ELF interpreter); the image has no libc: build it with CGO_ENABLED=0", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v; the image has none: build it with CGO_ENABLED=0", path, libs)
	}
	return nil
}

// rootFiles are the few files besides the programs: a root user and group
// (Go's os/user and `id`-minded tools resolve uid 0 to a name without
// them failing) and the host lookup order Go's resolver reads. No CA
// certificates: the agent talks only to the API server, whose CA the
// service account's token volume brings (ca.crt), and the node proxy
// originates no TLS.
var rootFiles = []struct {
	name string
	mode int64
	data string
}{
	{"etc/group", 0o644, "root:x:0:\n"},
	{"etc/nsswitch.conf", 0o644, "hosts: files dns\n"},
	{"etc/passwd", 0o644, "root:x:0:0:root:/:/sbin/nologin\n"},
}

// Layer writes the image's one layer: the programs of binDir and
// rootFiles, as a tar whose every entry has the commit time, uid/gid 0,
// fixed modes and a sorted order, so equal inputs give equal bytes.
func Layer(binDir string, mtime time.Time) ([]byte, error) {
	type entry struct {
		hdr  tar.Header
		data []byte
	}
	var entries []entry
	dir := func(name string, mode int64) {
		entries = append(entries, entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}})
	}
	file := func(name string, mode int64, data []byte) {
		entries = append(entries, entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data: data})
	}
	dir("etc", 0o755)
	// A world-writable /tmp, as every base image has: os.TempDir() is /tmp.
	dir("tmp", 0o1777)
	dir("usr", 0o755)
	dir("usr/local", 0o755)
	dir("usr/local/bin", 0o755)
	for _, f := range rootFiles {
		file(f.name, f.mode, []byte(f.data))
	}
	for _, p := range Programs {
		data, err := os.ReadFile(filepath.Join(binDir, p.Name))
		if err != nil {
			return nil, err
		}
		file(strings.TrimPrefix(BinDir, "/")+"/"+p.Name, 0o755, data)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].hdr.Name < entries[j].hdr.Name })
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := e.hdr
		h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname = mtime, 0, 0, "root", "root"
		h.Format = tar.FormatPAX // no atime/ctime: PAX records only what is set
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Labels are the OCI annotations the image's config carries.
func Labels(src Source) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "shunt",
		"org.opencontainers.image.description": "shunt: eBPF pod networking, services and policy for Kubernetes (shuntd, shunt, shunt-cni, shunt-proxy)",
		"org.opencontainers.image.source":      "https://github.com/shuntnet/shunt",
		"org.opencontainers.image.revision":    src.Revision,
		"org.opencontainers.image.created":     src.Time.Format(time.RFC3339),
	}
}

// Image assembles the OCI image: one layer, no base image (the programs
// are static), shuntd as the entrypoint.
func Image(layerTar []byte, src Source, arch string) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: src.Time}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   created,
			CreatedBy: "make image (tools/image): " + strings.Join(programNames(), " ") + " in " + BinDir,
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = arch, "linux", created
	cf.Config = v1.Config{
		Entrypoint: []string{BinDir + "/shuntd"},
		Env:        []string{"PATH=" + BinDir + ":/usr/bin:/bin"},
		WorkingDir: "/",
		Labels:     Labels(src),
	}
	return mutate.ConfigFile(img, cf)
}

func programNames() []string {
	var names []string
	for _, p := range Programs {
		names = append(names, p.Name)
	}
	return names
}

// Build builds the binaries, the image, and writes the layout and the
// docker archive.
func Build(o Options) (*Result, error) {
	src, err := ReadSource(o.Repo)
	if err != nil {
		return nil, err
	}
	ref, err := name.NewTag(o.Tag)
	if err != nil {
		return nil, fmt.Errorf("--tag %q: %w", o.Tag, err)
	}
	binDir, err := os.MkdirTemp("", "shunt-image-bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(binDir)
	sizes, err := BuildBinaries(o.Repo, o.Arch, binDir)
	if err != nil {
		return nil, err
	}
	layerTar, err := Layer(binDir, src.Time)
	if err != nil {
		return nil, err
	}
	img, err := Image(layerTar, src, o.Arch)
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	if o.Layout != "" {
		// A fresh layout: appending to an old one would keep its images in
		// index.json, and the layout would differ run to run.
		if err := os.RemoveAll(o.Layout); err != nil {
			return nil, err
		}
		p, err := layout.Write(o.Layout, empty.Index)
		if err != nil {
			return nil, fmt.Errorf("writing the OCI layout %s: %w", o.Layout, err)
		}
		// ref.name is the tag alone, as skopeo and podman read it
		// (oci:DIR:dev); containerd's import reads the full name.
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref.TagStr(),
			"io.containerd.image.name":          ref.Name(),
		})); err != nil {
			return nil, fmt.Errorf("writing the OCI layout %s: %w", o.Layout, err)
		}
	}
	if o.Tar != "" {
		if err := os.MkdirAll(filepath.Dir(o.Tar), 0o755); err != nil {
			return nil, err
		}
		if err := tarball.WriteToFile(o.Tar, ref, img); err != nil {
			return nil, fmt.Errorf("writing the docker archive %s: %w", o.Tar, err)
		}
	}
	return &Result{Source: src, Digest: digest, Image: img, Binaries: sizes}, nil
}
