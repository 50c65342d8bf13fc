# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: Nsight Compute and Nsight Systems: the profile stages of
# `run tests` and `run step`.

# One profile of ml-20m-mlperf steps: --step_log splits each step into its phases
# (exchanges, tower, allreduce, update) with the bytes moved; then Nsight Compute, when
# the machine has it, over the kernels of two steps (summary per kernel).
do_profile_steps() {
  ours "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --train_epochs 1 --max_steps 30 --no_eval --step_log --progress off
}
ncu_path() {  # Nsight Compute: on PATH, else in the CUDA toolkit; empty when neither
  local ncu
  ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
  [ ! -x "$ncu" ] || echo "$ncu"
}
do_profile_kernels() {
  local ncu
  ncu="$(ncu_path)"
  [ -n "$ncu" ] || { echo "no ncu on this machine"; return 0; }
  ours "$ncu" --target-processes all --launch-count 400 --print-summary per-kernel \
    "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --train_epochs 1 --max_steps 2 --no_eval --progress off
}
do_step_ncu() {  # PRECISION: Nsight Compute's duration of every kernel of 2 steps, the GPU's
  # own clocks (ncu locks them to base otherwise: 1.5 of 1.98 GHz on an H200)
  local ncu
  ncu="$(ncu_path)"
  [ -n "$ncu" ] || { echo "no ncu on this machine"; return 0; }
  ours "$ncu" --target-processes all --clock-control none --section SpeedOfLight \
    --launch-count 600 --print-summary per-kernel \
    "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --precision "$1" --train_epochs 1 --max_steps 2 --no_eval --progress off \
    >"$out/step_ncu_$1.txt" || return 1
  theirs python3 "$root/bench/ncu_kernel_table.py" --steps 2 "$out/step_ncu_$1.txt"
}
do_eval_ncu() {  # PRECISION: Nsight Compute's duration of 150 consecutive kernel launches from
  # the middle of an ml-20m evaluation by items (eval batch 1,000,000 candidates: launches
  # 300-449, past the one training step and the items' preparation), at the GPU's own clocks;
  # where an evaluation's time goes (the table's "per step" is per those 150 launches)
  local ncu
  ncu="$(ncu_path)"
  [ -n "$ncu" ] || { echo "no ncu on this machine"; return 0; }
  ours "$ncu" --target-processes all --clock-control none --section SpeedOfLight \
    --launch-skip 300 --launch-count 150 --print-summary per-kernel \
    "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --precision "$1" --train_epochs 1 --max_steps 1 --eval_batch_size 1000000 --progress off \
    >"$out/eval_ncu_$1.txt" || return 1
  theirs python3 "$root/bench/ncu_kernel_table.py" --steps 1 "$out/eval_ncu_$1.txt"
}
fig_step_ncu() {
  { grep -m1 '^# .* kernels' "$1" | cut -c3-
    grep -E '^ +[0-9.]+ ms/step' "$1" | head -n 3 |
      awk '{printf "%s ms (%s HBM) %s\n", $1, $7, substr($0, index($0, "% HBM  ") + 7, 40)}'; } |
    paste -s -d ';' | sed 's/;/; /g'
}
do_step_ncu_top() {  # the fused top's two kernels of step 2 in depth (memory, warp stalls,
  # occupancy), on FP32 and on BF16 storage: why the BF16 ones, moving fewer bytes, take longer
  local ncu p
  ncu="$(ncu_path)"
  [ -n "$ncu" ] || { echo "no ncu on this machine"; return 0; }
  for p in tf32 bf16; do
    echo "## $p"
    ours "$ncu" --target-processes all --clock-control none --kernel-name regex:neumf_top \
      --launch-skip 2 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
      "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
      --precision "$p" --train_epochs 1 --max_steps 3 --no_eval --progress off || return 1
  done
}
fig_step_ncu_top() {
  awk '/^## /{p=$2} /neumf_top_(forward|backward)_kernel/{k=($0 ~ /forward/) ? "fwd" : "bwd"}
    /^ +Duration +[a-z]+ /{printf "%s %s %s %s; ", p, k, $(NF), $2}' "$1" | cut -c1-200
}
do_eval_ncu_fused() {  # evaluation's scoring in one kernel (NCF_EVAL_FUSED=1, bf16) in depth:
  # two batches' launches of score_items_kernel (tensor pipes, memory, warp stalls, occupancy)
  local ncu
  ncu="$(ncu_path)"
  [ -n "$ncu" ] || { echo "no ncu on this machine"; return 0; }
  ours env NCF_EVAL_FUSED=1 "$ncu" --target-processes all --clock-control none \
    --kernel-name regex:score_items_kernel --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --precision bf16 --train_epochs 1 --max_steps 1 --eval_batch_size 1000000 --progress off
}
fig_eval_ncu_fused() {
  awk '/^ +Duration +[a-z]+ /{printf "duration %s %s; ", $(NF), $2}
    /^ +(Memory|Compute \(SM\)) Throughput +%/{printf "%s %s%%; ", $1, $(NF)}' "$1" | cut -c1-200
}
do_step_nsys() {
  local nsys
  nsys="$(command -v nsys || true)"
  [ -n "$nsys" ] || { echo "no nsys on this machine"; return 0; }
  ours "$nsys" profile --force-overwrite true -o "$out/step_nsys" --stats=false \
    "$build/src/ncf_dist" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --train_epochs 1 --max_steps 12 --no_eval --progress off >/dev/null &&
    theirs "$nsys" stats --report cuda_gpu_kern_sum --format csv "$out/step_nsys.nsys-rep" |
    head -n 20
}
