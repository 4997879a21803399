package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/mountpoint"
	"github.com/shuntnet/shunt/internal/parallel"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/podnet"
)

// The lab's kubelet (and container runtime): it gives each pod of its node
// a network namespace and a cgroup, has shunt-cni plumb the pod (veth,
// address from the node's pod CIDR, the endpoint handed to the agent, see
// cni.go), runs its containers' processes, and writes the pod's status
// back to the API: address, phase, readiness, container states and exit
// codes.

// PodRecord is the runtime side of one pod: what the kubelet built for it.
type PodRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID is the API object's (pods from a Kubernetes API server): a new
	// pod of the same name gets a new sandbox.
	UID string `json:"uid,omitempty"`
	// ContainerID names the pod's sandbox to shunt-cni; a new one per
	// (re)built sandbox. Empty: never plumbed (or by an older agent).
	ContainerID string            `json:"containerID,omitempty"`
	IP          string            `json:"ip"` // from the CNI result
	Netns       string            `json:"netns"`
	HostIf      string            `json:"hostIf"` // from the CNI result
	Cgroup      string            `json:"cgroup"`
	Created     time.Time         `json:"created"`
	Containers  []ContainerRecord `json:"containers"`
	// HostNetwork: the pod runs in the node's network namespace, at the
	// node's address (hostnetwork.go).
	HostNetwork bool `json:"hostNetwork,omitempty"`
}

// ContainerRecord is one container process, run under a shim that records
// its exit status even when no agent is running.
type ContainerRecord struct {
	Name     string    `json:"name"`
	Image    string    `json:"image,omitempty"`
	ShimPID  int       `json:"shimPID"`
	Started  time.Time `json:"started"`
	LogFile  string    `json:"logFile"`
	ExitFile string    `json:"exitFile"`
	// Restarts (restarts.go): how many, the back-off before the next, and
	// how the previous instance ended.
	RestartCount int           `json:"restartCount,omitempty"`
	BackOff      time.Duration `json:"backOff,omitempty"`
	Last         *LastRun      `json:"last,omitempty"`
	// Binds are what the container mounts (podfiles.go), kept for its
	// restarts.
	Binds []podexec.Bind `json:"binds,omitempty"`
	// env is the environment this instance started with (its exec probes
	// run with it); not kept on disk: it may hold Secrets' values.
	env []string
}

func (r *PodRecord) key() string { return r.Namespace + "/" + r.Name }

type kubelet struct {
	cfg   Config
	cni   *cniRuntime
	pods  map[string]*PodRecord // by namespace/name
	saved []byte                // pods.json as last written
	// checked: the records loaded at start were CHECKed once (their
	// plumbing and the agent's endpoint may not have survived a reboot).
	checked bool
	probes  prober // probes.go
	// objects are what volumes are made of (volumes.go); nil without an
	// API server.
	objects volumeObjects
	// services are the cluster's Services, for the pods' environment
	// (podenv.go); nil without an API server.
	services func() []*corev1.Service
	// stopping: deleted pods whose containers were sent SIGTERM, since
	// when (graceful.go).
	stopping map[string]time.Time
}

func (k *kubelet) recordsPath() string { return podRecordsPath(k.cfg.Instance.StateDir()) }

// podRecordsPath is where a node's kubelet keeps its pod records.
func podRecordsPath(stateDir string) string { return filepath.Join(stateDir, "pods.json") }

func (k *kubelet) load(legacy map[string]*PodRecord) error {
	var err error
	k.pods, k.saved, err = loadPodRecords(k.recordsPath(), legacy)
	return err
}

// loadPodRecords reads pods.json (legacy: the records an older agent kept
// in state.json, when there is no pods.json yet).
func loadPodRecords(path string, legacy map[string]*PodRecord) (map[string]*PodRecord, []byte, error) {
	pods := map[string]*PodRecord{}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if legacy != nil { // an older agent kept them in state.json
			pods = legacy
		}
		return pods, nil, nil
	case err != nil:
		return nil, nil, err
	}
	if err := json.Unmarshal(data, &pods); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt lab down` if it is damaged)", path, err)
	}
	return pods, data, nil
}

func (k *kubelet) save() error {
	var err error
	k.saved, err = atomicfile.WriteJSON(k.recordsPath(), k.pods, k.saved)
	return err
}

// admit refuses pods the node's pod CIDR cannot hold, before anything is
// built, so a change never stops half way for want of addresses.
func (k *kubelet) admit(next *model.Store) error {
	n := 0
	for _, p := range next.Pods() {
		if p.Spec.NodeName == k.cfg.NodeName {
			n++
		}
	}
	if pool := k.cfg.PodPool; n > pool.Size() {
		return fmt.Errorf("nothing applied: %d pods do not fit in pod CIDR %s (%d addresses): use a larger --pod-cidr", n, pool.CIDR, pool.Size())
	}
	return nil
}

// record returns the pod's record, naming a new pod's namespace and
// cgroup; its address comes from shunt-cni when it is plumbed.
func (k *kubelet) record(pod *corev1.Pod) *PodRecord {
	key := pod.Namespace + "/" + pod.Name
	if rec := k.pods[key]; rec != nil {
		return rec
	}
	inst := k.cfg.Instance
	rec := &PodRecord{
		Namespace: pod.Namespace, Name: pod.Name,
		Netns:       inst.PodNetns(pod.Namespace, pod.Name),
		Cgroup:      inst.PodCgroupDir(k.cfg.CgroupRoot, pod.Namespace, pod.Name),
		Created:     time.Now().UTC().Truncate(time.Second),
		HostNetwork: pod.Spec.HostNetwork,
	}
	k.pods[key] = rec
	return rec
}

// healthy says whether the pod's sandbox is in place; verify also asks
// shunt-cni (CHECK), which asks the agent.
func (k *kubelet) healthy(ctx context.Context, rec *PodRecord, verify bool) bool {
	if rec.HostNetwork {
		return rec.IP != ""
	}
	if rec.ContainerID == "" || rec.IP == "" {
		return false
	}
	if err := sandboxPresent(rec); err != nil {
		if verify {
			k.cfg.Log.Info("pod sandbox is gone; rebuilding it", "pod", rec.key(), "reason", err)
		}
		return false
	}
	if verify {
		if err := k.cni.check(ctx, rec); err != nil {
			k.cfg.Log.Warn("pod sandbox failed CHECK; rebuilding it", "pod", rec.key(), "err", err)
			return false
		}
	}
	return true
}

// sandboxPresent says whether a pod's sandbox is still in place: its
// network namespace mounted at its path, and the host side of its veth.
// That is enough: the two ends of a veth go together, and a namespace
// destroyed takes its end along. It is asked of every pod once a second,
// so it costs a statfs and an ioctl, not netlink link lookups in two
// namespaces (with a netlink handle made in the pod's): 2 allocations per
// pod, not 124 (BenchmarkSandboxHealthy).
func sandboxPresent(rec *PodRecord) error {
	path := podnet.NetnsPath(rec.Netns)
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return fmt.Errorf("pod namespace %s: %w", path, err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("pod namespace %s: no network namespace is mounted there", path)
	}
	if err := linkPresent(rec.HostIf); err != nil {
		return fmt.Errorf("pod interface %s: %w", rec.HostIf, err)
	}
	return nil
}

// linkPresent says whether this network namespace has an interface of
// that name (SIOCGIFINDEX, as if_nametoindex).
func linkPresent(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	return unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr)
}

// plumb builds the pod's sandbox (namespace, cgroup, shunt-cni ADD) when it
// does not exist yet, or is gone (after a reboot, say); a healthy pod is
// left alone. shunt-cni answers once the agent has programmed the pod.
func (k *kubelet) plumb(ctx context.Context, rec *PodRecord, verify bool) error {
	if k.healthy(ctx, rec, verify) {
		return cgroup.Create(rec.Cgroup)
	}
	// A new sandbox means new processes: old ones (if any) lost their network.
	if err := k.unplumb(ctx, rec); err != nil {
		return err
	}
	rec.Containers = nil
	if err := cgroup.Create(rec.Cgroup); err != nil {
		return err
	}
	if rec.HostNetwork {
		return k.plumbHostNetwork(rec)
	}
	if err := podnet.CreateNetns(rec.Netns, k.cfg.Instance.PodLinkAlias(rec.Namespace, rec.Name)); err != nil {
		return fmt.Errorf("pod %s: %w", rec.key(), err)
	}
	rec.ContainerID = newContainerID()
	if err := k.cni.add(ctx, rec); err != nil {
		return errors.Join(fmt.Errorf("pod %s: %w", rec.key(), err), k.unplumb(ctx, rec))
	}
	return nil
}

// unplumb removes the pod's sandbox: its processes, shunt-cni DEL, the
// namespace (and what an older agent built without the plugin).
func (k *kubelet) unplumb(ctx context.Context, rec *PodRecord) error {
	if rec.HostNetwork {
		return k.unplumbHostNetwork(rec)
	}
	err := errors.Join(
		cgroup.Remove(rec.Cgroup),
		k.cni.del(ctx, rec),
		podnet.TeardownPod(podnet.Pod{Netns: rec.Netns, HostIf: rec.HostIf}),
	)
	rec.ContainerID, rec.IP, rec.HostIf = "", "", ""
	return err
}

// mountHolder is the pod's name in the machine's record of mount points
// (internal/mountpoint).
func (k *kubelet) mountHolder(rec *PodRecord) string {
	return mountpoint.Holder(k.cfg.Instance.Name, instance.PodFileName(rec.Namespace, rec.Name))
}

// bindTargets are the mount points the containers' binds need on the
// node (a container on the node's file system mounts there: a path the
// node lacks is made for it, and removed with the last pod holding it).
// A container from an image mounts in its own root (rootfs.go): none.
func (k *kubelet) bindTargets(pod *corev1.Pod, binds map[string][]podexec.Bind) []mountpoint.Target {
	var targets []mountpoint.Target
	for _, c := range pod.Spec.Containers {
		if img, _ := findLayoutImage(k.cfg.Images.Layouts, c.Image); img != nil {
			continue
		}
		for _, b := range binds[c.Name] {
			st, err := os.Stat(b.Source)
			targets = append(targets, mountpoint.Target{Path: b.Target, File: err == nil && !st.IsDir()})
		}
	}
	return targets
}

func (k *kubelet) podDir(rec *PodRecord) string {
	return filepath.Join(k.cfg.Instance.StateDir(), "pods", instance.PodFileName(rec.Namespace, rec.Name))
}

// start runs each container's command under a shim in the pod's cgroup;
// the shim enters the pod's network namespace for the command.
func (k *kubelet) start(pod *corev1.Pod, rec *PodRecord) error {
	dir := k.podDir(rec)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rec.Containers = nil
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	binds, err := k.podFiles(ctx, pod, rec, dir)
	if err != nil {
		return err
	}
	if err := mountpoint.Acquire(k.mountHolder(rec), k.bindTargets(pod, binds)); err != nil {
		return err
	}
	if err := k.runInitContainers(pod, rec); err != nil {
		return err
	}
	for _, c := range pod.Spec.Containers {
		cr := ContainerRecord{Name: c.Name, Image: c.Image, LogFile: filepath.Join(dir, c.Name+".log"), ExitFile: filepath.Join(dir, c.Name+".exit"), Binds: binds[c.Name]}
		if err := k.startContainer(pod, rec, c, &cr); err != nil {
			return err
		}
		rec.Containers = append(rec.Containers, cr)
	}
	return nil
}

// startContainer runs one container's command under a shim (anew after
// an exit: restarts.go), appending to its log.
func (k *kubelet) startContainer(pod *corev1.Pod, rec *PodRecord, c corev1.Container, cr *ContainerRecord) error {
	cr.Started = time.Now().UTC().Truncate(time.Second)
	logf, err := os.OpenFile(cr.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	argv, fsFlags, imagePath, err := k.imageProcess(pod, rec, c)
	var env []string
	if err == nil {
		env, err = k.containerEnv(pod, rec, c, imagePath)
	}
	if err == nil && argv == nil {
		// $(VAR) in the command and args: the container's variables.
		run := expandCommand(c, env)
		argv, err = k.cfg.Images.Argv(c.Image, run.Command, run.Args)
	}
	if err != nil {
		logf.Close()
		return fmt.Errorf("container %s: %w", c.Name, err)
	}
	cr.env = env
	shimArgs := append([]string{"shim", "--netns", k.netnsOf(pod, rec), "--exit-file", cr.ExitFile, "--log-file", cr.LogFile, "--hostname", podHostname(pod)}, securityArgs(pod, c)...)
	if len(fsFlags) > 0 {
		// From an image: its volumes are mounts in its own root (rootfs.go).
		shimArgs = append(shimArgs, fsFlags...)
	} else if len(cr.Binds) > 0 {
		shimArgs = append(shimArgs, "--binds", bindsArg(cr.Binds))
	}
	shim := exec.Command(k.cfg.ShimExe, append(append(shimArgs, "--"), argv...)...)
	// The shim writes the container's output into the log itself, in the
	// CRI's format (crilog.go); this is for its own last words before it
	// can.
	shim.Stdout, shim.Stderr = logf, logf
	shim.Dir = c.WorkingDir
	if shim.Dir == "" {
		shim.Dir = "/"
	}
	shim.Env = env
	// Its own session: the container survives the agent's exit and its
	// terminal signals.
	shim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = podexec.Start(podexec.Target{CgroupPath: rec.Cgroup}, shim)
	logf.Close()
	if err != nil {
		return fmt.Errorf("container %s: starting %q: %w", c.Name, argv, err)
	}
	cr.ShimPID = shim.Process.Pid
	go shim.Wait() // reap it while this agent lives; init does after
	return nil
}

// containerEnv is what a container's process gets: the lab's variables,
// the image's PATH (if from an image), then what kubelet gives
// (podenv.go), which wins over both (exec keeps the last of a name).
func (k *kubelet) containerEnv(pod *corev1.Pod, rec *PodRecord, c corev1.Container, imagePath string) ([]string, error) {
	podEnv, err := k.podEnv(pod, rec, c)
	if err != nil {
		return nil, err
	}
	return append(k.labEnv(pod, rec, imagePath), podEnv...), nil
}

// labEnv are the variables every container of the lab gets first.
func (k *kubelet) labEnv(pod *corev1.Pod, rec *PodRecord, imagePath string) []string {
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if k.cfg.BinDir != "" {
		path = k.cfg.BinDir + ":" + path
	}
	if imagePath != "" {
		path = imagePath
	}
	return []string{
		"PATH=" + path, "HOME=/root", "HOSTNAME=" + pod.Name,
		"SHUNT_POD_NAME=" + pod.Name, "SHUNT_POD_NAMESPACE=" + pod.Namespace, "SHUNT_POD_IP=" + rec.IP,
		"SHUNT_INSTANCE=" + k.cfg.Instance.Name,
	}
}

// sandboxWorkers is how many pods' sandboxes the kubelet builds or removes
// at once, as a real kubelet's pod workers do: each mostly waits (for
// shunt-cni, a process per call, and for the agent, which programs the
// pods that arrive together in one sync), so one at a time took 75 s to
// build 1 000 pods and 80 s to remove them.
const sandboxWorkers = 8

// plumbEach plumbs each pod (plumb), several at a time; the error of
// each, by index.
func (k *kubelet) plumbEach(ctx context.Context, recs []*PodRecord, verify bool) []error {
	errs := make([]error, len(recs))
	parallel.Limit(len(recs), sandboxWorkers, func(i int) { errs[i] = k.plumb(ctx, recs[i], verify) })
	return errs
}

// remove kills the pods' processes and removes their sandboxes (several
// at a time) and records.
func (k *kubelet) remove(ctx context.Context, recs ...*PodRecord) error {
	errs := make([]error, len(recs))
	parallel.Limit(len(recs), sandboxWorkers, func(i int) {
		errs[i] = errors.Join(k.unplumb(ctx, recs[i]), os.RemoveAll(k.podDir(recs[i])), mountpoint.Release(k.mountHolder(recs[i])))
	})
	for _, rec := range recs {
		k.probes.stop(rec.key())
		delete(k.pods, rec.key())
		k.cfg.Log.Info("pod deleted", "pod", rec.key())
	}
	return errors.Join(errs...)
}

// removeAll removes every pod's sandbox and record.
func (k *kubelet) removeAll(ctx context.Context) error {
	return k.remove(ctx, slices.Collect(maps.Values(k.pods))...)
}

// podHostname is the host name a kubelet gives the pod's containers:
// spec.hostname, else the pod's name, cut to a DNS label's 63 characters;
// "" (the node's) for a pod of the host's network.
func podHostname(pod *corev1.Pod) string {
	if pod.Spec.HostNetwork {
		return ""
	}
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// runnable says whether the lab can run every container of the pod (each
// image is mapped, Images.Argv); a pod that is not stays Pending, its
// sandbox built, as a kubelet leaves a pod whose image it cannot pull.
func (k *kubelet) runnable(pod *corev1.Pod) bool {
	_, unmapped := k.imageWaits(pod)
	return unmapped == ""
}

// imageWaits are the container statuses of a pod with an image the lab
// cannot run (each such container waiting with ImageNotMappedReason, the
// others ContainerCreating) and what is wrong, or "" when every image maps.
func (k *kubelet) imageWaits(pod *corev1.Pod) ([]corev1.ContainerStatus, string) {
	var statuses []corev1.ContainerStatus
	var problems []string
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
		if _, err := k.cfg.Images.Argv(c.Image, c.Command, c.Args); err != nil {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: ImageNotMappedReason, Message: err.Error()}
			problems = append(problems, "container "+c.Name+": "+err.Error())
		}
		statuses = append(statuses, cs)
	}
	return statuses, strings.Join(problems, "; ")
}

func imageOf(p *corev1.Pod, container string) string {
	for _, c := range p.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// containerSecurity is what a container runtime takes from a container's
// securityContext (and the pod's runAsUser/runAsGroup).
func containerSecurity(pod *corev1.Pod, c corev1.Container) podexec.Security {
	var sec podexec.Security
	uid, gid := (*int64)(nil), (*int64)(nil)
	if ps := pod.Spec.SecurityContext; ps != nil {
		uid, gid = ps.RunAsUser, ps.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		sec.Privileged = sc.Privileged != nil && *sc.Privileged
		if caps := sc.Capabilities; caps != nil {
			for _, a := range caps.Add {
				sec.Add = append(sec.Add, string(a))
			}
			for _, d := range caps.Drop {
				sec.Drop = append(sec.Drop, string(d))
			}
		}
	}
	if uid != nil {
		sec.UID = ptr(uint32(*uid))
	}
	if gid != nil {
		sec.GID = ptr(uint32(*gid))
	}
	return sec
}

// securityArgs are the shim's flags for a container's securityContext, as
// a container runtime applies them.
func securityArgs(pod *corev1.Pod, c corev1.Container) []string {
	var args []string
	sec := containerSecurity(pod, c)
	if sec.Privileged {
		args = append(args, "--privileged")
	}
	for _, a := range sec.Add {
		args = append(args, "--cap-add", a)
	}
	for _, d := range sec.Drop {
		args = append(args, "--cap-drop", d)
	}
	if sec.UID != nil {
		args = append(args, "--uid", strconv.FormatUint(uint64(*sec.UID), 10))
	}
	if sec.GID != nil {
		args = append(args, "--gid", strconv.FormatUint(uint64(*sec.GID), 10))
	}
	return args
}
