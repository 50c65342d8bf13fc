# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: NCCL on one GPU: the checkpoint resume, several ranks
# sharing the GPU, the stalled peer, the two-hop exchange (`run step`).

do_nccl_resume() {  # a checkpoint of 4 NCCL ranks on the GPU resumed by 1 GPU rank and 2 CPU ranks
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_train_gpu" --gtest_brief=1 \
    --gtest_filter='TrainGpu.ANcclCheckpointResumesOnOneGpuRankAndOnTwoCpuRanks'
}
fig_ctest_filter() { grep -hE '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' ' | cut -c1-200; }
# Several NCCL ranks on the one GPU (issue: NCCL refuses two ranks with the same host hash
# and PCI bus id; a host id of each rank's own, NCCL_HOSTID, should make them look like
# ranks of different hosts that talk over sockets on loopback): bench_nccl_share checks an
# allreduce and a send/recv ring; --same_host records NCCL's refusal without the ids.
do_nccl_share() {  # W [--same_host]
  ours env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$(command -v mpirun)" -np "$1" \
    "${mpirun_args[@]}" "$build/bench/bench_nccl_share" --floats 4194304 "${@:2}"
}
do_nccl_refusal() {  # the same without the ids: NCCL's words, recorded, not a failure
  do_nccl_share 2 --same_host || echo "exit $? (NCCL refuses ranks on one GPU of one host)"
}
do_nccl_dist() {  # W: ncf_dist over NCCL with W ranks on the one GPU, one NCCL_HOSTID each
  # shellcheck disable=SC2016  # expanded by each rank's sh
  ours env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 "$(command -v mpirun)" -np "$1" \
    "${mpirun_args[@]}" sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
    "$build/src/ncf_dist" --device cuda --comm nccl --data_dir "$data/small" --train_epochs 2 \
    --progress off
}
# Two NCCL ranks on the GPU (one NCCL_HOSTID each); rank 1 is stopped (SIGSTOP) in its
# 20th step. Rank 0 must end within --peer_timeout 20 + 10 s, naming its rank, host and
# the collective it waited in (the NCCL communicator's stalled-collective check; the
# peer watch is off, so that it is this path that ends it).
do_nccl_stop() {
  local log="$out/nccl_stop.out" pid p r1="" t0 rc=0
  # shellcheck disable=SC2016  # expanded by each rank's sh
  ours env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 "$(command -v mpirun)" -np 2 \
    "${mpirun_args[@]}" sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
    "$build/src/ncf_dist" --device cuda --comm nccl --data_dir "$data/small" --train_epochs 1000 \
    --step_log --progress off --peer_timeout 20 --peer_lost_after 0 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 900); do
    grep -q '^ *step 20:' "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  for p in $(pgrep -f "$build/src/ncf_dist"); do
    # (grep reads a process substitution: in a pipe, its early exit on a match could cut tr
    # off with SIGPIPE, which pipefail would count against the match.)
    grep -qx 'OMPI_COMM_WORLD_RANK=1' < <(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) && r1=$p
  done
  if [ -z "$r1" ]; then
    echo "rank 1 not found (the run: $(tail -n 3 "$log" | tr '\n' ' '))"
    kill "$pid" 2>/dev/null
    return 1
  fi
  kill -STOP "$r1"
  t0=$(date +%s)
  while kill -0 "$pid" 2>/dev/null && [ $(($(date +%s) - t0)) -lt 90 ]; do sleep 1; done
  kill -KILL "$r1" 2>/dev/null
  kill -CONT "$r1" 2>/dev/null
  wait "$pid" || rc=$?
  grep -h 'ncf_dist: error' "$log" | head -n 4
  echo "rank 1 stopped: the launcher exited $rc after $(($(date +%s) - t0)) s (limit 20 + 10 s)"
  grep -q '^ncf_dist: error: \[rank 0 on .*waited .* in NCCL ' "$log" &&
    [ $(($(date +%s) - t0)) -le 30 ]
}
# Four NCCL ranks on the GPU in 2 declared nodes of 2 (--topology ranks_per_node=2, one
# NCCL_HOSTID each): two_hop must end with flat's parameters byte for byte, --dedup node
# must repeat itself; the figure names NCCL's version and the transport it chose.
do_nccl_two_hop() {
  local tag rc=0 d="$out/nccl_two_hop"
  mkdir -p "$d"
  for tag in flat two node_a node_b; do
    local flags=(--shard_plan row --dedup on --exchange flat)
    case $tag in
      two) flags=(--shard_plan row --dedup on --exchange two_hop) ;;
      node_*) flags=(--shard_plan row --dedup node --exchange two_hop) ;;
    esac
    # shellcheck disable=SC2016  # expanded by each rank's sh
    ours env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
      "$(command -v mpirun)" -np 4 "${mpirun_args[@]}" \
      sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
      "$build/src/ncf_dist" --device cuda --comm nccl --data_dir "$data/small" --train_epochs 2 \
      --progress off --topology ranks_per_node=2 "${flags[@]}" --save_params "$d/$tag.bin" \
      >"$d/$tag.out" 2>&1 || { echo "$tag: exit $?: $(grep -h 'error' "$d/$tag.out" | head -n 2)"; rc=1; }
    grep -h '^ncf_dist: \(nodes\|exchange\):' "$d/$tag.out" | sed "s/^/$tag: /" | cut -c1-160
  done
  if cmp -s "$d/flat.bin" "$d/two.bin"; then
    echo "fig: two_hop's parameters are flat's byte for byte"
  else
    echo "fig: two_hop's parameters differ from flat's"
    rc=1
  fi
  if cmp -s "$d/node_a.bin" "$d/node_b.bin"; then
    echo "fig: node dedup repeats itself"
  else
    echo "fig: two node dedup runs differ"
    rc=1
  fi
  echo "fig: $(grep -ohE 'NCCL version [0-9.+a-z]*|via (NET/[A-Za-z]+|P2P[^ ]*|SHM[^ ]*)' \
    "$d/two.out" | sort -u | paste -s -d ' ')"
  return "$rc"
}
fig_nccl_two_hop() { grep -h '^fig: ' "$1" | cut -c6- | paste -s -d ';' | cut -c1-220; }
fig_nccl_share() {
  { grep -h '^bench_nccl_share: NCCL' "$1" | tail -n 1
    grep -ohE 'via (NET/[A-Za-z]+|P2P[^ ]*|SHM[^ ]*)' "$1" | sort -u | paste -s -d ' '
    grep -hE 'Duplicate GPU|ncclCommInitRank: ' "$1" | head -n 1; } | paste -s -d ';' | cut -c1-220
}
