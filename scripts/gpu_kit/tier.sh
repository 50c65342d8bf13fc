# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: `run tier`: the host tier (--device_table_budget) on the GPU.
# Its parity tests (the copy, map and rounding kernels, a collection with a 30% cache and one
# of a step's rows against the all-on-device one), NCCL ranks with a tier against the same
# ranks without one, then BF16 rows with row-wise Adagrad on the
# synthetic ml-20m set without a budget and at 100% and 90% of its rows, and on a synthetic
# table of NCF_KIT_TIER_USERS users (30,000,000; 2.5 interactions each) without a budget and
# at 25% and 5%: samples/s, the cache's loads and waits per step, the copy rates, and the
# losses against the all-on-device run's; then the bookkeeping of that table's step alone, on
# one CPU thread and on all (no GPU needed). ml-20m-mlperf's step (1,048,576 samples) touches
# about 102,000 of ml-20m's 165,237 rows (62%, measured on CPU ranks): no budget below that
# holds one step (ncf_dist refuses it), and at 90% each step loads what the last evicted.

tier_parity_filter="Parity.TierOpsExact:Parity.StoreRowsBf16AtExact:Parity.HostTierCollectionIsTheAllOnDeviceOneBitForBit"
do_tier_parity() {
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_parity_gpu" --gtest_brief=1 \
    --gtest_filter="$tier_parity_filter"
}
# NCCL ranks on the one GPU with a host tier: W = 2 flat (the announced ids over MPI on the
# host, no wait for the device) and W = 4 two-hop (through device staging), each against
# the same ranks without a budget, to the bit; and W = 2 under auto where only one rank's
# tables do not fit (both ranks take the tier).
do_tier_nccl() {
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_train_gpu" --gtest_brief=1 \
    --gtest_filter='TrainGpu.NcclRanksWithAHostTierGiveTheBitsOfTheAllOnDeviceRun:TrainGpu.NcclRanksTakeTheHostTierTogetherUnderAuto'
}
tier_flags=(--precision bf16 --table_dtype bf16 --embedding_optimizer rowwise_adagrad
  --train_epochs 1 --no_eval --device cuda --progress off)
# tier_train DATA NAME STEPS [FLAGS...]: one epoch of STEPS steps; metrics into $out/NAME.jsonl
tier_train() {
  local d=$1 name=$2 steps=$3
  shift 3
  rm -f "$out/$name.jsonl"
  ours "$build/src/ncf_dist" --data_dir "$d" "${tier_flags[@]}" --max_steps "$steps" \
    --metrics_json "$out/$name.jsonl" "$@"
}
fig_tier() {
  local name ref
  name=$(basename "$1" .log)
  [ -s "$out/$name.jsonl" ] || { echo "no metrics"; return 0; }
  ref="$out/${name%_*}_all.jsonl"
  if [ "$out/$name.jsonl" != "$ref" ] && [ -s "$ref" ]; then
    python3 "$root/scripts/gpu_kit/fig_tier.py" "$out/$name.jsonl" "$ref"
  else
    python3 "$root/scripts/gpu_kit/fig_tier.py" "$out/$name.jsonl"
  fi
}
# The table's runs train without evaluation, so its eval set is the smallest there is: one
# negative a user. ncf_prep's default of 999 would write 4 KB a user, 120 GB at 3e7 users,
# more than the GPU machine's disk (at 3e6 users, 1.2 GiB in 13 s here; with one negative,
# 3e7 users take 1.8 GiB and 36 s on this machine's 2 cores).
big=""
do_big_data() {
  [ -f "$big/metadata.json" ] && { echo "have $big"; return 0; }
  local users=${NCF_KIT_TIER_USERS:-30000000}
  ours "$build/src/ncf_prep" --synthetic custom --users "$users" --items 100000 \
    --interactions $((users * 2 + users / 2)) --min_per_user 2 --eval_negatives 1 \
    --output "$big"
}

# The host tier's bookkeeping alone at the table's step (bench_row_cache: 1,258,290 ids a
# step over the table's rows, no rows copied), its passes on one thread and split over all
# of this machine's (RowCache::set_threads, as a rank alone on the machine runs them): the
# host time that each step of tier_big_25 and tier_big_5 must hide behind the GPU's.
do_host_bookkeeping() {
  local t
  for t in 1 "$(nproc)"; do
    echo "## $t thread(s)"
    ours "$build/bench/bench_row_cache" --users "${NCF_KIT_TIER_USERS:-30000000}" --items 100000 \
      --positives 209715 --negatives 4 --lookahead 2 --budgets 100,25,5 --steps 100 \
      --repeats 1 --threads "$t"
  done
}

run_tier() {
  built || { record tier FAIL "no build in $build" 0; return 0; }
  big="$data/syn-tier-${NCF_KIT_TIER_USERS:-30000000}"
  stage tier_parity 1 120 fig_parity -- do_tier_parity
  stage tier_nccl 1 180 fig_ctest_filter -- do_tier_nccl
  # The data even without a GPU, so that a rehearsal writes it as the GPU machine will.
  stage data_ml20m 0 240 fig_tail -- do_m20_data
  stage data_tier_big 0 300 fig_tail -- do_big_data
  local b
  stage tier_m20_all 1 120 fig_tier -- tier_train "$m20" tier_m20_all 300 --preset ml-20m-mlperf
  for b in 100 90; do
    stage "tier_m20_$b" 1 120 fig_tier -- tier_train "$m20" "tier_m20_$b" 300 \
      --preset ml-20m-mlperf --device_table_budget "$b%"
  done
  stage tier_big_all 1 180 fig_tier -- tier_train "$big" tier_big_all 100 --batch_size 1048576
  for b in 25 5; do
    stage "tier_big_$b" 1 180 fig_tier -- tier_train "$big" "tier_big_$b" 100 \
      --batch_size 1048576 --device_table_budget "$b%"
  done
  stage host_bookkeeping 0 150 fig_tail -- do_host_bookkeeping
}
