package lab

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

// What a kubelet writes into its Node's status besides its conditions:
// capacity, allocatable and system information (pkg/kubelet/nodestatus).
// The lab's nodes share one machine, so each reports the machine's.

// kubeletMaxPods is kubelet's --max-pods default.
const kubeletMaxPods = 110

// Kubelet's default hard eviction thresholds (memory.available<100Mi,
// nodefs.available<10%), which allocatable holds back from capacity.
const (
	evictionMemory          = 100 << 20
	evictionNodefsPercent   = 10
	nodeEphemeralStorageDir = "/var/lib"
)

// nodeResources are the node's capacity and allocatable as kubelet
// computes them with no --kube-reserved or --system-reserved: the
// machine's CPUs and memory, the file system below /var/lib (kubelet's
// root directory) as ephemeral storage, no huge pages, 110 pods;
// allocatable less the hard eviction thresholds.
func nodeResources() (capacity, allocatable corev1.ResourceList) {
	mem := memTotal()
	var fs unix.Statfs_t
	storage := int64(0)
	if unix.Statfs(nodeEphemeralStorageDir, &fs) == nil {
		storage = int64(fs.Blocks) * fs.Bsize
	}
	capacity = corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(mem, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(storage, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(kubeletMaxPods, resource.DecimalSI),
		"hugepages-2Mi":                 *resource.NewQuantity(0, resource.BinarySI),
		"hugepages-1Gi":                 *resource.NewQuantity(0, resource.BinarySI),
	}
	allocatable = capacity.DeepCopy()
	allocatable[corev1.ResourceMemory] = *resource.NewQuantity(max(0, mem-evictionMemory), resource.BinarySI)
	allocatable[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(storage-storage*evictionNodefsPercent/100, resource.BinarySI)
	return capacity, allocatable
}

// memTotal is the machine's memory (MemTotal of /proc/meminfo), as
// cadvisor reads it.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// nodeSystemInfo is the Node's status.nodeInfo as kubelet fills it from
// the machine (machine-id, DMI product UUID, boot id, uname, os-release)
// and its runtime.
func nodeSystemInfo() corev1.NodeSystemInfo {
	read := func(p string) string {
		data, _ := os.ReadFile(p)
		return strings.TrimSpace(string(data))
	}
	var u unix.Utsname
	kernel := ""
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	return corev1.NodeSystemInfo{
		MachineID:               read("/etc/machine-id"),
		SystemUUID:              read("/sys/class/dmi/id/product_uuid"),
		BootID:                  read("/proc/sys/kernel/random/boot_id"),
		KernelVersion:           kernel,
		OSImage:                 osImage(read("/etc/os-release")),
		ContainerRuntimeVersion: "shunt-lab://" + kubecluster.KubeVersion,
		KubeletVersion:          kubecluster.KubeVersion,
		OperatingSystem:         runtime.GOOS,
		Architecture:            runtime.GOARCH,
	}
}

// osImage is os-release's PRETTY_NAME, as kubelet (cadvisor) reports it.
func osImage(osRelease string) string {
	for line := range strings.Lines(osRelease) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	return "Linux"
}

// machineStatus is computed once per process: capacity and system
// information change with a reboot, which restarts the kubelet.
var machineStatus = sync.OnceValues(func() (corev1.NodeStatus, error) {
	capacity, allocatable := nodeResources()
	return corev1.NodeStatus{Capacity: capacity, Allocatable: allocatable, NodeInfo: nodeSystemInfo()}, nil
})

// machineStatusCurrent says whether the Node's status already has the
// machine's capacity, allocatable and system information.
func machineStatusCurrent(node *corev1.Node) bool {
	want, _ := machineStatus()
	return equality.Semantic.DeepEqual(node.Status.Capacity, want.Capacity) &&
		equality.Semantic.DeepEqual(node.Status.Allocatable, want.Allocatable) &&
		equality.Semantic.DeepEqual(node.Status.NodeInfo, want.NodeInfo)
}

// allocatable is the node's allocatable: the limits of a container that
// sets none, for the downward API (podenv.go).
func (k *kubelet) allocatable() corev1.ResourceList {
	st, _ := machineStatus()
	return st.Allocatable
}
