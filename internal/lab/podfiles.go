package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/podexec"
)

// The files a kubelet and its runtime put into each container: the pod's
// /etc/resolv.conf and /etc/hosts (dns.go), and its volumes (makeVolume:
// hostPath, emptyDir, configMap, secret, projected), bind-mounted at
// each container's mount paths in the container's own mount namespace
// (podexec.Bind), and a mapped image's programs at their image paths
// (/agnhost), so that an exec naming them finds them. The container
// otherwise sees the node's file system.

func (kp *kubePods) configMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return kp.api.ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (kp *kubePods) secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return kp.api.Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

// podFiles writes the pod's resolv.conf, hosts and volumes into dir (the
// pod's directory) and returns, by container name, what each container
// mounts.
func (k *kubelet) podFiles(ctx context.Context, pod *corev1.Pod, rec *PodRecord, dir string) (map[string][]podexec.Bind, error) {
	resolv, err := podResolvConf(pod, k.cfg.DNS)
	if err != nil {
		return nil, err
	}
	nodeHosts, _ := os.ReadFile("/etc/hosts")
	files := map[string]string{"resolv.conf": resolv, "etc-hosts": podHosts(pod, rec.IP, k.cfg.DNS, string(nodeHosts))}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	volumes := map[string]podVolume{}
	for _, v := range pod.Spec.Volumes {
		pv, err := k.makeVolume(ctx, pod, rec, v, filepath.Join(dir, "volumes", v.Name))
		switch {
		case errors.Is(err, errVolumeKind):
			continue // a kind the lab does not make: not mounted (a container from an image fails on it)
		case err != nil:
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		volumes[v.Name] = pv
	}
	binds := map[string][]podexec.Bind{}
	for _, c := range pod.Spec.Containers {
		var b []podexec.Bind
		mounted := map[string]bool{}
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				continue // a kind of volume the lab does not provide (yet): as before, not mounted
			}
			src, err := k.mountSource(pod, rec, c, m, v)
			if err != nil {
				return nil, fmt.Errorf("container %s: %w", c.Name, err)
			}
			b = append(b, podexec.Bind{Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly || v.readOnly})
			mounted[filepath.Clean(m.MountPath)] = true
		}
		for target, program := range k.cfg.Images.imagePrograms(c.Image) {
			b = append(b, podexec.Bind{Source: program, Target: target, ReadOnly: true})
		}
		// A container that mounts its own /etc/hosts or resolv.conf keeps
		// it, as with kubelet.
		for name, target := range map[string]string{"resolv.conf": "/etc/resolv.conf", "etc-hosts": "/etc/hosts"} {
			if !mounted[target] {
				b = append([]podexec.Bind{{Source: filepath.Join(dir, name), Target: target}}, b...)
			}
		}
		binds[c.Name] = b
	}
	return binds, nil
}

// volumeData is the data of a configMap or secret volume's object (kind
// ConfigMap or Secret); nothing for a missing optional one.
func (k *kubelet) volumeData(ctx context.Context, kind, namespace, name string, optional *bool) (map[string][]byte, error) {
	if k.objects == nil {
		return nil, fmt.Errorf("the lab's own API server holds no %ss: %s volumes need a Kubernetes API server (shunt lab up --kubeconfig)",
			kind, strings.ToLower(kind[:1])+kind[1:])
	}
	data := map[string][]byte{}
	var err error
	if kind == "Secret" {
		var s *corev1.Secret
		if s, err = k.objects.secret(ctx, namespace, name); err == nil {
			data = s.Data
		}
	} else {
		var cm *corev1.ConfigMap
		if cm, err = k.objects.configMap(ctx, namespace, name); err == nil {
			for key, v := range cm.Data {
				data[key] = []byte(v)
			}
			for key, v := range cm.BinaryData {
				data[key] = v
			}
		}
	}
	switch {
	case optional != nil && *optional && apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s %s/%s: %w", kind, namespace, name, err)
	}
	return data, nil
}

// writeKeys writes each key (or the items asked for, at their paths) as a
// file of dir, with the mode kubelet gives (the item's, the volume's
// defaultMode, else 0644).
func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mode := os.FileMode(0o644)
	if defaultMode != nil {
		mode = os.FileMode(*defaultMode) & os.ModePerm
	}
	if len(items) == 0 {
		for key := range data {
			items = append(items, corev1.KeyToPath{Key: key, Path: key})
		}
	}
	for _, it := range items {
		content, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("no key %q", it.Key)
		}
		if strings.Contains("/"+it.Path+"/", "/../") {
			return fmt.Errorf("path %q leaves the volume", it.Path)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & os.ModePerm
		}
		p := filepath.Join(dir, it.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, content, m); err != nil {
			return err
		}
		if err := os.Chmod(p, m); err != nil { // WriteFile's mode is cut by the umask
			return err
		}
	}
	return nil
}

// bindsArg is the shim's --binds: the container's mounts as JSON.
func bindsArg(binds []podexec.Bind) string {
	data, _ := json.Marshal(binds)
	return string(data)
}
