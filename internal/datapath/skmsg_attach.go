package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The skmsg-attach fallback (dpinfo.FallbackSkMsgAttach): where the kernel
// has no sockmap links (before Linux 6.10), the sk_msg program is attached
// to the sockhash with BPF_PROG_ATTACH. The sockhash then holds the program
// itself, as long as the map lives: it outlives the agent as the pinned link
// does. The program is pinned where the link would be (links/sockhash-sk_msg),
// as the record of the attachment, which a later agent needs to switch to a
// link and which status counts as the link's pin.
//
// What the kernel does (checked on 6.18 by TestSkMsgProgAttach):
//   - BPF_PROG_ATTACH to a sockmap swaps the verdict program attached with
//     BPF_PROG_ATTACH before for the new one at once; BPF_F_REPLACE is
//     refused (EINVAL) for sockmaps, so a restarted agent just attaches.
//   - BPF_PROG_ATTACH is refused (EBUSY) while a sockmap link is attached;
//     creating a link replaces a program attached with BPF_PROG_ATTACH.
//   - When the last file descriptor and pin of the sockhash are gone, the
//     kernel drops the programs attached to it (map_release_uref): removing
//     the pins on uninstall (teardown.Pins) detaches the program. On 6.18
//     it is freed at once, even with sockets still in the sockhash; a
//     kernel whose sockets hold their own reference frees it when they
//     close.

// attachSkMsgProg attaches prog to sockhash with BPF_PROG_ATTACH and pins
// it at pin, replacing what an earlier agent attached there.
func attachSkMsgProg(pin string, sockhash *ebpf.Map, prog *ebpf.Program) error {
	// A link an earlier agent without the fallback pinned: it goes first,
	// as the kernel refuses BPF_PROG_ATTACH while it is attached. Sockets
	// sockops adds in between get no sk_msg program: their sends take the
	// TCP/IP stack, as those of sockets not accelerated do.
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		err = l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("removing the sockmap link pinned at %s to attach sk_msg with BPF_PROG_ATTACH: %w", pin, err)
		}
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: sockhash.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		return fmt.Errorf("attaching sk_msg to shunt_sockhash with BPF_PROG_ATTACH (the fallback for kernels without sockmap links): %w", err)
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replacing the pin of the sk_msg program an earlier agent attached: %w", err)
	}
	// A clone, so that the datapath's own handle carries no pin path.
	pinned, err := prog.Clone()
	if err != nil {
		return fmt.Errorf("pinning the sk_msg program attached to shunt_sockhash: %w", err)
	}
	defer pinned.Close()
	if err := pinned.Pin(pin); err != nil {
		return fmt.Errorf("pinning the sk_msg program attached to shunt_sockhash at %s: %w", pin, err)
	}
	return nil
}

// unpinSkMsgProg removes the pin of a program an agent with the
// skmsg-attach fallback attached, once a sockmap link replaced it in the
// kernel; a pin that is no program (a link, or nothing) is left alone.
func unpinSkMsgProg(pin string) error {
	prog, err := ebpf.LoadPinnedProgram(pin, nil)
	if err != nil {
		return nil
	}
	prog.Close()
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the pin of the sk_msg program the sockmap link replaced: %w", err)
	}
	return nil
}
