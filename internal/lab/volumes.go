package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/podexec"
)

// A container that runs from an image (rootfs.go) sees only the image and
// its volumes, as with a runtime: what of the pod's volumes the lab makes.
//
//   - hostPath: the node's directory or file (created for DirectoryOrCreate
//     and FileOrCreate), through Config.HostPaths where the node keeps a
//     directory of its own for a path every node of the machine shares
//     (/etc/cni/net.d, /opt/cni/bin: each lab node's CNI configuration);
//   - emptyDir: a directory of the pod's;
//   - projected (service account token, ConfigMap, the downward API's
//     namespace): the files kubelet writes for the API server's
//     kube-api-access volume, a token bound to the pod from TokenRequest;
//   - configMap: its keys as files.
//
// Others (secret, persistent volumes, ...) are refused by name: the pod's
// container does not start, its error says which.

// volumeObjects are the API objects volumes are made of, for containers
// from an image (volumes.go) and for those on the node's file system
// (podfiles.go): the API server of an APIKubelet. The lab's own API server
// holds none of these kinds, so its kubelet has none and pods asking for
// such volumes fail to start with a reason saying so.
type volumeObjects interface {
	token(ctx context.Context, pod *corev1.Pod, audiences []string, seconds *int64) (string, error)
	configMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
}

func (kp *kubePods) token(ctx context.Context, pod *corev1.Pod, audiences []string, seconds *int64) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := kp.api.CreateToken(ctx, pod.Namespace, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: audiences, ExpirationSeconds: seconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

var _ volumeObjects = (*kubePods)(nil)

// imageProcess is how a container of an image from a layout runs: its argv,
// the shim's flags for its root file system and volumes, and the image's
// PATH; nil flags for a container that runs the node's programs.
func (k *kubelet) imageProcess(pod *corev1.Pod, rec *PodRecord, c corev1.Container) (argv, shimFlags []string, path string, err error) {
	img, err := findLayoutImage(k.cfg.Images.Layouts, c.Image)
	if err != nil || img == nil {
		return nil, nil, "", err
	}
	root, err := img.rootfs()
	if err != nil {
		return nil, nil, "", fmt.Errorf("image %s: %w", c.Image, err)
	}
	mounts, err := k.volumeMounts(pod, rec, c)
	if err != nil {
		return nil, nil, "", err
	}
	shimFlags = []string{"--rootfs", root}
	for _, m := range mounts {
		shimFlags = append(shimFlags, "--mount", m.String())
	}
	return img.argv(c.Command, c.Args), shimFlags, img.imagePath(), nil
}

// volumeMounts makes the container's volumes and says where each goes.
func (k *kubelet) volumeMounts(pod *corev1.Pod, rec *PodRecord, c corev1.Container) ([]podexec.Mount, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	var mounts []podexec.Mount
	for _, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s names no volume of the pod", vm.Name)
		}
		src, err := k.volumeSource(ctx, pod, rec, v)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if vm.SubPath != "" {
			src = filepath.Join(src, filepath.Clean("/"+vm.SubPath))
		}
		mounts = append(mounts, podexec.Mount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	return mounts, nil
}

// hostPath is where the node keeps a host path (Config.HostPaths maps a
// path and what is below it).
func (k *kubelet) hostPath(p string) string {
	p = filepath.Clean(p)
	for from, to := range k.cfg.HostPaths {
		if rest, ok := strings.CutPrefix(p, filepath.Clean(from)); ok && (rest == "" || rest[0] == '/') {
			return to + rest
		}
	}
	return p
}

func (k *kubelet) volumeSource(ctx context.Context, pod *corev1.Pod, rec *PodRecord, v corev1.Volume) (string, error) {
	dir := filepath.Join(k.podDir(rec), "volumes", v.Name)
	switch {
	case v.HostPath != nil:
		p := k.hostPath(v.HostPath.Path)
		typ := corev1.HostPathUnset
		if v.HostPath.Type != nil {
			typ = *v.HostPath.Type
		}
		switch typ {
		case corev1.HostPathDirectoryOrCreate:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return "", err
			}
		case corev1.HostPathFileOrCreate:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return "", err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
			if err != nil {
				return "", err
			}
			f.Close()
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("hostPath %s (type %q): %w", v.HostPath.Path, typ, err)
		}
		return p, nil
	case v.EmptyDir != nil:
		return dir, os.MkdirAll(dir, 0o755)
	case v.ConfigMap != nil:
		files, err := k.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
		if err != nil {
			return "", err
		}
		return dir, writeVolumeFiles(dir, files)
	case v.Projected != nil:
		files := map[string][]byte{}
		for _, s := range v.Projected.Sources {
			switch {
			case s.ServiceAccountToken != nil:
				if k.objects == nil {
					return "", errors.New("a service account token needs the API server (this kubelet has none)")
				}
				var aud []string
				if s.ServiceAccountToken.Audience != "" {
					aud = []string{s.ServiceAccountToken.Audience}
				}
				tok, err := k.objects.token(ctx, pod, aud, s.ServiceAccountToken.ExpirationSeconds)
				if err != nil {
					return "", err
				}
				files[s.ServiceAccountToken.Path] = []byte(tok)
			case s.ConfigMap != nil:
				cm, err := k.configMapFiles(ctx, pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional)
				if err != nil {
					return "", err
				}
				for name, data := range cm {
					files[name] = data
				}
			case s.DownwardAPI != nil:
				for _, item := range s.DownwardAPI.Items {
					if item.FieldRef == nil {
						return "", fmt.Errorf("downward API item %s: only fieldRef is made", item.Path)
					}
					val, err := k.fieldRefValue(pod, rec, item.FieldRef.FieldPath)
					if err != nil {
						return "", err
					}
					files[item.Path] = []byte(val)
				}
			default:
				return "", errors.New("a projected source other than serviceAccountToken, configMap or downwardAPI: the lab does not make it")
			}
		}
		return dir, writeVolumeFiles(dir, files)
	}
	return "", errors.New("the lab makes hostPath, emptyDir, configMap and projected volumes only")
}

func (k *kubelet) configMapFiles(ctx context.Context, namespace, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	if k.objects == nil {
		return nil, errors.New("a ConfigMap volume needs the API server (this kubelet has none)")
	}
	cm, err := k.objects.configMap(ctx, namespace, name)
	if err != nil {
		if optional != nil && *optional {
			return nil, nil
		}
		return nil, err
	}
	all := map[string][]byte{}
	for key, val := range cm.Data {
		all[key] = []byte(val)
	}
	for key, val := range cm.BinaryData {
		all[key] = val
	}
	if len(items) == 0 {
		return all, nil
	}
	files := map[string][]byte{}
	for _, it := range items {
		data, ok := all[it.Key]
		if !ok {
			return nil, fmt.Errorf("ConfigMap %s/%s has no key %s", namespace, name, it.Key)
		}
		files[it.Path] = data
	}
	return files, nil
}

// writeVolumeFiles writes a volume's files afresh.
func writeVolumeFiles(dir string, files map[string][]byte) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.Clean("/"+name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// fieldRefValue is a downward API field of the pod, as kubelet resolves
// an env var's or a volume item's fieldRef (the host's address is the
// node's, before the pod's status has it).
func (k *kubelet) fieldRefValue(pod *corev1.Pod, rec *PodRecord, field string) (string, error) {
	switch field {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return rec.IP, nil
	case "status.hostIP", "status.hostIPs":
		if k.cfg.NodeIP.IsValid() {
			return k.cfg.NodeIP.String(), nil
		}
		return pod.Status.HostIP, nil
	}
	if key, ok := strings.CutPrefix(field, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(key, "']")], nil
	}
	if key, ok := strings.CutPrefix(field, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(key, "']")], nil
	}
	return "", fmt.Errorf("fieldRef %s: not a field the lab resolves", field)
}
