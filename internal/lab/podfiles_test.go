package lab

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/shuntnet/shunt/internal/podexec"
)

// objectsOf is a volumeObjects over fixed objects (no tokens).
type objectsOf struct {
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

func (o objectsOf) configMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	if cm := o.configMaps[ns+"/"+name]; cm != nil {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (objectsOf) token(context.Context, *corev1.Pod, []string, *int64) (string, error) {
	return "", errors.New("objectsOf has no tokens")
}

func (o objectsOf) secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s := o.secrets[ns+"/"+name]; s != nil {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

// A pod's files: resolv.conf and hosts for every container (unless it
// mounts its own), its configMap (items, modes), secret, optional-missing
// and emptyDir volumes at each container's mount paths, read-only where
// kubelet makes them so.
func TestPodFiles(t *testing.T) {
	dir := t.TempDir()
	mode := int32(0o600)
	k := &kubelet{cfg: Config{DNS: DNS{ResolvConf: filepath.Join(dir, "none")}, Images: Images{CoreDNS: "/opt/kube/coredns"}}, objects: objectsOf{
		configMaps: map[string]*corev1.ConfigMap{"kube-system/coredns": {Data: map[string]string{"Corefile": ".:53 {}\n", "other": "x"}}},
		secrets:    map[string]*corev1.Secret{"kube-system/kc": {Data: map[string][]byte{"kubeconfig": []byte("apiVersion: v1\n")}}},
	}}
	yes := true
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}, Items: []corev1.KeyToPath{{Key: "Corefile", Path: "conf/Corefile", Mode: &mode}}}}},
			{Name: "kc", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kc"}}},
			{Name: "maybe", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "absent", Optional: &yes}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
		Containers: []corev1.Container{
			{Name: "coredns", Image: "registry.k8s.io/coredns/coredns:v1.15.0", VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns"}, {Name: "kc", MountPath: "/var/run/secrets/coredns"},
				{Name: "maybe", MountPath: "/maybe"}, {Name: "scratch", MountPath: "/tmp/scratch"}}},
			{Name: "own-hosts", VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/etc/hosts", SubPath: "hosts"}}},
		},
	}}
	binds, err := k.podFiles(context.Background(), pod, &PodRecord{IP: "10.244.0.9"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(dir, "volumes")
	want := []podexec.Bind{
		{Source: filepath.Join(dir, "etc-hosts"), Target: "/etc/hosts"},
		{Source: filepath.Join(dir, "resolv.conf"), Target: "/etc/resolv.conf"},
		{Source: filepath.Join(vol, "config"), Target: "/etc/coredns", ReadOnly: true},
		{Source: filepath.Join(vol, "kc"), Target: "/var/run/secrets/coredns", ReadOnly: true},
		{Source: filepath.Join(vol, "maybe"), Target: "/maybe", ReadOnly: true},
		{Source: filepath.Join(vol, "scratch"), Target: "/tmp/scratch"},
		{Source: "/opt/kube/coredns", Target: "/coredns", ReadOnly: true}, // the image's program, for an exec naming it
	}
	sortBinds := func(b []podexec.Bind) {
		slices.SortFunc(b, func(x, y podexec.Bind) int { return strings.Compare(x.Target, y.Target) })
	}
	sortBinds(binds["coredns"])
	sortBinds(want)
	if !slices.Equal(binds["coredns"], want) {
		t.Errorf("coredns mounts\n%+v\nwant\n%+v", binds["coredns"], want)
	}
	own := binds["own-hosts"]
	if len(own) != 2 || own[1].Target != "/etc/hosts" || own[1].Source != filepath.Join(vol, "scratch", "hosts") || own[0].Target != "/etc/resolv.conf" {
		t.Errorf("a container mounting its own /etc/hosts got %+v", own)
	}
	st, err := os.Stat(filepath.Join(vol, "config", "conf", "Corefile"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the Corefile item: %v, mode %v; want mode 0600", err, st)
	}
	if _, err := os.Stat(filepath.Join(vol, "config", "other")); err == nil {
		t.Error("a key not among the items was written")
	}
	if data, _ := os.ReadFile(filepath.Join(vol, "kc", "kubeconfig")); string(data) != "apiVersion: v1\n" {
		t.Errorf("the secret's key holds %q", data)
	}
	if hosts, _ := os.ReadFile(filepath.Join(dir, "etc-hosts")); !strings.Contains(string(hosts), "10.244.0.9\tcoredns\n") {
		t.Errorf("etc-hosts:\n%s", hosts)
	}

	pod.Spec.Volumes[0].ConfigMap.Name = "missing"
	if _, err := k.podFiles(context.Background(), pod, &PodRecord{}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "ConfigMap kube-system/missing") {
		t.Errorf("a missing ConfigMap gave %v, want an error naming it", err)
	}
	k.objects = nil
	if _, err := k.podFiles(context.Background(), pod, &PodRecord{}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "no ConfigMaps") {
		t.Errorf("the lab's own API server gave %v, want an error saying it holds no ConfigMaps", err)
	}
}

// A container on the node's file system gets its hostPath (the node's own
// directory where Config.HostPaths maps it) and projected volumes (the
// kube-api-access kind: ConfigMap keys and downward API) bound at their
// mount paths, as one from an image gets them mounted: one writer for
// both; a kind the lab does not make is not mounted.
func TestPodFilesHostPathProjected(t *testing.T) {
	dir, nodeCNI := t.TempDir(), filepath.Join(t.TempDir(), "n1", "etc", "cni", "net.d")
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	k := &kubelet{cfg: Config{DNS: DNS{ResolvConf: filepath.Join(dir, "none")}, HostPaths: map[string]string{"/etc/cni/net.d": nodeCNI}},
		objects: objectsOf{configMaps: map[string]*corev1.ConfigMap{"ns/kube-root-ca.crt": {Data: map[string]string{"ca.crt": "PEM"}}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "cni", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d", Type: &dirOrCreate}}},
			{Name: "api", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			}}}},
			{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}},
		},
		Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{
			{Name: "cni", MountPath: "/host/etc/cni/net.d"}, {Name: "api", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}, {Name: "pvc", MountPath: "/data"}}}},
	}}
	binds, err := k.podFiles(context.Background(), pod, &PodRecord{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]podexec.Bind{}
	for _, b := range binds["c"] {
		got[b.Target] = b
	}
	if b := got["/host/etc/cni/net.d"]; b.Source != nodeCNI || b.ReadOnly {
		t.Errorf("hostPath bind %+v, want the node's own %s, writable", b, nodeCNI)
	}
	api := filepath.Join(dir, "volumes", "api")
	if b := got["/var/run/secrets/kubernetes.io/serviceaccount"]; b.Source != api || !b.ReadOnly {
		t.Errorf("projected bind %+v, want %s read-only", b, api)
	}
	for file, want := range map[string]string{"ca.crt": "PEM", "namespace": "ns"} {
		if data, _ := os.ReadFile(filepath.Join(api, file)); string(data) != want {
			t.Errorf("projected %s holds %q, want %q", file, data, want)
		}
	}
	if _, ok := got["/data"]; ok {
		t.Error("a persistentVolumeClaim volume was mounted")
	}
}

// subPathExpr takes the container's variables ($(POD_NAME) from the
// downward API), and a subPath the volume lacks is made, as kubelet
// makes it; one that leaves the volume is refused.
func TestPodFilesSubPathExpr(t *testing.T) {
	dir := t.TempDir()
	k := &kubelet{cfg: Config{DNS: DNS{ResolvConf: filepath.Join(dir, "none")}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1"}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		Containers: []corev1.Container{{Name: "c",
			Env:          []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/logs", SubPathExpr: "$(POD_NAME)"}}}},
	}}
	binds, err := k.podFiles(context.Background(), pod, &PodRecord{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "volumes", "work", "web-1")
	if !slices.Contains(binds["c"], podexec.Bind{Source: want, Target: "/logs"}) {
		t.Errorf("binds %+v lack %s at /logs", binds["c"], want)
	}
	if st, err := os.Stat(want); err != nil || !st.IsDir() {
		t.Errorf("the subPath directory %s was not made: %v", want, err)
	}
	pod.Spec.Containers[0].VolumeMounts[0].SubPathExpr = "../$(POD_NAME)"
	if _, err := k.podFiles(context.Background(), pod, &PodRecord{}, t.TempDir()); err == nil {
		t.Error("a subPathExpr leaving the volume was accepted")
	}
}
