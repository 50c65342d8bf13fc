#!/usr/bin/env bash
# The two-hop exchange across real hosts (network namespaces, TCP between them,
# shared memory within one), at 2 hosts x 2 ranks and 3 hosts x 2 ranks:
#  - the communicator's exchanges (tests/test_two_hop.cc's workers, on the real nodes):
#    every two-hop all_to_all_v and exchange_counts leaves the receive buffers byte for
#    byte as flat does, and the embedding collection's steps give the same rows and
#    tables, for row-wise, table-wise and mixed plans with dedup on and off;
#  - two_hop against flat at the same W in ncf_dist, row-wise and mixed (user row-wise,
#    item table-wise) at 2 hosts and row-wise at 3 (the other plans are the workers'
#    above, and tests/test_two_hop.cc's over declared nodes): the same parameters byte
#    for byte (--save_params) and the same final metrics to the last digit;
#  - the step log's inter-node messages per step (rank 0), row-wise: hosts - 1 per
#    exchange under two_hop, (hosts - 1) x 2 under flat, 4 exchanges a step
#    (counts, ids, vectors, gradients). Bytes are printed, not compared: under
#    two_hop a rank carries its node's traffic for its rail, so one rank's bytes
#    differ from flat's while the sum over ranks does not (tests/test_two_hop.cc
#    checks the sums);
#  - --dedup node: two runs byte-identical, and within the trajectory tolerance of
#    the one-rank run;
#  - --exchange auto: its first 8 steps use both routes, it says what it measured
#    and kept, and its parameters are flat's byte for byte;
#  - an uneven layout (2 ranks on one host, 1 on another) with --exchange two_hop
#    falls back to flat and says why.
#   bash tests/cluster/test_two_hop.sh BUILD_DIR      (exit 77: skipped, with the reason)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
# shellcheck source=tests/cluster/lib.sh
source "$here/lib.sh"
name=test_two_hop
why=$(cluster_check) || { echo "$name: skipped: $why"; exit 77; }

fail() {
  echo "$name: FAIL: $*" >&2
  for f in "$CLUSTER_SHARED"/*.out; do [ -f "$f" ] && { echo "---- $f" >&2; tail -n 40 "$f" >&2; }; done
  exit 1
}

# run TAG HOSTLIST ARGS...: one job; output in TAG.out, metrics TAG.jsonl, params TAG.bin
run() {
  local tag="$1" list="$2"
  shift 2
  cluster_mpirun_on "$list" -- "$build/src/ncf_dist" --device cpu --data_dir "$CLUSTER_SHARED/data" \
    --preset ncf-paper --batch_size 2560 --train_epochs 1 --seed 5 --threads 1 --progress off \
    --comm mpi --step_log --metrics_json "$CLUSTER_SHARED/$tag.jsonl" \
    --save_params "$CLUSTER_SHARED/$tag.bin" "$@" >"$CLUSTER_SHARED/$tag.out" 2>&1 ||
    fail "run $tag ($list $*) failed"
}

# The inter-node messages rank 0 sent in each logged step, one number per line.
inter_msgs() { sed -n 's/^step [0-9]*:.*inter-node \([0-9]*\) msgs.*/\1/p' "$CLUSTER_SHARED/$1.out"; }
inter_bytes_total() {
  sed -n 's/^step [0-9]*:.*inter-node [0-9]* msgs \([0-9]*\) bytes.*/\1/p' "$CLUSTER_SHARED/$1.out" |
    awk '{s += $1} END {print s + 0}'
}

# Final epoch's loss, HR, NDCG of two runs within the trajectory tolerance: loss
# relative 1e-5 (tests/test_distributed.cc), HR and NDCG within 0.005 (10 of the
# 2,000 eval users: float rounding flips a few rankings; after 2 epochs flat at W = 4 and
# one rank differed by 2 users here).
close_to() {
  "$cluster_python3" - "$CLUSTER_SHARED/$1.jsonl" "$CLUSTER_SHARED/$2.jsonl" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(p) if l.strip()][-1] for p in sys.argv[1:3])
ok = abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"])
ok = ok and abs(a["hr"] - b["hr"]) <= 0.005 and abs(a["ndcg"] - b["ndcg"]) <= 0.005
print("loss %r vs %r, HR %r vs %r, NDCG %r vs %r" % (a["loss"], b["loss"], a["hr"], b["hr"],
                                                     a["ndcg"], b["ndcg"]))
sys.exit(0 if ok else 1)
EOF
}

summary=()
for hosts in 2 3; do
  cluster_start "$hosts"
  cluster_small_data "$build" "$CLUSTER_SHARED/data"
  list=""
  for k in $(seq "$hosts"); do list+="${list:+,}node$k:2"; done
  W=$((2 * hosts))
  # One job per worker: each starts and ends MPI.
  : >"$CLUSTER_SHARED/h${hosts}_workers.out"
  for worker in TwoHopWorker TwoHopCollectionWorker; do
    NCF_TWO_HOP_WORKER=1 NCF_TWO_HOP_REAL_NODES=1 cluster_mpirun 2 -- "$build/tests/test_two_hop" \
      --gtest_filter="$worker.*" >>"$CLUSTER_SHARED/h${hosts}_workers.out" 2>&1 ||
      fail "$hosts hosts: $worker failed"
  done
  maps=$(grep -c "two-hop worker: map done N=$hosts L=2 rank=[0-9]* (real nodes)" "$CLUSTER_SHARED/h${hosts}_workers.out" || true)
  steps=$(grep -c "collection worker: done rank=[0-9]* N=$hosts L=2 (real nodes)" "$CLUSTER_SHARED/h${hosts}_workers.out" || true)
  { [ "$maps" -eq "$W" ] && [ "$steps" -eq "$W" ]; } ||
    fail "$hosts hosts: $maps of $W ranks compared the exchanges and $steps of $W the collection's steps"
  ! grep -q "FAILED" "$CLUSTER_SHARED/h${hosts}_workers.out" || fail "$hosts hosts: a worker check failed"
  summary+=("$hosts hosts x 2: every exchange's receive buffers and the collection's steps (row, table, mixed; dedup on, off; node dedup) as flat's, on $W ranks")
  plans=(row "user=row,item=table")
  [ "$hosts" -eq 2 ] || plans=(row)
  for plan in "${plans[@]}"; do
    for dedup in on off; do
      tag="h${hosts}_${plan//[=,]/_}_$dedup"
      run "${tag}_flat" "$list" --shard_plan "$plan" --dedup "$dedup" --exchange flat
      run "${tag}_two" "$list" --shard_plan "$plan" --dedup "$dedup" --exchange two_hop
      grep -q "^ncf_dist: exchange: two_hop" "$CLUSTER_SHARED/${tag}_two.out" ||
        fail "$tag: two_hop was not used: $(grep 'exchange:' "$CLUSTER_SHARED/${tag}_two.out")"
      cmp -s "$CLUSTER_SHARED/${tag}_flat.bin" "$CLUSTER_SHARED/${tag}_two.bin" ||
        fail "$tag: two_hop's parameters differ from flat's"
      [ "$(cluster_final_metrics "$CLUSTER_SHARED/${tag}_flat.jsonl")" = \
        "$(cluster_final_metrics "$CLUSTER_SHARED/${tag}_two.jsonl")" ] ||
        fail "$tag: two_hop's final metrics differ from flat's"
      # Row-wise: every rank owns rows of both tables, so each exchange reaches every
      # peer: exactly 4 exchanges' worth of messages across nodes per step.
      if [ "$plan" = row ]; then
        want_two=$((4 * (hosts - 1)))
        want_flat=$((4 * (hosts - 1) * 2))
        bad=$(inter_msgs "${tag}_two" | grep -vx "$want_two" || true)
        if [ -n "$bad" ] || [ -z "$(inter_msgs "${tag}_two")" ]; then
          fail "$tag: two_hop steps sent inter-node messages $(inter_msgs "${tag}_two" | sort -u | tr '\n' ' ')(want $want_two)"
        fi
        bad=$(inter_msgs "${tag}_flat" | grep -vx "$want_flat" || true)
        [ -z "$bad" ] ||
          fail "$tag: flat steps sent inter-node messages $(inter_msgs "${tag}_flat" | sort -u | tr '\n' ' ')(want $want_flat)"
        summary+=("$hosts hosts x 2, row-wise, dedup $dedup: inter-node msgs/step flat $want_flat, two_hop $want_two; rank 0's inter-node bytes over the run flat $(inter_bytes_total "${tag}_flat"), two_hop $(inter_bytes_total "${tag}_two")")
        # --exchange auto: the first 8 steps alternate the routes (their step
        # lines show both message counts), the faster is kept and said, and
        # nothing changes: the parameters are flat's byte for byte.
        if [ "$dedup" = on ]; then
          run "${tag}_auto" "$list" --shard_plan row --dedup on --exchange auto
          grep -q "^ncf_dist: exchange: flat, then the faster route (auto: the first 8 training steps" \
            "$CLUSTER_SHARED/${tag}_auto.out" || fail "$tag: auto did not announce its trial"
          chosen=$(sed -n 's/^ncf_dist: exchange: \(flat\|two_hop\) (auto: measured faster, \([^)]*\)).*/\1: \2/p' \
            "$CLUSTER_SHARED/${tag}_auto.out")
          [ -n "$chosen" ] || fail "$tag: auto did not say what it measured and chose"
          first=$(inter_msgs "${tag}_auto" | head -8 | sort -u | tr '\n' ' ')
          [ "$first" = "$(printf '%s\n' "$want_two" "$want_flat" | sort -u | tr '\n' ' ')" ] ||
            fail "$tag: auto's first 8 steps sent inter-node messages $first (want both $want_flat and $want_two)"
          cmp -s "$CLUSTER_SHARED/${tag}_flat.bin" "$CLUSTER_SHARED/${tag}_auto.bin" ||
            fail "$tag: auto's parameters differ from flat's"
          summary+=("$hosts hosts x 2, row-wise: --exchange auto timed both routes over its first 8 steps and kept $chosen; parameters as flat's")
        fi
      fi
    done
  done
  # Node-level de-duplication: reproducible, within tolerance of one rank, and
  # fewer bytes across nodes than two_hop with rank-level dedup only.
  run "h${hosts}_node_a" "$list" --shard_plan row --dedup node --exchange two_hop
  run "h${hosts}_node_b" "$list" --shard_plan row --dedup node --exchange two_hop
  grep -q "^ncf_dist: exchange: two_hop + node dedup" "$CLUSTER_SHARED/h${hosts}_node_a.out" ||
    fail "node dedup was not used: $(grep 'exchange:' "$CLUSTER_SHARED/h${hosts}_node_a.out")"
  cmp -s "$CLUSTER_SHARED/h${hosts}_node_a.bin" "$CLUSTER_SHARED/h${hosts}_node_b.bin" ||
    fail "$hosts hosts: two --dedup node runs differ"
  run "h${hosts}_one" node1:1 --shard_plan row --dedup on
  near=$(close_to "h${hosts}_one" "h${hosts}_node_a") ||
    fail "$hosts hosts: --dedup node strays from one rank: $near"
  node_bytes=$(inter_bytes_total "h${hosts}_node_a")
  rank_bytes=$(inter_bytes_total "h${hosts}_row_on_two")
  summary+=("$hosts hosts x 2, row-wise: rank 0's inter-node bytes over the run: two_hop $rank_bytes, two_hop + node dedup $node_bytes; node dedup vs 1 rank: $near")
  cluster_stop
  unset CLUSTER_DIR
done

# Uneven: 2 ranks on node1, 1 on node2.
cluster_start 2
cluster_small_data "$build" "$CLUSTER_SHARED/data"
run uneven node1:2,node2:1 --exchange two_hop --dedup node
grep -q "^ncf_dist: exchange: flat (two_hop asked, two-hop impossible: unequal ranks per node (node 0 has 2, node 1 has 1); node dedup off" \
  "$CLUSTER_SHARED/uneven.out" ||
  fail "the uneven layout did not fall back with its reason: $(grep 'exchange:' "$CLUSTER_SHARED/uneven.out")"

echo "$name: ok"
for s in "${summary[@]}"; do echo "$name:   $s"; done
