package podnet

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// createLoopEnv makes the test binary, run again by
// TestCreateNetnsKilledMidwayLeavesNothingUnclaimed, create
// namespaces named after it until it is killed, marked as
// createLoopOwnerEnv says.
const createLoopEnv, createLoopOwnerEnv = "SHUNT_PODNET_CREATE_LOOP", "SHUNT_PODNET_CREATE_OWNER"

// TestCreateNetnsKilledMidwayLeavesNothingUnclaimed: a creator killed at
// any moment of CreateNetns (an agent stopped while it builds a pod) leaves
// only what a sweep claims: namespaces marked as the owner's
// (NetnsOwnedBy) or files with nothing mounted (HalfMadeNetns), never a
// named namespace without its mark, which no sweep may remove (its name
// alone could be someone else's). The creator is this test binary run
// again, killed after a random few milliseconds, many times.
func TestCreateNetnsKilledMidwayLeavesNothingUnclaimed(t *testing.T) {
	if prefix := os.Getenv(createLoopEnv); prefix != "" {
		for i := 0; ; i++ {
			if err := CreateNetns(fmt.Sprintf("%s%d", prefix, i), os.Getenv(createLoopOwnerEnv)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	prefix := fmt.Sprintf("shunt-test-kill%d-", os.Getpid())
	owner := prefix + "owner"
	t.Cleanup(func() {
		for _, p := range namedNetnsWithPrefix(prefix) {
			DeleteNetns(filepath.Base(p))
		}
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const kills = 60
	for k := range kills {
		cmd := exec.Command(self, "-test.run", "^TestCreateNetnsKilledMidwayLeavesNothingUnclaimed$")
		cmd.Env = append(os.Environ(), createLoopEnv+"="+prefix+strconv.Itoa(k)+"-", createLoopOwnerEnv+"="+owner)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Long enough for the binary to start and create a few.
		time.Sleep(30*time.Millisecond + rand.N(20*time.Millisecond))
		cmd.Process.Kill()
		cmd.Wait()
	}
	all := namedNetnsWithPrefix(prefix)
	claimed := append(NetnsOwnedBy(prefix, owner), HalfMadeNetns(prefix)...)
	var unclaimed []string
	for _, p := range all {
		if !slices.Contains(claimed, p) {
			unclaimed = append(unclaimed, filepath.Base(p))
		}
	}
	if len(all) < kills {
		t.Errorf("%d namespaces made by %d creators: the creators did not get far enough to test anything", len(all), kills)
	}
	if len(unclaimed) > 0 {
		t.Errorf("%d of %d namespaces are named but neither marked as %q's nor half-made: %v", len(unclaimed), len(all), owner, unclaimed)
	}
	t.Logf("%d namespaces from %d killed creators, %d half-made", len(all), kills, len(HalfMadeNetns(prefix)))
}
