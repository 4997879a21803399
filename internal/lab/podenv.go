package lab

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A container's environment as kubelet makes it (k8s.io/kubernetes
// pkg/kubelet/kubelet_pods.go makeEnvironmentVariables): the variables of
// envFrom's ConfigMaps and Secrets, then the container's env in order, each
// value with its $(VAR) references expanded or its valueFrom resolved
// (fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef), then the
// variables of the Services a pod is told of (pkg/kubelet/envvars) where
// the container sets none of that name: the API server's `kubernetes`
// Service of namespace default always (KUBERNETES_SERVICE_HOST, ...: what
// client-go's in-cluster configuration reads), and with
// spec.enableServiceLinks (the API server's default: true) every Service
// of the pod's namespace that has a cluster IP.

// serviceEnv is the map of the Service variables for a pod of namespace
// ns, as kubelet's getServiceEnvVarMap.
func serviceEnv(services []*corev1.Service, ns string, enableServiceLinks bool) map[string]string {
	told := map[string]*corev1.Service{}
	for _, s := range services {
		if !serviceIPSet(s) {
			continue
		}
		switch {
		case s.Namespace == metav1.NamespaceDefault && s.Name == "kubernetes":
			if _, ok := told[s.Name]; !ok {
				told[s.Name] = s
			}
		case s.Namespace == ns && enableServiceLinks:
			told[s.Name] = s
		}
	}
	env := map[string]string{}
	for _, s := range told {
		for _, e := range serviceEnvVars(s) {
			env[e.Name] = e.Value
		}
	}
	return env
}

func serviceIPSet(s *corev1.Service) bool {
	return s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone && len(s.Spec.Ports) > 0
}

// serviceEnvVars are one Service's variables, named and formatted as
// kubelet's envvars.FromServices: NAME_SERVICE_HOST, NAME_SERVICE_PORT
// (the first port), NAME_SERVICE_PORT_PORTNAME for each named port, and
// Docker's link variables (NAME_PORT, NAME_PORT_80_TCP, ..._PROTO,
// ..._PORT, ..._ADDR).
func serviceEnvVars(s *corev1.Service) []corev1.EnvVar {
	prefix := envVarName(s.Name)
	ip := s.Spec.ClusterIP
	env := []corev1.EnvVar{
		{Name: prefix + "_SERVICE_HOST", Value: ip},
		{Name: prefix + "_SERVICE_PORT", Value: strconv.Itoa(int(s.Spec.Ports[0].Port))},
	}
	for _, p := range s.Spec.Ports {
		if p.Name != "" {
			env = append(env, corev1.EnvVar{Name: prefix + "_SERVICE_PORT_" + envVarName(p.Name), Value: strconv.Itoa(int(p.Port))})
		}
	}
	for i, p := range s.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		url := strings.ToLower(proto) + "://" + net.JoinHostPort(ip, strconv.Itoa(int(p.Port)))
		if i == 0 {
			env = append(env, corev1.EnvVar{Name: prefix + "_PORT", Value: url})
		}
		portPrefix := fmt.Sprintf("%s_PORT_%d_%s", prefix, p.Port, strings.ToUpper(proto))
		env = append(env,
			corev1.EnvVar{Name: portPrefix, Value: url},
			corev1.EnvVar{Name: portPrefix + "_PROTO", Value: strings.ToLower(proto)},
			corev1.EnvVar{Name: portPrefix + "_PORT", Value: strconv.Itoa(int(p.Port))},
			corev1.EnvVar{Name: portPrefix + "_ADDR", Value: ip},
		)
	}
	return env
}

// envVarName is kubelet's: upper case, '-' to '_'.
func envVarName(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

// expandVars expands $(VAR) references as kubelet does (its fork of
// os.Expand, third_party/forked/golang/expansion): "$$" is a literal "$",
// a reference to an unknown name stays as written, anything else after
// "$" is kept.
func expandVars(in string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	checkpoint := 0
	for i := 0; i < len(in); i++ {
		if in[i] != '$' || i+1 >= len(in) {
			continue
		}
		b.WriteString(in[checkpoint:i])
		switch rest := in[i+1:]; {
		case rest[0] == '$':
			b.WriteByte('$')
			i++
		case rest[0] == '(':
			end := strings.IndexByte(rest, ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				break
			}
			name := rest[1:end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += end + 1
		default:
			b.WriteByte('$')
		}
		checkpoint = i + 1
	}
	return b.String() + in[checkpoint:]
}

// podEnvObjects are where envFrom and valueFrom read ConfigMaps and
// Secrets, each read once per container start.
type podEnvObjects struct {
	ctx        context.Context
	objects    volumeObjects
	namespace  string
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

// configMap is the ConfigMap of that name, nil for a missing optional one.
func (o *podEnvObjects) configMap(name string, optional *bool) (*corev1.ConfigMap, error) {
	if o.objects == nil {
		return nil, fmt.Errorf("couldn't get configMap %s/%s: the lab's own API server holds no ConfigMaps (shunt lab up --kubeconfig)", o.namespace, name)
	}
	return readOnce(o, o.configMaps, "configMap", name, optional, o.objects.configMap)
}

// secret is the Secret of that name, nil for a missing optional one.
func (o *podEnvObjects) secret(name string, optional *bool) (*corev1.Secret, error) {
	if o.objects == nil {
		return nil, fmt.Errorf("couldn't get secret %s/%s: the lab's own API server holds no Secrets (shunt lab up --kubeconfig)", o.namespace, name)
	}
	return readOnce(o, o.secrets, "secret", name, optional, o.objects.secret)
}

// readOnce reads an object of the pod's namespace through get, once per
// container start (cache); nil for a missing optional one.
func readOnce[T any](o *podEnvObjects, cache map[string]*T, kind, name string, optional *bool, get func(context.Context, string, string) (*T, error)) (*T, error) {
	if obj, ok := cache[name]; ok {
		return obj, nil
	}
	obj, err := get(o.ctx, o.namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil, nil
		}
		return nil, fmt.Errorf("couldn't get %s %s/%s: %w", kind, o.namespace, name, err)
	}
	cache[name] = obj
	return obj, nil
}

// podEnv is the container's environment from its spec and the pod's
// Services (NAME=value, sorted): what kubelet hands the runtime. An error
// is kubelet's CreateContainerConfigError (a ConfigMap, Secret or key that
// is not there and not optional).
func (k *kubelet) podEnv(pod *corev1.Pod, rec *PodRecord, c corev1.Container) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	objs := &podEnvObjects{ctx: ctx, objects: k.objects, namespace: pod.Namespace,
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	var services map[string]string
	if k.services != nil {
		links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
		services = serviceEnv(k.services(), pod.Namespace, links)
	}
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := objs.configMap(from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
			if err != nil {
				return nil, err
			}
			if cm != nil {
				for key, v := range cm.Data {
					env[from.Prefix+key] = v
				}
			}
		case from.SecretRef != nil:
			s, err := objs.secret(from.SecretRef.Name, from.SecretRef.Optional)
			if err != nil {
				return nil, err
			}
			if s != nil {
				for key, v := range s.Data {
					env[from.Prefix+key] = string(v)
				}
			}
		}
	}
	lookup := func(name string) (string, bool) {
		if v, ok := env[name]; ok {
			return v, true
		}
		v, ok := services[name]
		return v, ok
	}
	for _, e := range c.Env {
		val := e.Value
		switch {
		case val != "":
			val = expandVars(val, lookup)
		case e.ValueFrom != nil:
			var (
				ok  bool
				err error
			)
			if val, ok, err = k.valueFrom(objs, pod, rec, c, e.ValueFrom); err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			} else if !ok {
				continue // an optional source that is not there: no variable
			}
		}
		env[e.Name] = val
	}
	for name, v := range services {
		if _, set := env[name]; !set {
			env[name] = v
		}
	}
	out := make([]string, 0, len(env))
	for _, name := range slices.Sorted(maps.Keys(env)) {
		out = append(out, name+"="+env[name])
	}
	return out, nil
}

// valueFrom resolves an env var's source; false for an optional
// ConfigMap, Secret or key that is not there.
func (k *kubelet) valueFrom(objs *podEnvObjects, pod *corev1.Pod, rec *PodRecord, c corev1.Container, src *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		v, err := k.fieldRefValue(pod, rec, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := resourceFieldValue(pod, c, src.ResourceFieldRef, k.allocatable())
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := objs.configMap(ref.Name, ref.Optional)
		if err != nil || cm == nil {
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok && (ref.Optional == nil || !*ref.Optional) {
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
		}
		return v, ok, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := objs.secret(ref.Name, ref.Optional)
		if err != nil || s == nil {
			return "", false, err
		}
		v, ok := s.Data[ref.Key]
		if !ok && (ref.Optional == nil || !*ref.Optional) {
			return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
		}
		return string(v), ok, nil
	}
	return "", false, fmt.Errorf("a source other than fieldRef, resourceFieldRef, configMapKeyRef or secretKeyRef: the lab does not resolve it")
}

// resourceFieldValue is a container's request or limit in units of the
// divisor, rounded up, as kubelet's downward API gives it; a limit the
// container does not set is the node's allocatable (kubelet's
// defaultPodLimitsForDownwardAPI).
func resourceFieldValue(pod *corev1.Pod, c corev1.Container, ref *corev1.ResourceFieldSelector, allocatable corev1.ResourceList) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		other, ok := containerSpec(pod, ref.ContainerName)
		if !ok {
			return "", fmt.Errorf("resourceFieldRef: the pod has no container %s", ref.ContainerName)
		}
		c = other
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("unsupported container resource : %s", ref.Resource)
	}
	res := corev1.ResourceName(name)
	if res != corev1.ResourceCPU && res != corev1.ResourceMemory && res != corev1.ResourceEphemeralStorage && !strings.HasPrefix(name, corev1.ResourceHugePagesPrefix) {
		return "", fmt.Errorf("unsupported container resource : %s", ref.Resource)
	}
	list := c.Resources.Requests
	if kind == "limits" {
		list = c.Resources.Limits
	}
	q, set := list[res]
	if !set && kind == "limits" {
		q, set = allocatable[res]
	}
	if !set {
		q = resource.Quantity{}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	var v float64
	if res == corev1.ResourceCPU {
		v = math.Ceil(float64(q.MilliValue()) / float64(divisor.MilliValue()))
	} else {
		v = math.Ceil(float64(q.Value()) / float64(divisor.Value()))
	}
	return strconv.FormatInt(int64(v), 10), nil
}

// expandCommand expands $(VAR) references of a container's command and
// args with its environment, as kubelet does before the runtime runs it.
func expandCommand(c corev1.Container, env []string) corev1.Container {
	vars := map[string]string{}
	for _, kv := range env {
		name, v, _ := strings.Cut(kv, "=")
		vars[name] = v
	}
	lookup := func(name string) (string, bool) { v, ok := vars[name]; return v, ok }
	expand := func(in []string) []string {
		if in == nil {
			return nil
		}
		out := make([]string, len(in))
		for i, s := range in {
			out[i] = expandVars(s, lookup)
		}
		return out
	}
	c.Command, c.Args = expand(c.Command), expand(c.Args)
	return c
}
