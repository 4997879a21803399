package lab

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/podexec"
)

// writeBlob stores data in the layout's blobs and returns its descriptor.
func writeBlob(t *testing.T, layout, mediaType string, data []byte) ociDescriptor {
	t.Helper()
	sum := sha256.Sum256(data)
	d := ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
	p := filepath.Join(layout, "blobs", "sha256", hex.EncodeToString(sum[:]))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// busyboxLayout writes an OCI layout of one image: Debian's static busybox
// as /bin/busybox with /bin/sh a link to it, named lab.test/busybox:t1.
func busyboxLayout(t *testing.T) (layout string, manifest ociDescriptor) {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox (Debian's busybox-static, scripts/setup.sh): %v", err)
	}
	var layer bytes.Buffer
	gz := gzip.NewWriter(&layer)
	tw := tar.NewWriter(gz)
	for _, h := range []tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))},
		{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "busybox"},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
		{Typeflag: tar.TypeReg, Name: "etc/gone", Mode: 0o644},
		{Typeflag: tar.TypeReg, Name: "etc/.wh.gone", Mode: 0o644},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Name == "bin/busybox" {
			tw.Write(bb)
		}
	}
	tw.Close()
	gz.Close()
	layout = filepath.Join(t.TempDir(), "oci")
	l := writeBlob(t, layout, "application/vnd.oci.image.layer.v1.tar+gzip", layer.Bytes())
	cfg, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "config": map[string]any{
		"Entrypoint": []string{"/bin/sh"}, "Cmd": []string{"-c", "exit 3"}, "Env": []string{"PATH=/bin"}}})
	c := writeBlob(t, layout, "application/vnd.oci.image.config.v1+json", cfg)
	man, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": c, "layers": []ociDescriptor{l}})
	manifest = writeBlob(t, layout, "application/vnd.oci.image.manifest.v1+json", man)
	manifest.Annotations = map[string]string{"org.opencontainers.image.ref.name": "t1", "io.containerd.image.name": "lab.test/busybox:t1"}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []ociDescriptor{manifest}})
	if err := os.WriteFile(filepath.Join(layout, "index.json"), index, 0o644); err != nil {
		t.Fatal(err)
	}
	return layout, manifest
}

func TestLayoutImageReferences(t *testing.T) {
	layout, man := busyboxLayout(t)
	for ref, want := range map[string]bool{
		"lab.test/busybox:t1":                  true,
		"lab.test/busybox@" + man.Digest:       true,
		"lab.test/busybox:t1@" + man.Digest:    true,
		"lab.test/busybox:t2":                  false,
		"other.test/busybox:t1":                false,
		"lab.test/busybox@sha256:" + zeros64(): false,
	} {
		img, err := findLayoutImage([]string{layout}, ref)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if (img != nil) != want {
			t.Errorf("%s: found %v, want %v", ref, img != nil, want)
		}
	}
	img, _ := findLayoutImage([]string{layout}, "lab.test/busybox:t1")
	for _, c := range []struct{ command, args, want []string }{
		{nil, nil, []string{"/bin/sh", "-c", "exit 3"}},
		{nil, []string{"-c", "true"}, []string{"/bin/sh", "-c", "true"}},
		{[]string{"sh"}, []string{"-c", "x"}, []string{"sh", "-c", "x"}},
	} {
		if got := img.argv(c.command, c.args); !slices.Equal(got, c.want) {
			t.Errorf("argv(%q, %q) = %q, want %q", c.command, c.args, got, c.want)
		}
	}
}

func zeros64() string { return strings.Repeat("0", 64) }

// TestImageContainerRunsInItsRootfs unpacks an image and runs a container
// of it through the shim: it sees the image's files and its volume, not
// the node's, and what it writes to the volume is on the node.
func TestImageContainerRunsInItsRootfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount namespaces and chroot")
	}
	layout, _ := busyboxLayout(t)
	imageCacheDir = filepath.Join(t.TempDir(), "images")
	img, err := findLayoutImage([]string{layout}, "lab.test/busybox:t1")
	if err != nil || img == nil {
		t.Fatalf("image not found: %v", err)
	}
	root, err := img.rootfs()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "gone")); !os.IsNotExist(err) {
		t.Errorf("etc/gone is in the root file system despite its whiteout (%v)", err)
	}
	if again, err := img.rootfs(); err != nil || again != root {
		t.Errorf("second unpack: %s, %v; want %s once", again, err, root)
	}
	vol := t.TempDir()
	os.WriteFile(filepath.Join(vol, "in"), []byte("from the node\n"), 0o644)
	exit := filepath.Join(t.TempDir(), "exit")
	t.Setenv("PATH", img.imagePath())
	script := `cat /data/in > /data/out; ls / > /data/root; test -e /proc/self/status && echo proc >> /data/out; test -e ` + vol + ` || echo no-node-dir >> /data/out; exit 7`
	code := RunShimIn("", exit, "", "", podexec.Security{Drop: []string{"ALL"}} /* as the chart's install-cni: chroot before the drop */, ContainerFS{Rootfs: root, Mounts: []podexec.Mount{{Source: vol, Target: "/data"}}},
		[]string{"sh", "-c", script})
	if code != 7 {
		st, _ := readExitStatus(exit)
		t.Fatalf("container exit %d, want 7 (status %+v)", code, st)
	}
	out, _ := os.ReadFile(filepath.Join(vol, "out"))
	if want := "from the node\nproc\nno-node-dir\n"; string(out) != want {
		t.Errorf("container wrote %q, want %q", out, want)
	}
	ls, _ := os.ReadFile(filepath.Join(vol, "root"))
	if got := strings.Fields(string(ls)); !slices.Contains(got, "bin") || slices.Contains(got, "work") || slices.Contains(got, "home") {
		t.Errorf("the container's / holds %q: want the image's (bin, data, dev, proc, sys, tmp, etc)", got)
	}
}

// TestImageProcessVolumes: a pod of an image gets its hostPath (mapped to
// the node's own directory), emptyDir and env from the downward API.
func TestImageProcessVolumes(t *testing.T) {
	layout, _ := busyboxLayout(t)
	imageCacheDir = filepath.Join(t.TempDir(), "images")
	nodeCNI := filepath.Join(t.TempDir(), "net.d")
	dot := corev1.HostPathDirectoryOrCreate
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: corev1.PodSpec{NodeName: "n1",
		Volumes: []corev1.Volume{
			{Name: "conf", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d", Type: &dot}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
		Containers: []corev1.Container{{Name: "c", Image: "lab.test/busybox:t1", Args: []string{"-c", "true"},
			Env:          []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "conf", MountPath: "/host/etc/cni/net.d"}, {Name: "scratch", MountPath: "/scratch", ReadOnly: true}}}},
	}}
	k := &kubelet{cfg: Config{Images: Images{Layouts: []string{layout}}, HostPaths: map[string]string{"/etc/cni/net.d": nodeCNI}}}
	k.cfg.Instance.Name = "rfstest"
	rec := &PodRecord{Namespace: "ns", Name: "p", IP: "10.0.0.5"}
	argv, flags, path, err := k.imageProcess(pod, rec, pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	// The instance's whole state directory: the pod's is only its
	// innermost (the pods/ directory above it was left behind).
	t.Cleanup(func() { os.RemoveAll(k.cfg.Instance.StateDir()) })
	if !slices.Equal(argv, []string{"/bin/sh", "-c", "true"}) || path != "/bin" {
		t.Errorf("argv %q PATH %q", argv, path)
	}
	if _, err := os.Stat(nodeCNI); err != nil {
		t.Errorf("the DirectoryOrCreate hostPath was not created at the node's own directory: %v", err)
	}
	joined := strings.Join(flags, " ")
	for _, want := range []string{"--rootfs " + imageCacheDir, "--mount " + nodeCNI + ":/host/etc/cni/net.d", ":/scratch:ro"} {
		if !strings.Contains(joined, want) {
			t.Errorf("shim flags %q lack %q", joined, want)
		}
	}
	if env, err := k.containerEnv(pod, rec, pod.Spec.Containers[0], ""); err != nil || !slices.Contains(env, "NODE_NAME=n1") {
		t.Errorf("env %q lacks NODE_NAME=n1 (fieldRef spec.nodeName)", env)
	}
}
