#!/usr/bin/env bash
# The GPU benchmark in one command, on a machine with a GPU and a built tree:
#   BUILD=build bash bench/run_gpu_benchmarks.sh [all | tests kernels train shared nccl ...]
# Records into bench/results/gpu_<UTC date>_<short commit>/, every command echoed into
# its log before it runs:
#   info.txt                    date, commit (and src/ files differing from it), nvidia-smi -L,
#                               driver, nvcc, CPU, the build directory
#   ctest_gpu.txt               ctest --test-dir $BUILD -L gpu --output-on-failure
#   kernels.txt, kernels.json   bench_kernels --device cuda: each step kernel at the ml-20m
#                               MLPerf shapes (median ms, GB/s, %peak, rate, check)
#   train_<p>_throughput.*      ncf_dist --preset ml-20m-mlperf --device cuda --precision <p>,
#                               2 epochs without eval (the 2nd is steady state), --step_log
#   train_<p>_ttq.*             time to quality: up to TTQ_EPOCHS epochs with eval, stopping
#                               at the preset's --hr_threshold (HR@10 >= 0.635)
#   shared_mpi_w2.*             2 ranks sharing GPU 0 (mpirun -np 2, --comm mpi), 2 epochs
#   nccl_w<G>.*, bench_comm_nccl_w<G>.txt
#                               one rank per GPU over NCCL, when nvidia-smi lists G >= 2 GPUs
#   summary.md                  one line per run: status, samples/s, loss, HR, time to quality
# <p> is tf32 and bf16 (bf16 only when `ncf_dist --help` offers it); PRECISIONS overrides.
# The synthetic ml-20m set (same counts as ml-20m) is made in $DATA/syn-ml-20m when missing.
# Env: BUILD (build), DATA (data), TTQ_EPOCHS (20), PRECISIONS ("tf32 bf16"), MPIRUN (mpirun).
# Exits 1 at once when no GPU is visible or the build lacks a program or the CUDA backend;
# otherwise runs every section asked for and exits 1 when any of them failed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=run_gpu_benchmarks
die() { echo "$prog: error: $*" >&2; exit 1; }

build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$root/$build"
data="${DATA:-$root/data}"
ttq_epochs="${TTQ_EPOCHS:-20}"
mpirun_bin="${MPIRUN:-mpirun}"
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(all)
for s in "${sections[@]}"; do
  case "$s" in
    all | tests | kernels | train | shared | nccl) ;;
    *) die "unknown section '$s' (all, tests, kernels, train, shared, nccl)" ;;
  esac
done
want() { [[ " ${sections[*]} " == *" all "* || " ${sections[*]} " == *" $1 "* ]]; }

# ---- preconditions: a GPU, and a CUDA build with the programs -------------------------
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver on this machine"
gpu_list="$(nvidia-smi -L 2>&1)" || die "nvidia-smi -L failed: $gpu_list"
num_gpus=$(grep -c '^GPU ' <<<"$gpu_list" || true)
[ "$num_gpus" -ge 1 ] || die "no GPU visible (nvidia-smi -L: ${gpu_list:-nothing})"
[ -d "$build" ] || die "no build directory $build (cmake -S . -B build && cmake --build build -j)"
ncf_dist="$build/src/ncf_dist" ncf_prep="$build/src/ncf_prep"
bench_kernels="$build/bench/bench_kernels" bench_comm="$build/bench/bench_comm"
for p in "$ncf_dist" "$ncf_prep" "$bench_kernels" "$bench_comm"; do
  [ -x "$p" ] || die "$p is missing: build it (cmake --build $build -j)"
done
if [ -f "$build/compile_commands.json" ] && ! grep -q NCF_WITH_CUDA "$build/compile_commands.json"; then
  die "the build in $build has no CUDA backend (configure with -DNCF_CUDA=ON and nvcc installed)"
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

commit="$(git -C "$root" rev-parse --short HEAD)"
out="$root/bench/results/gpu_$(date -u +%F)_$commit"
mkdir -p "$out"
echo "$prog: $num_gpus GPU(s); results in $out"

failures=()
# step NAME LOG CMD...: echo the command into LOG, run it (stdout and stderr into LOG and
# the terminal), note its wall time; a failure is recorded and the script goes on.
step() {
  local name=$1 log=$2 t0 t1 rc=0
  shift 2
  {
    echo "# $name"
    echo "# date: $(date -u +%FT%TZ)  commit: $commit  load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "\$ $*"
  } >>"$log"
  t0=$(date +%s.%N)
  "$@" 2>&1 | tee -a "$log" || rc=$?
  t1=$(date +%s.%N)
  echo "# exit $rc, wall $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}') s" |
    tee -a "$log"
  if [ "$rc" -ne 0 ]; then
    failures+=("$name (exit $rc, $log)")
    echo "$prog: $name FAILED (exit $rc), see $log" >&2
  fi
  return 0
}

# ---- what ran where -----------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$root" rev-parse HEAD)"
  # bench/results is left out: this run's own folder is new there.
  changed="$(git -C "$root" status --short -- src bench ':!bench/results')"
  echo "working tree: $(grep -c . <<<"$changed" || true) files under src/ and bench/ differ" \
    "from the commit"
  [ -z "$changed" ] || while IFS= read -r line; do echo "  $line"; done <<<"$changed"
  echo "build: $build ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null))"
  echo "host: $(hostname), $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')),"  \
    "$(free -g | awk '/^Mem:/{print $2}') GiB memory"
  echo "nvidia-smi -L:"
  while IFS= read -r line; do echo "  $line"; done <<<"$gpu_list"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv 2>&1 | sed 's/^/  /' || true
  echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) |
    tail -n 2 | tr '\n' ' ')"
  echo "mpirun: $("$mpirun_bin" --version 2>/dev/null | head -n 1)"
} >"$out/info.txt"
nvidia-smi -L >"$out/nvidia-smi-L.txt"
git -C "$root" rev-parse HEAD >"$out/commit.txt"
cat "$out/info.txt"

# ---- GPU tests ------------------------------------------------------------------------
if want tests; then
  rm -f "$out/ctest_gpu.txt"
  step "ctest -L gpu" "$out/ctest_gpu.txt" ctest --test-dir "$build" -L gpu --output-on-failure
fi

# ---- kernels ----------------------------------------------------------------------------
if want kernels; then
  rm -f "$out/kernels.txt"
  step "bench_kernels" "$out/kernels.txt" "$bench_kernels" --device cuda --json "$out/kernels.json"
fi

# ---- training runs ------------------------------------------------------------------------
m20="$data/syn-ml-20m"
need_data() {
  [ -f "$m20/metadata.json" ] && return 0
  mkdir -p "$data"
  step "ncf_prep synthetic ml-20m" "$out/prep.txt" "$ncf_prep" --synthetic ml-20m --output "$m20" \
    --progress off
}
# train NAME ARGS...: an ncf_dist run on the synthetic ml-20m set, NAME.txt and NAME.jsonl.
train() {
  local name=$1
  shift
  rm -f "$out/$name.txt" "$out/$name.jsonl"
  step "$name" "$out/$name.txt" "$@" --data_dir "$m20" --preset ml-20m-mlperf --device cuda \
    --progress off --metrics_json "$out/$name.jsonl"
}

precisions=()
if want train; then
  help_text="$("$ncf_dist" --help 2>&1 || true)"
  for p in ${PRECISIONS:-tf32 bf16}; do
    if grep -q -- "$p" <<<"$help_text"; then
      precisions+=("$p")
    else
      echo "$prog: ncf_dist does not offer --precision $p here: skipped" | tee -a "$out/info.txt"
    fi
  done
fi
if want train || want shared || want nccl; then need_data; fi

if want train; then
  for p in "${precisions[@]}"; do
    train "train_${p}_throughput" "$ncf_dist" --precision "$p" --train_epochs 2 --no_eval --step_log
    train "train_${p}_ttq" "$ncf_dist" --precision "$p" --train_epochs "$ttq_epochs" --mlperf_log
  done
fi

# Two ranks on one GPU: NCCL refuses that, so the collectives go through MPI on the host.
if want shared; then
  train shared_mpi_w2 env CUDA_VISIBLE_DEVICES=0 "$mpirun_bin" -np 2 --oversubscribe \
    --bind-to none "$ncf_dist" --comm mpi --train_epochs 2 --no_eval --step_log
fi

if want nccl; then
  if [ "$num_gpus" -ge 2 ]; then
    train "nccl_w$num_gpus" "$mpirun_bin" -np "$num_gpus" --oversubscribe --bind-to none \
      "$ncf_dist" --comm nccl --train_epochs 2 --no_eval --step_log
    train "nccl_w${num_gpus}_ttq" "$mpirun_bin" -np "$num_gpus" --oversubscribe --bind-to none \
      "$ncf_dist" --comm nccl --train_epochs "$ttq_epochs" --mlperf_log
    rm -f "$out/bench_comm_nccl_w$num_gpus.txt"
    step "bench_comm nccl" "$out/bench_comm_nccl_w$num_gpus.txt" "$mpirun_bin" -np "$num_gpus" \
      --oversubscribe --bind-to none "$bench_comm" --comm nccl --max_bytes 256M
  else
    echo "$prog: nccl: nvidia-smi lists $num_gpus GPU: one rank per GPU needs >= 2, skipped" |
      tee -a "$out/info.txt"
  fi
fi

# ---- summary --------------------------------------------------------------------------------
summarize() {
  echo "# GPU benchmarks, $(date -u +%F), commit $commit"
  echo
  echo "$(grep -c '^GPU ' <<<"$gpu_list") GPU(s): $(sed -n '1s/^GPU 0: //p' <<<"$gpu_list")"
  echo
  if [ -f "$out/kernels.json" ] && command -v python3 >/dev/null; then
    python3 - "$out/kernels.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
def si(x):  # 38.2 M
    for p in ["", "k", "M", "G"]:
        if abs(x) < 1000:
            return f"{x:.1f} {p}"
        x /= 1000
    return f"{x:.1f} T"
print(f"## Kernels (batch {j['batch']}, D {j['D']}, median of {j['repeats']})\n")
print("| case | shape | median ms | GB/s | % of peak | rate | check |")
print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
for c in j["cases"]:
    gbs = f"{c['gb_per_s']:.0f}" if "gb_per_s" in c else ""
    pct = f"{100 * c['fraction_of_peak']:.0f}%" if "fraction_of_peak" in c else ""
    rate = si(c["rate"]) + c["rate_unit"]
    if "tflop_per_s" in c:
        rate += f" (GEMMs {si(c['tflop_per_s'] * 1e12)}FLOP/s)"
    print(f"| {c['name']} | {c['shape']} | {c['median_ms']:.3f} | {gbs} | {pct} | {rate} | {c['check']} |")
print()
EOF
  fi
  local runs=()
  for f in "$out"/*.jsonl; do [ -e "$f" ] && runs+=("$f"); done
  if [ ${#runs[@]} -gt 0 ] && command -v python3 >/dev/null; then
    python3 - "${runs[@]}" <<'EOF'
import json, os, sys
print("## ncf_dist, synthetic ml-20m, preset ml-20m-mlperf\n")
print("| run | W | epochs | samples/s (last epoch) | loss epoch 1 | best HR@10 | HR >= 0.635 at epoch | train + eval s to it |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    if not rows:
        continue
    hit, spent = "", 0.0
    for r in rows:
        spent += r["train_seconds"] + r["eval_seconds"]
        if r["hr"] >= 0.635:
            hit = f"{r['epoch']} | {spent:.1f}"
            break
    if not hit:
        hit = "not reached | " if any(r["hr"] > 0 for r in rows) else "(no eval) | "
    print(f"| {os.path.basename(path)[:-6]} | {rows[-1]['world']} | {len(rows)} | "
          f"{rows[-1]['samples_per_second']:.0f} | {rows[0]['loss']:.6f} | "
          f"{max(r['hr'] for r in rows):.4f} | {hit} |")
print()
print("The runs with W > 1 take the same global batch as W = 1: their epoch-1 loss should")
print("match the 1-rank tf32 run up to float summation order.")
print()
EOF
  fi
  if [ ${#failures[@]} -gt 0 ]; then
    echo "## FAILED"
    echo
    printf -- '- %s\n' "${failures[@]}"
  else
    echo "All steps exited 0."
  fi
}
summarize | tee "$out/summary.md"

if [ ${#failures[@]} -gt 0 ]; then
  echo "$prog: ${#failures[@]} step(s) failed; results in $out" >&2
  exit 1
fi
echo "$prog: done; results in $out"
