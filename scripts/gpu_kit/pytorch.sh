# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: PyTorch on the same GPU: pytorch_neumf (`run bench`) and
# pytorch_variants (`run step`).

do_pytorch() {
  local bs=$1
  theirs python3 "$root/scripts/gpu_kit/pytorch_neumf_gpu.py" "$root/bench/pytorch_neumf.py" \
    "$m20/metadata.json" "$bs"
}
fig_pytorch() {
  python3 "$root/scripts/gpu_kit/fig_pytorch.py" "$1" "$out/train_tf32_throughput.jsonl"
}
# PyTorch on the same GPU, data, batch and epochs as step_hr_ours: bench/pytorch_variants.py
# trains eager_*, compile_fwd_* and expert_* (each under tf32 and bf16 autocast) for 3 epochs
# on one sample stream built once on the GPU, evaluates every epoch, and names the fastest
# variant per precision whose HR@10 is within 0.01 of eager_tf32's. Time, estimated from the
# 2026-11-27 H200 run (eager 14-16 ms a step, the compiled forward 7-11 ms; an ml-20m
# evaluation 1.5 s; the data read in 3 s): about 15 s to start, read the data and draw the 3
# epochs' samples; per variant 3 x (95 steps + one evaluation) = 7-10 s; compilation about
# 15 s per compiled forward and 30-60 s per expert (forward, backward, optimizer step, CUDA
# graph capture): 140-220 s in all. The limit, 300 s, is cut to what the budget has left.
do_pytorch_variants() {
  rm -f "$out/pytorch_variants.jsonl"
  # The machine's Python has protobuf but neither protoc nor crcmod (seen on an H200,
  # 2026-11-27): the record module comes from the kit's protoc, and without crcmod the
  # CRC-32Cs go unchecked here; ncf_dist checked every one of these files (step_hr_ours).
  local pb2="$build/kit-pb2" extra=()
  mkdir -p "$pb2"
  ours protoc --proto_path="$root/src/data" --python_out="$pb2" ncf_record.proto
  extra+=(--record_module_dir "$pb2")
  if ! theirs python3 -c 'import crcmod.predefined' 2>/dev/null; then
    echo "no crcmod in this Python: --skip_crc (ncf_dist read the same files with their CRCs)"
    extra+=(--skip_crc)
  fi
  # --eval_batch_size: 1,000 users' lists a batch instead of 100, 139 batches an evaluation
  # instead of 1,385, each with its two host syncs (the same HR and NDCG; 18 evaluations)
  theirs python3 "$root/bench/pytorch_variants.py" --data_dir "$m20" --preset ml-20m-mlperf \
    --device cuda --epochs 3 --eval_batch_size 1000000 \
    --metrics_json "$out/pytorch_variants.jsonl" "${extra[@]}"
}
# The variants (median-step samples/s, last HR@10, whether it counts), then ncf_dist against
# the fastest counting variant per precision: ncf_dist's median step of steps 10-40 in
# step_{tf32,bf16}_streaming (as fig_step_train reads it) against that variant's median step.
# ncf_dist's step draws its negatives; PyTorch's samples were drawn before the epoch, so the
# ratio favours PyTorch by ncf_dist's sampling time (about 0.1 ms of a 5-7 ms step).
fig_pytorch_variants() {
  python3 "$root/scripts/gpu_kit/fig_pytorch_variants.py" "$out/pytorch_variants.jsonl" "$1" \
    "$out/step_tf32_streaming.log" "$out/step_bf16_streaming.log" "$out/step_hr_ours.jsonl"
}
