package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/podexec"
)

// A container that runs from an image (rootfs.go) sees only the image and
// its volumes, as with a runtime; one on the node's file system gets them
// bound at their mount paths (podfiles.go). Both take them from
// makeVolume: hostPath, emptyDir, configMap, secret and projected. Others
// (persistent volumes, ...) are refused by name for a container from an
// image (it does not start, its error says which) and not mounted for one
// on the node's file system.

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
		pv, err := k.makeVolume(ctx, pod, rec, v, filepath.Join(k.podDir(rec), "volumes", v.Name))
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		src, err := k.mountSource(pod, rec, c, vm, pv)
		if err != nil {
			return nil, err
		}
		mounts = append(mounts, podexec.Mount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly || pv.readOnly})
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

// podVolume is a volume made for a pod: where it is on the node.
type podVolume struct {
	dir      string
	readOnly bool // configMap, secret and projected volumes are mounted read-only, whatever the mount says
}

// source is where a mount of the volume with subPath comes from; a
// subPath a writable volume lacks is made, a directory, as kubelet makes
// it.
func (v podVolume) source(subPath string) (string, error) {
	if subPath == "" {
		return v.dir, nil
	}
	p := filepath.Join(v.dir, filepath.Clean("/"+subPath))
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) && !v.readOnly {
		if err := os.MkdirAll(p, 0o777); err != nil {
			return "", fmt.Errorf("subPath %s: %w", subPath, err)
		}
		return p, os.Chmod(p, 0o777)
	}
	return p, nil
}

// subPath is a mount's subPath, or its subPathExpr with the container's
// variables expanded ($(POD_NAME)), as kubelet expands it.
func (k *kubelet) subPath(pod *corev1.Pod, rec *PodRecord, c corev1.Container, m corev1.VolumeMount) (string, error) {
	if m.SubPathExpr == "" {
		return m.SubPath, nil
	}
	env, err := k.podEnv(pod, rec, c)
	if err != nil {
		return "", err
	}
	vars := map[string]string{}
	for _, kv := range env {
		name, v, _ := strings.Cut(kv, "=")
		vars[name] = v
	}
	p := expandVars(m.SubPathExpr, func(n string) (string, bool) { v, ok := vars[n]; return v, ok })
	if strings.Contains("/"+p+"/", "/../") || filepath.IsAbs(p) {
		return "", fmt.Errorf("subPathExpr %q expands to %q: not a relative path inside the volume", m.SubPathExpr, p)
	}
	return p, nil
}

// mountSource is where a container's mount of a volume comes from.
func (k *kubelet) mountSource(pod *corev1.Pod, rec *PodRecord, c corev1.Container, m corev1.VolumeMount, v podVolume) (string, error) {
	sub, err := k.subPath(pod, rec, c, m)
	if err != nil {
		return "", fmt.Errorf("volume mount %s: %w", m.Name, err)
	}
	return v.source(sub)
}

// errVolumeKind: a kind of volume the lab does not make.
var errVolumeKind = errors.New("the lab makes hostPath, emptyDir, configMap, secret and projected volumes only")

// makeVolume makes one of the pod's volumes (in dir, the pod's directory
// for it, unless it is the node's), the one way for both kinds of
// container (podfiles.go binds it into a container on the node's file
// system, volumeMounts mounts it into an image's root), written in place
// (a container of the pod that runs keeps seeing it):
//
//   - hostPath: the node's path (created for DirectoryOrCreate and
//     FileOrCreate), through Config.HostPaths where the node keeps a
//     directory of its own for a path every node of the machine shares;
//   - emptyDir: a directory of the pod's any user may write;
//   - configMap, secret: their keys (or items) as files, with kubelet's
//     modes;
//   - projected: a service account token bound to the pod (TokenRequest),
//     ConfigMap keys and downward API fields, as kubelet writes the API
//     server's kube-api-access volume.
func (k *kubelet) makeVolume(ctx context.Context, pod *corev1.Pod, rec *PodRecord, v corev1.Volume, dir string) (podVolume, error) {
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
				return podVolume{}, err
			}
		case corev1.HostPathFileOrCreate:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return podVolume{}, err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
			if err != nil {
				return podVolume{}, err
			}
			f.Close()
		}
		if _, err := os.Stat(p); err != nil {
			return podVolume{}, fmt.Errorf("hostPath %s (type %q): %w", v.HostPath.Path, typ, err)
		}
		return podVolume{dir: p}, nil
	case v.EmptyDir != nil:
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return podVolume{}, err
		}
		return podVolume{dir: dir}, os.Chmod(dir, 0o777) // as kubelet's: any user of the pod writes there
	case v.ConfigMap != nil:
		data, err := k.volumeData(ctx, "ConfigMap", pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Optional)
		if err != nil {
			return podVolume{}, err
		}
		return podVolume{dir: dir, readOnly: true}, writeKeys(dir, data, v.ConfigMap.Items, v.ConfigMap.DefaultMode)
	case v.Secret != nil:
		data, err := k.volumeData(ctx, "Secret", pod.Namespace, v.Secret.SecretName, v.Secret.Optional)
		if err != nil {
			return podVolume{}, err
		}
		return podVolume{dir: dir, readOnly: true}, writeKeys(dir, data, v.Secret.Items, v.Secret.DefaultMode)
	case v.Projected != nil:
		files, err := k.projectedFiles(ctx, pod, rec, v.Projected)
		if err != nil {
			return podVolume{}, err
		}
		return podVolume{dir: dir, readOnly: true}, writeKeys(dir, files, nil, v.Projected.DefaultMode)
	}
	return podVolume{}, errVolumeKind
}

// projectedFiles are a projected volume's files by path.
func (k *kubelet) projectedFiles(ctx context.Context, pod *corev1.Pod, rec *PodRecord, p *corev1.ProjectedVolumeSource) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, s := range p.Sources {
		switch {
		case s.ServiceAccountToken != nil:
			if k.objects == nil {
				return nil, errors.New("a service account token needs the API server (this kubelet has none)")
			}
			var aud []string
			if s.ServiceAccountToken.Audience != "" {
				aud = []string{s.ServiceAccountToken.Audience}
			}
			tok, err := k.objects.token(ctx, pod, aud, s.ServiceAccountToken.ExpirationSeconds)
			if err != nil {
				return nil, err
			}
			files[s.ServiceAccountToken.Path] = []byte(tok)
		case s.ConfigMap != nil:
			data, err := k.volumeData(ctx, "ConfigMap", pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Optional)
			if err != nil {
				return nil, err
			}
			if len(s.ConfigMap.Items) == 0 {
				maps.Copy(files, data)
			}
			for _, it := range s.ConfigMap.Items {
				d, ok := data[it.Key]
				if !ok {
					return nil, fmt.Errorf("ConfigMap %s/%s has no key %s", pod.Namespace, s.ConfigMap.Name, it.Key)
				}
				files[it.Path] = d
			}
		case s.DownwardAPI != nil:
			for _, item := range s.DownwardAPI.Items {
				if item.FieldRef == nil {
					return nil, fmt.Errorf("downward API item %s: only fieldRef is made", item.Path)
				}
				val, err := k.fieldRefValue(pod, rec, item.FieldRef.FieldPath)
				if err != nil {
					return nil, err
				}
				files[item.Path] = []byte(val)
			}
		default:
			return nil, errors.New("a projected source other than serviceAccountToken, configMap or downwardAPI: the lab does not make it")
		}
	}
	return files, nil
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
