#!/usr/bin/env bash
# Reproduces the CPU figures of bench/results/cpu_benchmarks.md, one section at a time:
#   bash bench/run_cpu_benchmarks.sh prep|big|reader|compare|compare-ml20m|perf|curves|all
# Each section writes its raw output to bench/results/*.txt / *.jsonl, opened by a
# header (commit, machine, load) and with every command echoed before it runs.
# Timings on a shared machine are noisy: every timing is repeated REPS times.
# Env: NCF_BUILD_DIR (default build), NCF_BENCH_DATA (default /tmp), REPS (default 3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${NCF_BUILD_DIR:-$root/build}" && pwd)"
data="${NCF_BENCH_DATA:-/tmp}"
res="$root/bench/results"
reps="${REPS:-3}"
py=/usr/bin/python3  # Debian's python3-torch and matplotlib live here, not in a pyenv python
bash "$root/scripts/setup.sh" python3-torch  # the PyTorch comparison's Debian package
mkdir -p "$res"

header() {  # header TITLE: what every results file opens with
  echo "# $1"
  echo "# date: $(date -u +%FT%TZ)  commit: $(git -C "$root" rev-parse --short HEAD)"
  echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
    "$(free -g | awk '/^Mem:/{print $2}') GiB memory"
  echo "# build: $build (built from the working tree; files under src/ differing from HEAD:" \
    "$(git -C "$root" status --short -- src | wc -l))"
}
load() { echo "# load: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min)"; }
run() {  # run CMD...: echo the command, then run it
  load
  echo "\$ $*"
  "$@"
}

# The N heaviest symbols by self time (|| true: head closes the pipe early).
perf_top() {
  # Shortens the parallel-for lambdas to the kernel that owns them.
  local lambda='s/std::_Function_handler<void \(long, long(, double\*)?\), '
  lambda+='(ncf::(\(anonymous namespace\)::)?[A-Za-z_0-9]+)\(.*/\2 (parallel-for body)/'
  local sorts='s/(std::__[a-z_]+)<.*(sort_reduce_rows).*/\1 (in ncf::\2)/'
  echo "\$ perf report -i $1 --no-children --sort symbol --stdio -g none | head -$2"
  perf report -i "$1" --no-children --sort symbol --stdio -g none 2>/dev/null |
    grep -E '^ +[0-9]' | sed -E 's/ +- +- *$//' | sed -E "$lambda" | sed -E "$sorts" |
    cut -c1-140 | head -"$2" || true
}

# ncf_prep wall time and peak RSS: prep_timed NAME ARGS... (one line per rep to stdout)
prep_timed() {
  local name=$1 out="$data/bench-$1" log
  shift
  for rep in $(seq "$reps"); do
    rm -rf "$out"
    log=$(mktemp)
    local l1
    l1=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -v "$build/src/ncf_prep" "$@" --output "$out" --progress off >"$log" 2>&1
    {
      echo "\$ /usr/bin/time -v $build/src/ncf_prep $* --output $out --progress off  (rep $rep)"
      cat "$log"
    } >>"$res/prep_${name}_raw.txt"
    local wall rss bytes usr sys pct
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log")
    rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
    usr=$(sed -n 's/.*User time (seconds): //p' "$log")
    sys=$(sed -n 's/.*System time (seconds): //p' "$log")
    pct=$(sed -n 's/.*Percent of CPU this job got: //p' "$log")
    bytes=$(du -sb "$out" | cut -f1)
    # user + sys CPU seconds and the CPU share matter here: under load the wall time
    # mostly measures the other jobs.
    awk -v n="$name" -v r="$rep" -v w="$wall" -v k="$rss" -v b="$bytes" -v l="$l1" \
      -v cs="$(awk "BEGIN{print $usr + $sys}")" -v p="$pct" 'BEGIN {
      printf "%-12s rep %d  wall %-8s cpu %7.2f s (%s)  peak_rss %7.0f MiB  " \
        "output %7.0f MB  load1 %s\n", n, r, w, cs, p, k / 1024, b / 1e6, l }'
    rm -f "$log"
  done
}

section_prep() {
  local f="$res/prep_timings.txt"
  rm -f "$res"/prep_ml-20m_raw.txt "$res"/prep_ml-1m_raw.txt
  {
    header "ncf_prep end to end: synthetic ml-20m and ml-1m shapes"
    load
    prep_timed ml-20m --synthetic ml-20m
    prep_timed ml-1m --synthetic ml-1m --eval_negatives 99
    load
  } | tee "$f"
}

# 10^7 users: memory must not grow with interactions (shuffle spills to buckets).
section_big() {
  local f="$res/prep_big.txt" reps=1  # one run per size: the RSS figures are deterministic
  rm -f "$res"/prep_u*_raw.txt
  {
    header "ncf_prep at 10^6 and 10^7 users: peak RSS against interactions"
    df -h "$data" | sed 's/^/# /'
    for n in 20000000 50000000 100000000; do
      prep_timed "u1m-i$((n / 1000000))m" --synthetic custom --users 1000000 --items 100000 \
        --interactions $n --eval_negatives 99 --num_shards 16
      rm -rf "$data/bench-u1m-i$((n / 1000000))m"
    done
    prep_timed u10m-i200m --synthetic custom --users 10000000 --items 100000 \
      --interactions 200000000 --eval_negatives 99 --num_shards 16
    rm -rf "$data/bench-u10m-i200m"
    prep_timed u10m-i250m --synthetic custom --users 10000000 --items 100000 \
      --interactions 250000000 --eval_negatives 99 --num_shards 16
    rm -rf "$data/bench-u10m-i250m"
    load
  } | tee "$f"
}

section_reader() {
  local f="$res/reader_ml20m.txt" d="$data/bench-ml-20m"
  [ -f "$d/metadata.json" ] || "$build/src/ncf_prep" --synthetic ml-20m --output "$d" --progress off
  {
    header "bench_reader on the synthetic ml-20m shape (warm page cache unless --evict)"
    # P = 1048576/5 (ml-20m-mlperf) and 256/5 (ncf-paper); W = 1 and rank 0 of W = 8.
    run "$build/bench/bench_reader" --data_dir "$d" --reps "$reps"
    run "$build/bench/bench_reader" --data_dir "$d" --reps "$reps" --positives 51 --no_verify
    run "$build/bench/bench_reader" --data_dir "$d" --reps "$reps" --world 8 --no_verify
    run "$build/bench/bench_reader" --data_dir "$d" --reps "$reps" --evict --no_verify
    # At small P the per-step hand-off between the reader thread and the consumer sets the
    # rate: both threads on one core, then free to use both (cross-core wake-ups).
    for cpus in 0 0,1; do
      run taskset -c $cpus "$build/bench/bench_reader" --data_dir "$d" --reps "$reps" \
        --positives 51 --no_verify --only train
    done
    # Where a reader's CPU goes (the reader thread and the consumer together).
    local p
    p=$(mktemp -d)
    for only in train eval; do
      run perf record -g -o "$p/$only.data" "$build/bench/bench_reader" --data_dir "$d" \
        --reps "$reps" --no_verify --only $only
      perf_top "$p/$only.data" 15
    done
    rm -rf "$p"
    load
  } 2>&1 | tee "$f"
}

# The ml-20m-mlperf preset on both sides, REPS times: compare_ml20m DIR USERS ITEMS.
# ncf_dist's --step_log gives the steady rate over steps 1.. (step 0 first touches its
# ~13 GB of buffers); PyTorch excludes its warm-up step.
compare_ml20m() {
  local m20=$1 u20=$2 i20=$3
  for rep in $(seq "$reps"); do
    run "$build/src/ncf_dist" --device cpu --data_dir "$m20" --preset ml-20m-mlperf --train_epochs 1 \
      --max_steps 4 --no_eval --threads 2 --progress off --step_log
    run $py "$root/bench/pytorch_neumf.py" --users "$u20" --items "$i20" --preset ml-20m-mlperf \
      --threads 2 --warmup 1 --steps 3
  done
}

# ncf_dist against a plain PyTorch NeuMF (random ids and labels: no input pipeline).
section_compare() {
  local f="$res/compare_pytorch.txt" m1="$data/bench-ml-1m" m20="$data/bench-ml-20m"
  [ -f "$m1/metadata.json" ] ||
    "$build/src/ncf_prep" --synthetic ml-1m --eval_negatives 99 --output "$m1" --progress off
  [ -f "$m20/metadata.json" ] ||
    "$build/src/ncf_prep" --synthetic ml-20m --output "$m20" --progress off
  local u1 i1 u20 i20
  u1=$($py -c "import json;print(json.load(open('$m1/metadata.json'))['num_users'])")
  i1=$($py -c "import json;print(json.load(open('$m1/metadata.json'))['num_items'])")
  u20=$($py -c "import json;print(json.load(open('$m20/metadata.json'))['num_users'])")
  i20=$($py -c "import json;print(json.load(open('$m20/metadata.json'))['num_items'])")
  {
    header "ncf_dist vs PyTorch $($py -c 'import torch;print(torch.__version__)') NeuMF, samples/s"
    for rep in $(seq "$reps"); do
      for t in 1 2; do
        run "$build/src/ncf_dist" --device cpu --data_dir "$m1" --preset ncf-paper --train_epochs 1 \
          --max_steps 6000 --no_eval --threads $t --progress off
        run $py "$root/bench/pytorch_neumf.py" --users "$u1" --items "$i1" --preset ncf-paper \
          --threads $t --warmup 200 --steps 3000
      done
    done
    # Lazy Adam on both sides (touched rows only): what the dense decay costs at batch 256.
    for rep in $(seq "$reps"); do
      run "$build/src/ncf_dist" --device cpu --data_dir "$m1" --preset ncf-paper --train_epochs 1 \
        --max_steps 6000 --no_eval --threads 1 --progress off --embedding_optimizer lazy_adam
      run $py "$root/bench/pytorch_neumf.py" --users "$u1" --items "$i1" --preset ncf-paper \
        --threads 1 --warmup 200 --steps 3000 --embedding_optimizer lazy_adam
    done
    compare_ml20m "$m20" "$u20" "$i20"
    # For reference: both sides on the OpenBLAS kernels OpenBLAS picks by itself here.
    echo "# reference runs without the OPENBLAS_CORETYPE upgrade"
    # OpenBLAS's own pick, given back to it: ncf_dist upgrades only where the variable is unset.
    own_core=$($py -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0")
l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())')
    run env OPENBLAS_CORETYPE="$own_core" "$build/src/ncf_dist" --device cpu --data_dir "$m1" --preset ncf-paper \
      --train_epochs 1 --max_steps 6000 --no_eval --threads 1 --progress off
    run $py "$root/bench/pytorch_neumf.py" --users "$u1" --items "$i1" --preset ncf-paper \
      --threads 1 --warmup 200 --steps 3000 --no_blas_upgrade
    echo "# reference run with libgomp's default spin-waiting"
    run $py "$root/bench/pytorch_neumf.py" --users "$u1" --items "$i1" --preset ncf-paper \
      --threads 2 --warmup 50 --steps 300 --omp_spin
    run env OPENBLAS_CORETYPE="$own_core" "$build/src/ncf_dist" --device cpu --data_dir "$m20" --preset ml-20m-mlperf \
      --train_epochs 1 --max_steps 4 --no_eval --threads 2 --progress off --step_log
    run $py "$root/bench/pytorch_neumf.py" --users "$u20" --items "$i20" --preset ml-20m-mlperf \
      --threads 2 --warmup 1 --steps 3 --no_blas_upgrade
    load
  } 2>&1 | tee "$f"
  $py "$root/bench/summarize_compare.py" "$f" | tee "$res/compare_pytorch_summary.md"
}

# More ml-20m pairs (each step takes seconds, and the machine is shared).
section_compare_ml20m() {
  local f="$res/compare_pytorch_ml20m_more.txt" m20="$data/bench-ml-20m" u20 i20
  u20=$($py -c "import json;print(json.load(open('$m20/metadata.json'))['num_users'])")
  i20=$($py -c "import json;print(json.load(open('$m20/metadata.json'))['num_items'])")
  {
    header "ncf_dist vs PyTorch NeuMF, ml-20m-mlperf preset, more pairs"
    compare_ml20m "$m20" "$u20" "$i20"
    load
  } 2>&1 | tee "$f"
  $py "$root/bench/summarize_compare.py" "$res/compare_pytorch.txt" "$f" |
    tee "$res/compare_pytorch_summary.md"
}

# Where ncf_dist's time goes: perf's flat profile (self time by symbol).
section_perf() {
  local f="$res/perf_ncf_dist.txt" m1="$data/bench-ml-1m" m20="$data/bench-ml-20m" p
  p=$(mktemp -d)
  {
    header "perf record -g of ncf_dist; perf report --no-children --sort symbol (top entries)"
    run perf record -g -o "$p/a.data" "$build/src/ncf_dist" --device cpu --data_dir "$m1" --preset ncf-paper \
      --train_epochs 1 --max_steps 6000 --no_eval --threads 1 --progress off
    perf_top "$p/a.data" 30
    # The whole run: step 0 first touches ~19 GB of tables and step buffers (page faults).
    run perf record -g -o "$p/b.data" "$build/src/ncf_dist" --device cpu --data_dir "$m20" \
      --preset ml-20m-mlperf --train_epochs 1 --max_steps 4 --no_eval --threads 2 --progress off
    perf_top "$p/b.data" 30
    # Steady state: -D skips the first 40 s (start-up and step 0 on a quiet machine).
    run perf record -D 40000 -g -o "$p/c.data" "$build/src/ncf_dist" --device cpu --data_dir "$m20" \
      --preset ml-20m-mlperf --train_epochs 1 --max_steps 10 --no_eval --threads 2 \
      --progress off --step_log
    perf_top "$p/c.data" 30
    # Page faults do not grow with steps: they are all in start-up and step 0.
    for n in 2 4; do
      run perf stat -e page-faults,task-clock "$build/src/ncf_dist" --device cpu --data_dir "$m20" \
        --preset ml-20m-mlperf --train_epochs 1 --max_steps $n --no_eval --threads 2 \
        --progress off --step_log
    done
    load
  } 2>&1 | tee "$f"
  rm -rf "$p"
}

# 20 epochs of the ncf-paper preset on the synthetic ml-1m shape, its curves, and
# the popularity baseline on the same eval records.
section_curves() {
  local m1="$data/bench-ml-1m" j="$res/curves_ncf_paper_synthetic_ml1m.jsonl"
  [ -f "$m1/metadata.json" ] ||
    "$build/src/ncf_prep" --synthetic ml-1m --eval_negatives 99 --output "$m1" --progress off
  rm -f "$j"
  {
    header "ncf-paper preset, synthetic ml-1m shape (99 eval negatives), 20 epochs"
    run "$build/src/ncf_dist" --device cpu --data_dir "$m1" --preset ncf-paper --train_epochs 20 \
      --metrics_json "$j" --progress off
    load
  } 2>&1 | tee "$res/curves_ncf_paper_synthetic_ml1m.txt"
  {
    header "popularity baseline, synthetic ml-1m shape"
    run "$build/bench/bench_popularity" --data_dir "$m1" --topk 10 \
      --json "$res/popularity_ml1m.json"
  } 2>&1 | tee "$res/popularity_ml1m.txt"
  $py "$root/bench/plot_curves.py" --metrics "$j" --baseline "$res/popularity_ml1m.json" \
    --title "NeuMF, ncf-paper preset, synthetic ml-1m shape (99 eval negatives)" \
    --output "$res/curves_ncf_paper_synthetic_ml1m.png"
}

case "${1:-all}" in
  prep) section_prep ;;
  big) section_big ;;
  reader) section_reader ;;
  compare) section_compare ;;
  compare-ml20m) section_compare_ml20m ;;
  perf) section_perf ;;
  curves) section_curves ;;
  all)
    section_prep
    section_reader
    section_compare
    section_compare_ml20m
    section_perf
    section_curves
    section_big
    ;;
  *) echo "usage: $0 prep|big|reader|compare|compare-ml20m|perf|curves|all" >&2; exit 2 ;;
esac
