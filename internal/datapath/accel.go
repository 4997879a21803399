package datapath

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Socket acceleration (bpf/sock_ops.c, bpf/sk_msg.c, shunt_sockhash in
// bpf/lib/accel.h): sends between two local sockets skip the TCP/IP stack.
// The sockops program is attached with the socket hooks; the sk_msg program
// is attached to the sockhash with a pinned link, so it outlives the agent
// with the map.

// probeAccel says clearly when the kernel lacks what acceleration needs.
func probeAccel() error {
	if err := features.HaveMapType(ebpf.SockHash); err != nil {
		return fmt.Errorf("socket acceleration needs BPF_MAP_TYPE_SOCKHASH (Linux 4.18+): %w", err)
	}
	if err := features.HaveProgramType(ebpf.SkMsg); err != nil {
		return fmt.Errorf("socket acceleration needs sk_msg programs (Linux 4.17+): %w", err)
	}
	return nil
}

// AccelKernel is what socket acceleration does on this kernel where
// kernels differ; ProbeAccelKernel reads it from the kernel's BTF.
type AccelKernel struct {
	// FIONREADCounts: FIONREAD (SIOCINQ) counts the bytes sk_msg redirected
	// to an accelerated socket. The kernel counts them in tcp_bpf_ioctl
	// (6.18 has it; Debian 12's 6.1 has not, and there FIONREAD reads 0
	// while redirected data waits, though reads return it:
	// TestAccelRemovedMidStream on 6.1 in scripts/kernel-vm.sh).
	FIONREADCounts bool
	// Backpressure: the sk_msg program can hold a fast writer back. It reads
	// how much the peer has not read from the psock's msg_tot_len
	// (bpf/lib/accel_peer.h); a kernel whose struct sk_psock has no such
	// field (6.1) loads the program with the check off, so a writer faster
	// than its reader can get ENOMEM there (issue 31).
	Backpressure bool
}

// ProbeAccelKernel reads the kernel's BTF once for every AccelKernel fact.
func ProbeAccelKernel() (AccelKernel, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return AccelKernel{}, fmt.Errorf("reading the kernel's BTF for what socket acceleration can do: %w", err)
	}
	var k AccelKernel
	if k.FIONREADCounts, err = kernelHasFunc(spec, "tcp_bpf_ioctl"); err != nil {
		return AccelKernel{}, err
	}
	if k.Backpressure, err = psockHasQueueLength(spec); err != nil {
		return AccelKernel{}, err
	}
	return k, nil
}

// psockHasQueueLength says whether the kernel's struct sk_psock (in spec)
// has msg_tot_len.
func psockHasQueueLength(spec *btf.Spec) (bool, error) {
	var psock *btf.Struct
	if err := spec.TypeByName("sk_psock", &psock); err != nil {
		return false, fmt.Errorf("finding struct sk_psock in the kernel's BTF: %w", err)
	}
	for _, m := range psock.Members {
		if m.Name == "msg_tot_len" {
			return true, nil
		}
	}
	return false, nil
}

// noBackpressure is the sentence for a kernel without msg_tot_len.
const noBackpressure = "no backpressure for accelerated sockets on this kernel (struct sk_psock has no msg_tot_len: Linux 6.1 lacks it, 6.18 has it): a writer faster than its reader would get ENOMEM instead of blocking"

// NoBackpressure says why acceleration cannot hold a fast writer back on
// this kernel ("" where it can).
func (k AccelKernel) NoBackpressure() string {
	if k.Backpressure {
		return ""
	}
	return noBackpressure
}

// Caveats says what socket acceleration does differently on this kernel
// than on 6.18, one sentence each; none where it does nothing differently.
func (k AccelKernel) Caveats() []string {
	var caveats []string
	if !k.FIONREADCounts {
		caveats = append(caveats, "FIONREAD reads 0 for data redirected to an accelerated socket (no tcp_bpf_ioctl: Linux 6.1 lacks it, 6.18 has it); reads return every byte")
	}
	if !k.Backpressure {
		caveats = append(caveats, noBackpressure)
	}
	return caveats
}

// AttachSocketAccel attaches the sk_msg program to the sockhash (a
// sockmap link, Linux 6.10+), adopting the link an earlier agent pinned;
// with the skmsg-attach fallback, with BPF_PROG_ATTACH (skmsg_attach.go).
func (d *Datapath) AttachSocketAccel() error {
	pin := filepath.Join(d.cfg.PinDir, "links", "sockhash-sk_msg")
	if d.cfg.Fallbacks.Has(dpinfo.FallbackSkMsgAttach) {
		return attachSkMsgProg(pin, d.sockOps.ShuntSockhash, d.skMsg.ShuntSkMsg)
	}
	always := func(link.Link) bool { return true }
	attach := func() (link.Link, error) {
		l, err := link.AttachRawLink(link.RawLinkOptions{
			Target: d.sockOps.ShuntSockhash.FD(), Program: d.skMsg.ShuntSkMsg, Attach: ebpf.AttachSkMsgVerdict,
		})
		if err != nil {
			return nil, fmt.Errorf("attaching sk_msg to shunt_sockhash (sockmap links need Linux 6.10+): %w", err)
		}
		// The link replaced a program an agent with the fallback attached.
		if err := unpinSkMsgProg(pin); err != nil {
			l.Close()
			return nil, err
		}
		return l, nil
	}
	return attachPinned(pin, d.skMsg.ShuntSkMsg, always, attach)
}

// AccelConfig is the run-time switch of socket acceleration.
type AccelConfig struct {
	On bool
	// NodeProcesses includes the sockets of the node's own processes (the
	// host network namespace) besides pods' and the node proxy's.
	NodeProcesses bool
}

// SetAccel turns acceleration on or off for connections established from
// now on. Sockets already accelerated stay so until they close: taking a
// socket out of a sockhash mid-stream has hit kernel bugs (wrong
// copied_seq, FIONREAD 0), and such a connection keeps exactly the policy
// outcome it had.
func (d *Datapath) SetAccel(c AccelConfig) error {
	host, err := currentNetnsCookie() // the agent runs in the node's namespace
	if err != nil {
		return err
	}
	v := sockopsAccelConfig{HostNetnsCookie: host}
	if c.On {
		v.Enabled = 1
	}
	if c.NodeProcesses {
		v.NodeProcesses = 1
	}
	return d.drift.setAccel(v, func() error {
		if err := d.sockOps.ShuntAccelConfig.Put(uint32(0), v); err != nil {
			return fmt.Errorf("writing shunt_accel_config: %w", err)
		}
		return nil
	})
}

// AccelStatus says how acceleration is set and how many sockets the
// sockhash holds.
func (d *Datapath) AccelStatus() (c AccelConfig, sockets int, err error) {
	var v sockopsAccelConfig
	if err := d.sockOps.ShuntAccelConfig.Lookup(uint32(0), &v); err != nil {
		return c, 0, fmt.Errorf("reading shunt_accel_config: %w", err)
	}
	c = AccelConfig{On: v.Enabled != 0, NodeProcesses: v.NodeProcesses != 0}
	n, err := countKeys(d.sockOps.ShuntSockhash)
	return c, n, err
}

// accelRows decodes the sockhash: each accelerated socket by its tuple
// (local end first) and the namespace it lives in, named by the pod whose
// namespace it is ("node" for the node's).
func (d *Datapath) accelRows() ([]Row, error) {
	var cfg sockopsAccelConfig
	if err := d.sockOps.ShuntAccelConfig.Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("reading shunt_accel_config: %w", err)
	}
	var rows []Row
	var k sockopsSockKey
	it := d.sockOps.ShuntSockhash.Iterate()
	var cookie uint64
	for it.Next(&k, &cookie) {
		row := Row{
			"local":       fmt.Sprintf("%s:%d", fromBe32(k.LocalIp), fromBe16(k.LocalPort)),
			"remote":      fmt.Sprintf("%s:%d", fromBe32(k.RemoteIp), fromBe16(k.RemotePort)),
			"netnsCookie": k.NetnsCookie,
		}
		var pod uint32
		switch {
		case k.NetnsCookie == cfg.HostNetnsCookie:
			row["netns"] = "node"
		case d.sockOps.ShuntNetnsPods.Lookup(k.NetnsCookie, &pod) == nil:
			row["netns"] = fromBe32(pod).String()
		}
		rows = append(rows, row)
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		return rows, fmt.Errorf("reading shunt_sockhash: %w", err)
	}
	return rows, nil
}
