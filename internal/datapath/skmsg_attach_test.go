package datapath

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/teardown"
)

var skMsgAttachFallback = dpinfo.Fallbacks{dpinfo.FallbackSkMsgAttach: true}

// TestSkMsgProgAttach: with the skmsg-attach fallback the sk_msg program is
// attached with BPF_PROG_ATTACH and redirects; a restarted agent replaces
// it; switching to a sockmap link and back across restarts leaves exactly
// one program attached; uninstall (removing the pins) detaches it once the
// last socket in the sockhash is closed.
func TestSkMsgProgAttach(t *testing.T) {
	requireBPF(t)
	pinDir := testPinDir(t)
	var d *Datapath
	restart := func(fallbacks dpinfo.Fallbacks) {
		t.Helper()
		if d != nil {
			d.Close()
		}
		var err error
		if d, err = open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, Fallbacks: fallbacks}), nil); err != nil {
			t.Fatal(err)
		}
		if err := d.AttachSocketAccel(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if d != nil {
			d.Close()
		}
	})
	pin := filepath.Join(pinDir, "links", "sockhash-sk_msg")

	restart(skMsgAttachFallback)
	first := attachedSkMsg(t, d, "the fallback")
	if want := programID(t, d.skMsg.ShuntSkMsg); first != want {
		t.Errorf("attached program %d, want the datapath's %d", first, want)
	}
	expectPinnedProgram(t, pin, first)
	netns, err := currentNetnsCookie()
	if err != nil {
		t.Fatal(err)
	}
	client, server := tcpPair(t)
	accelerateByHand(t, d, client, server, netns)
	before := counts(t, d)
	exchangeRedirected(t, client, server, []byte("request-1"), "accelerated, client -> server")
	counterDelta(t, d, before, map[string]uint64{"accel-redirected/sockmsg": 1})

	// A restart replaces the program at once.
	restart(skMsgAttachFallback)
	second := attachedSkMsg(t, d, "the fallback after a restart")
	if want := programID(t, d.skMsg.ShuntSkMsg); second != want || second == first {
		t.Errorf("after a restart: attached program %d, want the new datapath's %d (the old was %d)", second, want, first)
	}
	expectPinnedProgram(t, pin, second)

	// To a sockmap link and back, where the kernel has sockmap links.
	last := second
	if take, _ := probedFallbacks(); take.Has(dpinfo.FallbackSkMsgAttach) {
		t.Logf("no sockmap links on this kernel (%s; Linux 6.10+): the switch to a link and back is not tried", KernelRelease())
	} else {
		// To a sockmap link: the link replaces the program, the program's pin
		// goes.
		restart(nil)
		viaLink := attachedSkMsg(t, d, "a link after the fallback")
		if l, err := link.LoadPinnedLink(pin, nil); err != nil {
			t.Errorf("after switching to a link: no link pinned at %s: %v", pin, err)
		} else {
			l.Close()
		}
		if viaLink != programID(t, d.skMsg.ShuntSkMsg) {
			t.Errorf("the link attaches program %d, not the datapath's", viaLink)
		}

		// And back: the link goes, the program is attached alone.
		restart(skMsgAttachFallback)
		last = attachedSkMsg(t, d, "the fallback after a link")
		expectPinnedProgram(t, pin, last)
	}

	// Uninstall: the pins go, and with them the program, at the latest
	// when the sockets still in the sockhash close (on 6.18 it is gone at
	// once: logged).
	d.Close()
	d = nil
	if err := teardown.Pins(pinDir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if p, err := ebpf.NewProgramFromID(last); err != nil {
		t.Logf("program %d gone once the pins were removed, sockets still in the sockhash: %v", last, err)
	} else {
		p.Close()
		t.Logf("program %d kept by the sockets still in the sockhash", last)
	}
	client.Close()
	server.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := ebpf.NewProgramFromID(last)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err == nil {
			p.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("sk_msg program %d still exists 5 s after uninstall removed the pins and its sockets closed (%v)", last, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// attachedSkMsg is the one sk_msg program attached to the sockhash.
func attachedSkMsg(t *testing.T, d *Datapath, when string) ebpf.ProgramID {
	t.Helper()
	r, err := link.QueryPrograms(link.QueryOptions{Target: d.sockOps.ShuntSockhash.FD(), Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		t.Fatalf("querying the programs of shunt_sockhash (Linux 6.0+): %v", err)
	}
	var ids []ebpf.ProgramID
	for _, p := range r.Programs {
		ids = append(ids, p.ID)
	}
	if len(ids) != 1 {
		t.Fatalf("%s: sk_msg programs attached to shunt_sockhash: %v, want one", when, ids)
	}
	return ids[0]
}

// expectPinnedProgram checks that pin holds the program id (no link).
func expectPinnedProgram(t *testing.T, pin string, id ebpf.ProgramID) {
	t.Helper()
	p, err := ebpf.LoadPinnedProgram(pin, nil)
	if err != nil {
		t.Fatalf("no program pinned at %s: %v", pin, err)
	}
	defer p.Close()
	if got := programID(t, p); got != id {
		t.Errorf("pinned program %d, want %d", got, id)
	}
	if pins, _ := filepath.Glob(filepath.Join(filepath.Dir(pin), "sockhash-sk_msg*")); !slices.Equal(pins, []string{pin}) {
		t.Errorf("pins of the sk_msg attachment: %v, want %s alone", pins, pin)
	}
}
