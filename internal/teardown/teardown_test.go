package teardown

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podnet"
)

// TestInstanceRemovesOnlyItsOwnNamespaces: of the namespaces named like an
// instance's pods ("NAME-..."), teardown removes those the instance marked
// (at creation, or through a pod veth's alias as older agents left them)
// and leaves one someone else named alike, as a test or an admin might.
// The file of a pod namespace whose creator was killed before it mounted
// the namespace there goes too, and another instance's stays.
func TestInstanceRemovesOnlyItsOwnNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	inst, err := instance.New(fmt.Sprintf("td%06d", rand.IntN(1000000)))
	if err != nil {
		t.Fatal(err)
	}
	marked := inst.PodNetns("default", "marked")
	legacy := inst.PodNetns("default", "legacy")
	stranger := inst.Name + "-someone-elses"
	for _, n := range []string{marked, legacy, stranger} {
		t.Cleanup(func() { podnet.DeleteNetns(n) })
	}
	// As netns.NewNamed leaves it when killed between its create and its
	// mount: an empty read-only file.
	halfMade, othersHalfMade := inst.PodNetns("default", "half"), "x"+inst.PodNetns("default", "half")
	for _, n := range []string{halfMade, othersHalfMade} {
		t.Cleanup(func() { os.Remove(podnet.NetnsPath(n)) })
		if err := os.WriteFile(podnet.NetnsPath(n), nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	if err := podnet.CreateNetns(marked, inst.PodLinkAlias("default", "marked")); err != nil {
		t.Fatal(err)
	}
	if err := podnet.CreateNetns(stranger, ""); err != nil {
		t.Fatal(err)
	}
	// An older agent's pod: an unmarked namespace, found through the alias
	// of its host veth (whose peer lives in it).
	if err := podnet.CreateNetns(legacy, ""); err != nil {
		t.Fatal(err)
	}
	hostIf := inst.Name + "lg"
	t.Cleanup(func() { podnet.DeleteLink(hostIf) })
	ns, err := netns.GetFromPath(podnet.NetnsPath(legacy))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	la := netlink.NewLinkAttrs()
	la.Name = hostIf
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetAlias(host, inst.PodLinkAlias("default", "legacy")); err != nil {
		t.Fatal(err)
	}

	got := PodNetns(inst)
	slices.Sort(got)
	want := []string{podnet.NetnsPath(legacy), podnet.NetnsPath(marked)}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("PodNetns = %v, want %v (never the stranger %s)", got, want, stranger)
	}
	if err := Instance(inst); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{marked, legacy, halfMade} {
		if _, err := os.Stat(podnet.NetnsPath(n)); err == nil {
			t.Errorf("namespace %s of the instance outlived its teardown", n)
		}
	}
	if _, err := os.Stat(podnet.NetnsPath(stranger)); err != nil {
		t.Errorf("teardown of %s removed %s, which it did not create: %v", inst.Name, stranger, err)
	}
	if _, err := os.Stat(podnet.NetnsPath(othersHalfMade)); err != nil {
		t.Errorf("teardown of %s removed %s, another instance's: %v", inst.Name, othersHalfMade, err)
	}
	if _, err := netlink.LinkByName(hostIf); err == nil {
		t.Errorf("host veth %s outlived the teardown", hostIf)
	}
}
