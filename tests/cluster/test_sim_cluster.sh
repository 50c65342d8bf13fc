#!/usr/bin/env bash
# The simulated cluster itself (sim_cluster.sh): hosts that are separate where real
# hosts are (hostname, network address, /tmp, /dev/shm) and shared where a cluster
# shares (the file system outside /tmp), mpirun across 3 and 4 of them, and a stop
# that leaves nothing behind: after a normal start, twice in a row, with no cluster,
# after a start that failed half way, and after a start killed with SIGKILL.
#   bash tests/cluster/test_sim_cluster.sh          (exit 77: skipped, with the reason)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sim="$here/sim_cluster.sh"
# shellcheck source=tests/cluster/lib.sh
source "$here/lib.sh"
name=test_sim_cluster
why=$(cluster_check) || { echo "$name: skipped: $why"; exit 77; }
fail() { echo "$name: FAIL: $*" >&2; exit 1; }

work=$(mktemp -d /var/tmp/ncf-simtest-XXXXXX)
dir="$work/c"
# a folder under this machine's /tmp that the hosts are given (--share), one they are not
tmpshare=$(mktemp -d /tmp/ncf-simshare-XXXXXX)
tmpown=$(mktemp -d /tmp/ncf-simown-XXXXXX)
echo shared >"$tmpshare/f"
echo private >"$tmpown/f"
trap '"$sim" --dir "$dir" stop >/dev/null 2>&1 || true; rm -rf "$work" "$tmpshare" "$tmpown"' EXIT

# leftovers PREFIX: what a cluster with that name prefix left (namespaces, links,
# processes in them, munged of $dir, mounts of $dir); empty when clean.
leftovers() {
  local p="$1" pid
  ip netns list | awk '{print $1}' | grep -E "^$p-node" | sed 's/^/namespace /' || true
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${p}(br|h[0-9]+|p[0-9]+)$" |
    sed 's/^/link /' || true
  for pid in $(pgrep -f "$dir" || true); do
    [ "$pid" != $$ ] && [ -d "/proc/$pid" ] && echo "process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline")"
  done
  grep -l " $dir/" /proc/[0-9]*/mountinfo 2>/dev/null | sed 's/^/mount seen by /' || true
  [ ! -e "$dir/cluster.env" ] || echo "file $dir/cluster.env"
  [ ! -e "$dir/host" ] || echo "directory $dir/host"
  [ ! -e "/run/ncf-sim-cluster/$p.env" ] || echo "registration /run/ncf-sim-cluster/$p.env"
}
prefix_of() { sed -n 's/^CLUSTER_PREFIX=//p' "$dir/cluster.env"; }
clean_or_fail() {  # what, prefix
  local left
  left=$(leftovers "$2")
  [ -z "$left" ] || fail "$1 left: $left"
}

# --- 3 hosts: separation, sharing, mpirun across them ---------------------------------
# The repository too (lib.sh's mpirun below runs its launch/ scripts), as cluster_start does.
"$sim" --dir "$dir" --hosts 3 --share "$tmpshare" --share "$cluster_root" start >/dev/null
p=$(prefix_of)
# The check of what stop leaves must see a running cluster.
[ "$(leftovers "$p" | grep -c '^namespace ')" -eq 3 ] || fail "3 hosts are not 3 namespaces: $(leftovers "$p")"
for k in 1 2 3; do
  # shellcheck disable=SC2016  # the host's shell expands these
  got=$("$sim" --dir "$dir" exec "node$k" sh -c 'echo "$(hostname) $(ip -4 -o addr show eth0 | awk "{print \$4}")"')
  [[ "$got" == "node$k 10.213."*".$k/24" ]] || fail "node$k reports '$got'"
  "$sim" --dir "$dir" exec "node$k" sh -c "echo node$k >/tmp/me; echo node$k >/dev/shm/me; echo node$k >$work/from-node$k"
done
for k in 1 2 3; do
  got=$("$sim" --dir "$dir" exec "node$k" sh -c 'cat /tmp/me /dev/shm/me; cat '"$work"'/from-node*' | tr '\n' ' ')
  [ "$got" = "node$k node$k node1 node2 node3 " ] || fail "node$k sees /tmp, /dev/shm, shared files as '$got'"
done
[ ! -e /tmp/me ] || fail "a host's /tmp leaked into this machine's"
# --share: the host sees that folder at its path (and starts in it), and no other of /tmp
got=$(cd "$tmpshare" && "$sim" --dir "$dir" exec node2 sh -c 'pwd; cat f; cat '"$tmpown"'/f 2>/dev/null || echo none' | tr '\n' ' ')
[ "$got" = "$tmpshare shared none " ] || fail "node2 sees the shared $tmpshare and the unshared $tmpown as '$got'"
got=$("$sim" --dir "$dir" exec node3 getent hosts node1 | awk '{print $1}')
[[ "$got" == 10.213.*.1 ]] || fail "node3 resolves node1 to '$got'"
"$sim" --dir "$dir" exec node1 tc qdisc show dev eth0 | grep -q "tbf.*rate 1Gbit" ||
  fail "node1's link is not shaped at 1gbit: $("$sim" --dir "$dir" exec node1 tc qdisc show dev eth0)"
# lib.sh's mpirun on this cluster (it was not started by cluster_start)
export CLUSTER_DIR="$dir" CLUSTER_HOSTS=3
CLUSTER_SUBNET=$(sed -n 's/^CLUSTER_SUBNET=//p' "$dir/cluster.env")
export CLUSTER_SUBNET
out=$(cluster_mpirun 1 -- "$(cluster_where)" true 2>&1) || fail "mpirun over 3 hosts failed: $out"
placed=$(cluster_rank_hosts "$out" | tr '\n' ' ')
[ "$placed" = "0 node1 1 node2 2 node3 " ] || fail "mpirun over 3 hosts placed ranks as '$placed': $out"
"$sim" --dir "$dir" stop
clean_or_fail "stop of 3 hosts" "$p"
"$sim" --dir "$dir" stop || fail "a second stop failed"
"$sim" --dir "$work/never" stop || fail "stop of a directory without a cluster failed"

# --- 4 hosts, with Slurm: srun over all of them, then stop --------------------------------
if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
  "$sim" --dir "$dir" --hosts 4 --slurm start >/dev/null
  p=$(prefix_of)
  got=$("$sim" --dir "$dir" exec node1 srun -N 4 --ntasks-per-node=1 hostname | sort | tr '\n' ' ')
  [ "$got" = "node1 node2 node3 node4 " ] || fail "srun -N 4 ran on '$got'"
  "$sim" --dir "$dir" stop
  clean_or_fail "stop of 4 hosts with Slurm" "$p"
else
  "$sim" --dir "$dir" --hosts 4 start >/dev/null
  p=$(prefix_of)
  "$sim" --dir "$dir" stop
  clean_or_fail "stop of 4 hosts" "$p"
  echo "$name: note: Slurm is not installed; 4 hosts started without it"
fi

# --- a start that fails after its second host tears itself down ---------------------------
if NCF_SIM_FAIL_AFTER_HOST=2 "$sim" --dir "$dir" --hosts 3 start >/dev/null 2>"$work/err"; then
  fail "a start told to fail succeeded"
fi
grep -q "failing after host node2" "$work/err" || fail "the failed start said: $(cat "$work/err")"
[ ! -e "$dir/cluster.env" ] || fail "the failed start left $dir/cluster.env"
p=$(sed -n 's/.* cluster \(ncf[0-9]*\): .*/\1/p' "$dir/logs/cluster.log" | tail -1)
[ -n "$p" ] || fail "the failed start did not log its cluster name"
clean_or_fail "a failed start" "$p"

# --- a start killed half way (no trap runs): stop cleans up -------------------------------
# It holds after its second host (DIR/host/held) until the kill: half way whatever the
# machine's speed.
NCF_SIM_HOLD_AFTER_HOST=2 "$sim" --dir "$dir" --hosts 4 start >/dev/null 2>&1 &
spid=$!
while [ ! -e "$dir/host/held" ]; do
  kill -0 "$spid" 2>/dev/null || fail "the start to be killed ended before it held after node2"
  sleep 0.02
done
# (stderr off while bash reports the job it killed)
exec 3>&2 2>/dev/null
kill -KILL "$spid" || true
wait "$spid" || true
exec 2>&3 3>&-
[ -e "$dir/cluster.env" ] || fail "the killed start had not written its cluster.env"
p=$(prefix_of)
"$sim" --dir "$dir" stop || fail "stop after a killed start failed"
clean_or_fail "stop after a killed start" "$p"

# --- a cluster whose directory was deleted under it: stop still finds everything ----------
slurm=()
if command -v slurmctld >/dev/null && command -v munged >/dev/null; then slurm=(--slurm); fi
"$sim" --dir "$dir" --hosts 2 ${slurm[@]+"${slurm[@]}"} start >/dev/null
p=$(prefix_of)
rm -rf "$dir"
"$sim" --dir "$dir" stop || fail "stop after the directory was deleted failed"
clean_or_fail "stop after the directory was deleted" "$p"
pgrep -f "munged .*$dir/munge" >/dev/null && fail "munged of the deleted directory is still running"

# --- refusals -----------------------------------------------------------------------------
if "$sim" --dir /tmp/ncf-not-shared --hosts 2 start >/dev/null 2>"$work/err"; then
  "$sim" --dir /tmp/ncf-not-shared stop || true
  fail "a cluster directory under /tmp was accepted"
fi
grep -q "under /tmp" "$work/err" || fail "a directory under /tmp was refused with: $(cat "$work/err")"
echo "$name: ok: 3 hosts (own hostname, address, /tmp, /dev/shm; shared files; names resolve;" \
  "links shaped; mpirun over 3 hosts), 4 hosts with srun, and stop leaves nothing after a" \
  "normal, repeated, failed or killed start, or with its directory deleted"
