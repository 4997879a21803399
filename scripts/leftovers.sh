#!/usr/bin/env bash
# What a run of the test suite leaves on the machine: `make test` takes a
# snapshot before it starts and reports after it ends what is new and still
# there. Tests must remove what they create, even on failure (network
# namespaces, interfaces, pins, cgroups, state, temporary files); this
# catches the ones that do not, which a green run would otherwise hide
# (Chromium's singleton directories, e2e.test's kuberc files and a half-made
# pod namespace were found so, by hand). It reports and does not fail the
# run: on a machine where other work runs, what that work creates meanwhile
# is listed too.
#
# usage: scripts/leftovers.sh snapshot FILE
#        scripts/leftovers.sh report FILE
set -euo pipefail

# Kept on purpose: the UI tests' screenshots (one directory, overwritten).
KEPT='^/tmp/shunt-test-artifacts$'

state() {
	local d
	for d in /tmp /run/netns /sys/fs/bpf /run/shunt /var/lib/shunt /sys/fs/cgroup/unified; do
		[ -d "$d" ] || continue
		# Everything at the top of each, files too (a pin, a state file);
		# in the cgroup root only the cgroups, not its interface files.
		find "$d" -mindepth 1 -maxdepth 1 \( -type d -o ! -path '/sys/fs/cgroup/unified/*' \) -printf "$d/%f\n" 2>/dev/null || true
	done
	ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print "interface " $2 }' || true
	# Routing rules, and the routes shunt marks as its own (proto 83,
	# 0x53): the node proxy's steering rule outlived every agent once.
	ip -4 rule show 2>/dev/null | sed 's/^/rule /' || true
	ip -4 route show table all proto 83 2>/dev/null | sed 's/^/route /' || true
}

case "${1:-}" in
snapshot)
	state | sort -u >"$2"
	;;
report)
	[ -f "$2" ] || { echo "leftovers: no snapshot $2 (scripts/leftovers.sh snapshot FILE first)" >&2; exit 1; }
	new=$(state | sort -u | comm -13 "$2" - | grep -Ev "$KEPT" || true)
	rm -f "$2"
	if [ -z "$new" ]; then
		echo "leftovers: none (the machine holds nothing new since the snapshot)"
	else
		echo "leftovers: the run left these behind (or something else made them meanwhile):"
		sed 's/^/  /' <<<"$new"
	fi
	;;
*)
	echo "usage: scripts/leftovers.sh snapshot FILE | report FILE" >&2
	exit 2
	;;
esac
