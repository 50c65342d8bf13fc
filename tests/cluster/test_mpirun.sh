#!/usr/bin/env bash
# Training across two hosts with mpirun: the same W = 4 job once as 4 ranks on one host
# (node1) and once as 2 hosts x 2 ranks (ranks 0-1 on node1, 2-3 on node2, over TCP
# between the hosts and shared memory within each). The trajectory depends only on W,
# so the final epoch's loss, HR and NDCG (--metrics_json, full precision) must be
# identical; each rank reports the host its launcher put it on, and the two-host run
# must have put two ranks on each host.
#   bash tests/cluster/test_mpirun.sh BUILD_DIR      (exit 77: skipped, with the reason)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
# shellcheck source=tests/cluster/lib.sh
source "$here/lib.sh"
name=test_mpirun
why=$(cluster_check) || { echo "$name: skipped: $why"; exit 77; }

fail() {
  echo "$name: FAIL: $*" >&2
  for f in "$CLUSTER_SHARED"/*.out; do [ -f "$f" ] && { echo "---- $f" >&2; cat "$f" >&2; }; done
  exit 1
}

cluster_start 2
cluster_small_data "$build" "$CLUSTER_SHARED/data"
args=(--device cpu --data_dir "$CLUSTER_SHARED/data" --preset ncf-paper --batch_size 2560 --train_epochs 4
      --seed 3 --threads 1 --progress off --comm mpi)
dist=("$(cluster_where)" "$build/src/ncf_dist")

cluster_mpirun_on node1:4 -- "${dist[@]}" "${args[@]}" --metrics_json "$CLUSTER_SHARED/one.jsonl" \
  >"$CLUSTER_SHARED/one.out" 2>&1 || fail "the one-host W = 4 run failed"
cluster_mpirun 2 -- "${dist[@]}" "${args[@]}" --metrics_json "$CLUSTER_SHARED/two.jsonl" \
  >"$CLUSTER_SHARED/two.out" 2>&1 || fail "the 2 x 2 run failed"

placed=$(cluster_rank_hosts "$(cat "$CLUSTER_SHARED/one.out")" | tr '\n' ' ')
[ "$placed" = "0 node1 1 node1 2 node1 3 node1 " ] || fail "one-host run placed ranks as: $placed"
placed=$(cluster_rank_hosts "$(cat "$CLUSTER_SHARED/two.out")" | tr '\n' ' ')
[ "$placed" = "0 node1 1 node1 2 node2 3 node2 " ] || fail "2 x 2 run placed ranks as: $placed (want 0-1 on node1, 2-3 on node2)"
# Open MPI's own view of each host's ranks: the node-local group is 2 ranks.
[ "$(grep -c '^where: .*(local [01] of 2)' "$CLUSTER_SHARED/two.out")" -eq 4 ] ||
  fail "Open MPI did not see 2 ranks per host: $(grep '^where:' "$CLUSTER_SHARED/two.out" | tr '\n' ';')"
grep -q "4 rank(s)" "$CLUSTER_SHARED/two.out" || fail "ncf_dist did not report 4 ranks"

want=$(cluster_final_metrics "$CLUSTER_SHARED/one.jsonl")
got=$(cluster_final_metrics "$CLUSTER_SHARED/two.jsonl")
[ "${want%% *}" = 4 ] || fail "the one-host run ended at epoch ${want%% *}, not 4"
[ "$want" = "$got" ] || fail "final epoch (epoch loss hr ndcg): one host '$want', two hosts '$got'"
echo "$name: ok: 2 hosts x 2 ranks (0-1 on node1, 2-3 on node2) ended like 4 ranks on one host:" \
  "epoch, loss, HR, NDCG = $got"
