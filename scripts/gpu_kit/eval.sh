# shellcheck shell=bash
# scripts/gpu_kit.sh, sourced: the evaluation's speed (`run step`).
# shellcheck disable=SC2317  # most functions run indirectly, through stage and limited

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
  NCF_EVAL_ITEMS=0 train_m20 "eval_${p}_b1000000_per_sample" "$build/src/ncf_dist" \
    --precision "$p" --train_epochs 2 --max_steps 2 --eval_batch_size 1000000 || return
  # BF16 storage: each batch scored in one kernel (NCF_EVAL_FUSED=1) against the ops above
  if [ "$p" = bf16 ]; then
    NCF_EVAL_FUSED=1 train_m20 "eval_${p}_b1000000_fused" "$build/src/ncf_dist" \
      --precision "$p" --train_epochs 2 --max_steps 2 --eval_batch_size 1000000 || return
  fi
  # where the time goes: each phase ends with a device wait (slower, but split)
  NCF_EVAL_PHASES=1 train_m20 "eval_${p}_b1000000_phases" "$build/src/ncf_dist" \
    --precision "$p" --train_epochs 2 --max_steps 2 --eval_batch_size 1000000
}
fig_eval_speed() {
  local p
  p=$(basename "$1" .log)
  p=${p#eval_speed_}
  { python3 - "$out/eval_${p}_b100000.jsonl" "$out/eval_${p}_b1000000.jsonl" \
    "$out/eval_${p}_b1000000_per_sample.jsonl" "$out/eval_${p}_b1000000_fused.jsonl" <<'EOF'
import json, sys
def secs(path, line):
    try:
        return json.loads(open(path).read().splitlines()[line])["eval_seconds"]
    except Exception:
        return None
fmt = lambda x: f"{x:.3f} s" if x is not None else "no metrics"
def both(path):  # the first evaluation (lists read), then the second (lists kept)
    return f"{fmt(secs(path, 0))} / kept {fmt(secs(path, 1))}"
print(f"one evaluation by items: {both(sys.argv[1])} at --eval_batch_size 100000, "
      f"{both(sys.argv[2])} at 1000000; per sample at 1000000: {both(sys.argv[3])}")
def hr(path):
    try:
        return [json.loads(l)["hr"] for l in open(path).read().splitlines()]
    except Exception:
        return None
fused = hr(sys.argv[4])
if fused is not None:  # bf16 only: the one kernel against the ops one by one
    print(f"in one kernel (NCF_EVAL_FUSED=1) at 1000000: {both(sys.argv[4])}; "
          f"HR@10 {fused} against the ops' {hr(sys.argv[2])}")
EOF
  grep 'eval phases' "$1" | tail -1 | sed 's/.*after each)://; s/^/kept lists, phases at 1000000:/' ||
    true; } |
    paste -s -d '|' | sed 's/|/; /g'
}
