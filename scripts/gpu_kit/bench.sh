# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: `run bench`: throughput, time to quality, the kernels, MPI
# and NCCL training.

# ---- bench ---------------------------------------------------------------------------------------------
m20=""
do_m20_data() {
  [ -f "$m20/metadata.json" ] && { echo "have $m20"; return 0; }
  ours "$build/src/ncf_prep" --synthetic ml-20m --output "$m20"
}
train_m20() {  # NAME ARGS...: ncf_dist on the synthetic ml-20m set; metrics into $out/NAME.jsonl
  local name=$1
  shift
  rm -f "$out/$name.jsonl"
  ours "$@" --data_dir "$m20" --preset ml-20m-mlperf --device cuda --progress off \
    --metrics_json "$out/$name.jsonl"
}
fig_thr() { jsonl_fig "$out/$(basename "$1" .log).jsonl" throughput; }
fig_ttq() { jsonl_fig "$out/$(basename "$1" .log).jsonl" ttq; }
do_kernels() { ours "$build/bench/bench_kernels" --device cuda --json "$out/kernels.json"; }
fig_kernels() {
  [ -s "$out/kernels.json" ] || return 0
  python3 "$root/scripts/gpu_kit/fig_kernels.py" "$out/kernels.json"
}
mpirun_args=(--oversubscribe --bind-to none --mca btl '^openib,ofi' --mca pml ob1
  --mca btl_vader_single_copy_mechanism none)

run_bench() {
  built || { record bench FAIL "no build in $build" 0; return 0; }
  if [ "$have_gpu" = 1 ] && ! cuda_built; then
    record bench FAIL "the build in $build has no CUDA backend" 0
    return 0
  fi
  stage bench_kernels 1 120 fig_kernels -- do_kernels
  if [ "$have_gpu" = 1 ]; then
    stage data_ml20m 0 240 fig_tail -- do_m20_data
  else
    record data_ml20m "no GPU" "only the GPU runs read it" 0
  fi
  local p precisions=()
  read -r -a precisions <<<"${NCF_KIT_PRECISIONS:-tf32 bf16}"
  for p in "${precisions[@]}"; do
    stage "train_${p}_throughput" 1 150 fig_thr -- train_m20 "train_${p}_throughput" \
      "$build/src/ncf_dist" --precision "$p" --train_epochs 3 --no_eval
  done
  for p in "${precisions[@]}"; do
    stage "train_${p}_ttq" 1 240 fig_ttq -- train_m20 "train_${p}_ttq" "$build/src/ncf_dist" \
      --precision "$p" --train_epochs "${NCF_KIT_TTQ_EPOCHS:-20}" --hr_threshold 0.635 --mlperf_log
  done
  stage shared_mpi_w2 1 180 fig_thr -- train_m20 shared_mpi_w2 env CUDA_VISIBLE_DEVICES=0 \
    "$(command -v mpirun)" -np 2 "${mpirun_args[@]}" "$build/src/ncf_dist" --comm mpi \
    --train_epochs 2 --no_eval
  if [ "$have_gpu" = 1 ] && [ "$num_gpus" -lt 2 ]; then
    record nccl_multi_gpu skipped "one rank per GPU over NCCL needs >= 2 GPUs, nvidia-smi lists $num_gpus" 0
  else
    stage nccl_multi_gpu 1 180 fig_thr -- train_m20 nccl_multi_gpu "$(command -v mpirun)" \
      -np "$num_gpus" "${mpirun_args[@]}" "$build/src/ncf_dist" --comm nccl --train_epochs 2 --no_eval
  fi
  stage pytorch_neumf 1 240 fig_pytorch -- do_pytorch 1048576
}
