# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: the evaluation's speed (`run step`).

# Evaluation speed: one ml-20m evaluation (138,493 users x 1 + 999) after 2 steps, at
# the default --eval_batch_size (100 users a batch, blocking copies around each) and at
# 10x that, under PRECISION; the figure puts the two side by side.
do_eval_speed() {  # by items at two batch sizes, then the per-sample path at the larger;
  # two epochs each: the first evaluation reads the lists, the second scores them as kept
  # on the device
  local p=$1 bs
  for bs in 100000 1000000; do
    train_m20 "eval_${p}_b$bs" "$build/src/ncf_dist" --precision "$p" --train_epochs 2 \
      --max_steps 2 --eval_batch_size "$bs" || return
  done
  train_m20 "eval_${p}_b1000000_per_sample" "$build/src/ncf_dist" --eval_scoring per_sample \
    --precision "$p" --train_epochs 2 --max_steps 2 --eval_batch_size 1000000 || return
  # BF16 storage: each batch scored in one kernel (NCF_EVAL_FUSED=1) against the ops above
  if [ "$p" = bf16 ]; then
    NCF_EVAL_FUSED=1 train_m20 "eval_${p}_b1000000_fused" "$build/src/ncf_dist" \
      --precision "$p" --train_epochs 2 --max_steps 2 --eval_batch_size 1000000 || return
  fi
  # where the time goes: each phase ends with a device wait (slower, but split)
  train_m20 "eval_${p}_b1000000_phases" "$build/src/ncf_dist" --eval_phases \
    --precision "$p" --train_epochs 2 --max_steps 2 --eval_batch_size 1000000
}
fig_eval_speed() {
  local p
  p=$(basename "$1" .log)
  p=${p#eval_speed_}
  { python3 "$root/scripts/gpu_kit/fig_eval_speed.py" \
    "$out/eval_${p}_b100000.jsonl" "$out/eval_${p}_b1000000.jsonl" \
    "$out/eval_${p}_b1000000_per_sample.jsonl" "$out/eval_${p}_b1000000_fused.jsonl"
  grep 'eval phases' "$1" | tail -1 | sed 's/.*after each)://; s/^/kept lists, phases at 1000000:/' ||
    true; } |
    paste -s -d '|' | sed 's/|/; /g'
}
