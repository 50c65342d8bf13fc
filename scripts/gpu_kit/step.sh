# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: `run step`: the GPU step's kernels, old against new, and
# the stage order of `run step`.

# ---- step ------------------------------------------------------------------------------------------------
# The GPU step's kernels, old against new, in one call of about 6 minutes after the build:
# first what shows a broken kernel (the parity of the changed ops, the streaming kernels
# and the BF16 copies against their CPU twins bit for bit, NeuMF's fused top against the
# unfused ops, the BF16-storage ops and NeuMF on them against the CPU, two identical runs),
# then the speed (the changed ops at B = 1,048,575; the kernel versions that lost, each
# beside the library's (bench/kernels/); ncf_dist ml-20m-mlperf steps 10-40 under tf32 and
# bf16, each against bench/step_floor.py's floor, and the variants still selectable; an epoch's
# samples/s; the top kernels per step), then ncf_dist's HR@10 after 3 epochs and PyTorch's
# variants (bench/pytorch_variants.py) on the same GPU, data, batch and epochs.
step_parity_filter="${NCF_KIT_STEP_PARITY_FILTER:-Parity.StreamingStepKernelsAreTheCpuTwinsBitForBit:Parity.Bf16CopiesAreTheCpuRoundingBitForBit:Parity.Bf16StorageOpsTrackTheCpuTwins:Parity.TopOnBf16StorageIsTheFp32TopOfTheSameValuesOnTheGpu:Parity.NeuMFOnBf16StorageTracksTheCpuAndRepeatsItself:Parity.GemmBf16*:Parity.FusedTopIsTheUnfusedOpsOnTheGpu:Parity.HeadForwardBackward:Parity.GroupOpsForwardAndBackward:Parity.LinearBackward*:Parity.ColumnSumsAtLargeBatches:Parity.TrainStep*:Parity.GatherBiasActIsTheCpuTwinBitForBit:Parity.GatherRowsExactWithDuplicates:Parity.DenseAdamOverSteps:Parity.ReduceUpdateRowsEveryOptimizer:Parity.Bf16MaskAndGroupSumAtEveryWidthAreTheCpuTwinsBitForBit:Parity.Layer0BitMaskIsTheGpuOutputsSignAndMasksAsYDoes:Parity.LinearBackwardMasksDxByTheLayerBelowsBitsOnTheGpu:Parity.ScoreItemsTracksTheCpuTwinAndForward:Parity.FusedScoreItemsTracksTheOpsItFuses:Parity.NeuMFScoresItemsInOneKernelWhereAsked:Parity.HitNdcgAccumulateAddsEachBatchsSumsOnTheDevice:Parity.TopForwardReadsItemRowsByIdAsGatheredOnTheGpu:Parity.Layer0ByItemOpsAreTheCpuTwinsBitForBit:Parity.NeuMFLayer0ByItemTracksTheCpuAndRepeatsItself:Parity.NegativesBitIdenticalToCpu:Parity.NarrowItemLookupStepIsTheWholeRowStepBitForBit:Parity.DenseAdamGivenColumnsAreTheirFirstRowSums:Parity.BadRowLeavesTablesAloneWithEveryOptimizer}"
# The staged copies (training positives, evaluation lists) and a GPU run's metrics
# against a CPU run's.
step_pipeline_filter="PipelineGpu.*Stager*"
step_train_filter="TrainGpu.CudaFollowsTheCpuTrajectory:TrainGpu.CudaBf16TracksTheCpuBf16Run:TrainGpu.GraphStepsAreTheEagerStepsBitForBit"
do_step_parity() {
  local rc=0
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_parity_gpu" --gtest_brief=1 \
    --gtest_filter="$step_parity_filter" || rc=1
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_pipeline_gpu" --gtest_brief=1 \
    --gtest_filter="$step_pipeline_filter" || rc=1
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_train_gpu" --gtest_brief=1 \
    --gtest_filter="$step_train_filter" || rc=1
  return "$rc"
}
do_lt_probe() {  # what cuBLASLt offers for the tower's fused epilogues (nothing timed)
  ours "$build/bench/bench_lt_probe" --batch 1048575 --json "$out/lt_probe.jsonl"
}
do_step_kernels() {
  ours "$build/bench/bench_kernels" --device cuda --warmup 2 --repeats 10 \
    --filter "group_bias_act,group_sum_backward,linear_backward L,neumf_top,neumf_fwd_bwd_grouped,score_items" --json "$out/step_kernels.json"
}
fig_step_kernels() {
  [ -s "$out/step_kernels.json" ] || return 0
  python3 "$root/scripts/gpu_kit/fig_step_kernels.py" "$out/step_kernels.json"
}
# The kernel versions that lost, each program of bench/kernels/ (its versions checked
# against a CPU loop, then timed beside the library's) at a tenth of the step's shapes:
# a few seconds in all. A program and its size flags per entry.
kernel_versions=("group_sum --n 20971" "group_bias_act --n 20971"
  "linear_bias_mask --rows 104857" "to_bf16 --rows 104857")
do_kernel_versions() {
  local rc=0 p
  for p in "${kernel_versions[@]}"; do
    # shellcheck disable=SC2086  # the program's name and flags, one word each
    ours "$build/bench/kernels/"$p --warmup 2 --repeats 10 || rc=1
  done
  return "$rc"
}
fig_kernel_versions() {  # each case's median ms per version, from its "= CASE: v1 X ms, v2 Y ms"
  grep -E '^= ' "$1" | sed -E 's/^= //; s/ [A-Za-z]+=[^:]*:/:/; s/ ms//g; s/,//g; s/: / /' |
    paste -s -d ';' | sed 's/;/; /g; s/^/ms: /' | cut -c1-240
}
do_step_train() {  # PRECISION [FLAGS...]: 40 ml-20m-mlperf steps, each one's phases on its line
  ours "$build/src/ncf_dist" --data_dir "$m20" \
    --preset ml-20m-mlperf --device cuda --precision "$1" --train_epochs 1 --max_steps 40 \
    --no_eval --step_log --progress off "${@:2}"
}
do_step_train_env() {  # "VAR=VALUE ..." PRECISION [FLAGS...]: do_step_train with those variables
  local vars=$1
  shift
  # shellcheck disable=SC2086,SC2163  # one word per variable, each exported
  (export $vars && do_step_train "$@")
}
fig_step_train() {  # the median over steps 10-40 of exchange + compute + allreduce, vs the floor
  local precision gpu med
  precision=$(basename "$1" .log | cut -d_ -f2)
  med=$(python3 "$root/scripts/gpu_kit/fig_step_train.py" "$1")
  [ -n "$med" ] || { echo "no step lines"; return 0; }
  read -r ms samples steps <<<"$med"
  gpu=$(theirs nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  echo "median step $ms ms over $steps steps = $(python3 -c "print(f'{$samples / $ms / 1e3:.1f}')") M samples/s; $(python3 "$root/bench/step_floor.py" --gpu "${gpu:-H200}" --precision "$precision" --batch "$samples" --measured_ms "$ms" 2>&1)"
}
# HR@10 after 3 epochs of ncf_dist on the GPU (the figure: the last epoch's HR@10), the
# figure pytorch_variants' HR@10 is held to.
do_step_hr_ours() {
  train_m20 step_hr_ours "$build/src/ncf_dist" --precision tf32 --train_epochs 3
}
fig_step_hr() {
  python3 "$root/scripts/gpu_kit/fig_step_hr.py" "$out/step_hr_ours.jsonl"
}
run_step() {
  built || { record step FAIL "no build in $build" 0; return 0; }
  # First what decides the step's next kernels (parity, the kernels side by side, the
  # step, where its time goes, the peer, quality, evaluation), then the NCCL checks on
  # one GPU (socket transport: slow), which a short window can skip.
  stage step_parity 1 150 fig_parity -- do_step_parity
  stage lt_probe 1 30 fig_tail -- do_lt_probe
  stage data_small 0 120 fig_tail -- do_small_data
  stage determinism 1 120 fig_tail -- do_determinism
  stage step_kernels 1 150 fig_step_kernels -- do_step_kernels
  stage kernel_versions 1 60 fig_kernel_versions -- do_kernel_versions
  stage data_ml20m 0 240 fig_tail -- do_m20_data
  local p
  # step_PRECISION_streaming: the step as it runs (the name kept from when the legacy
  # kernels ran beside it)
  for p in tf32 bf16; do
    stage "step_${p}_streaming" 1 90 fig_step_train -- do_step_train "$p"
  done
  # each step after the first as one CUDA graph (--cuda_graph on), against streaming above
  for p in tf32 bf16; do
    stage "step_${p}_graph" 1 90 fig_step_train -- do_step_train "$p" --cuda_graph on
  done
  # The step's other variants, each as step_PRECISION_NAME:
  #   whole_rows   (NCF_NARROW_ITEM_LOOKUP=0, not yet measured against the default) the
  #                samples' item rows looked up and their gradients reduced whole, as
  #                before layer 0 read its runs' MLP columns from the item table and handed
  #                the update their gradient by item
  #   by_sample    (--layer0_by_item off, what CPU ranks run) layer 0's items' half once
  #                per sample, the path layer 0 by item replaced on GPU ranks
  for p in tf32 bf16; do
    stage "step_${p}_whole_rows" 1 90 fig_step_train -- \
      do_step_train_env NCF_NARROW_ITEM_LOOKUP=0 "$p"
  done
  for p in tf32 bf16; do
    stage "step_${p}_by_sample" 1 90 fig_step_train -- do_step_train "$p" --layer0_by_item off
  done
  for p in tf32 bf16; do
    stage "train_${p}_throughput" 1 120 fig_thr -- train_m20 "train_${p}_throughput" \
      "$build/src/ncf_dist" --precision "$p" --train_epochs 2 --no_eval
  done
  stage step_nsys 1 120 fig_tail -- do_step_nsys
  for p in tf32 bf16; do
    stage "step_ncu_$p" 1 90 fig_step_ncu -- do_step_ncu "$p"
  done
  stage step_ncu_top 1 90 fig_step_ncu_top -- do_step_ncu_top
  # the evaluation's time (a few seconds each) before the peer's long stages
  for p in tf32 bf16; do
    stage "eval_speed_$p" 1 120 fig_eval_speed -- do_eval_speed "$p"
  done
  stage eval_ncu_fused 1 90 fig_eval_ncu_fused -- do_eval_ncu_fused
  stage eval_ncu_bf16 1 90 fig_step_ncu -- do_eval_ncu bf16
  stage step_hr_ours 1 120 fig_step_hr -- do_step_hr_ours
  stage pytorch_variants 1 300 fig_pytorch_variants -- do_pytorch_variants
  stage nccl_resume 1 120 fig_ctest_filter -- do_nccl_resume
  stage nccl_share_w2 1 60 fig_nccl_share -- do_nccl_share 2
  stage nccl_share_same_host 1 60 fig_nccl_share -- do_nccl_refusal
  stage nccl_dist_w2 1 120 fig_tail -- do_nccl_dist 2
  stage nccl_stop_w2 1 150 fig_tail -- do_nccl_stop
  stage nccl_two_hop_2x2 1 180 fig_nccl_two_hop -- do_nccl_two_hop
}
