#!/usr/bin/env bash
# Every test on the simulated multi-host cluster (sim_cluster.sh), one after another:
#   test_sim_cluster   the hosts themselves, and a stop that leaves nothing behind
#   test_mpirun        2 hosts x 2 ranks with mpirun = 4 ranks on one host
#   test_slurm         ncf_dist_multinode.sbatch on a 2-host Slurm (srun, mpirun), with
#                      preemption and requeue
#   test_host_loss     a host killed or cut off mid-run; every rank ends; resume on the rest
#   test_two_hop       the two-hop exchange against flat on 2 and 3 hosts
#   test_checkpoint_lock  two jobs on one shared checkpoint directory from two hosts: the
#                      second refused; the holder's host killed, its lock taken over
#   bash tests/cluster/run_all.sh BUILD_DIR [TEST...]
# Without root or namespaces every test is reported as skipped, with the reason, and
# the exit code is 0; otherwise it is 1 when any test failed. Each test's output goes
# to a log that is printed when it fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR [TEST...]}" && pwd)"
shift
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_sim_cluster test_mpirun test_slurm test_host_loss test_two_hop test_checkpoint_lock)
# shellcheck source=tests/cluster/lib.sh
source "$here/lib.sh"
# The hosts need ip and tc (iproute2), the Slurm tests Slurm and munge.
if [ "$(id -u)" -eq 0 ]; then bash "$here/../slurm/setup.sh"; fi
if ! why=$(cluster_check); then
  for t in "${tests[@]}"; do echo "cluster: skipped $t: $why"; done
  exit 0
fi
# Every cluster the tests start is registered (sim_cluster.sh, /run/ncf-sim-cluster)
# with this run's tag; other runs' clusters (other checkouts, at the same time) are not
# theirs, whenever they come and go.
NCF_CLUSTER_OWNER="run_all.$$.$(date +%s%N)"
export NCF_CLUSTER_OWNER
logs=$(mktemp -d /var/tmp/ncf-cluster-logs-XXXXXX)
trap 'rm -rf "$logs"' EXIT
failed=() start=$SECONDS
for t in "${tests[@]}"; do
  [ -f "$here/$t.sh" ] || { echo "cluster: no test $t ($here/$t.sh)"; failed+=("$t"); continue; }
  t0=$SECONDS rc=0
  bash "$here/$t.sh" "$build" >"$logs/$t.log" 2>&1 || rc=$?
  case "$rc" in
    0) grep "^$t: " "$logs/$t.log" | sed 's/^/cluster: /' || true
       echo "cluster: passed $t ($((SECONDS - t0)) s)" ;;
    77) echo "cluster: skipped $t: $(grep -m1 "skipped" "$logs/$t.log" || tail -1 "$logs/$t.log")" ;;
    *) echo "cluster: FAILED $t (exit $rc, $((SECONDS - t0)) s); its output:"
       sed 's/^/    /' "$logs/$t.log"
       failed+=("$t") ;;
  esac
done
# Nothing may outlive the tests: a cluster of theirs is registered until its stop has
# removed its namespaces (with their processes), veths and bridge.
left=""
for f in /run/ncf-sim-cluster/*.env; do
  if [ ! -f "$f" ] || ! grep -qxF "CLUSTER_OWNER=$NCF_CLUSTER_OWNER" "$f"; then continue; fi
  p=$(sed -n 's/^CLUSTER_PREFIX=//p' "$f")
  left+="$p ($(ip netns list | awk '{print $1}' | grep -E "^$p-node[0-9]+$" | tr '\n' ' ' || true)) "
done
if [ -n "$left" ]; then
  echo "cluster: clusters left behind (namespaces): $left"
  failed+=(leftovers)
fi
echo "cluster: ${#tests[@]} test(s) in $((SECONDS - start)) s${failed[*]:+; failed: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
