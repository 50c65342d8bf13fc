# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154,SC2034
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run; some set here are read by the other stage files)
#
# Sourced by scripts/gpu_kit.sh: what every part uses: the kit's paths, messages, the
# environment of our programs and the machine's, the stage runner (stage, limited, record,
# archive), the figures shared by several stages, info.txt and summary.md, and `run` itself
# (cmd_run).

kit="$root/.gpu-kit"
# where `run` unpacks the kit; rehearse puts it outside .gpu-kit, which stays as pack left it
kit_prefix="${NCF_KIT_PREFIX:-$kit/prefix}"
die() { echo "$prog: error: $*" >&2; exit 1; }
note() { echo "$prog: $*" >&2; }
os_name() { sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || uname -sr; }
multiarch() { find "$1" -maxdepth 1 -name '*-linux-gnu' -printf '%f\n' 2>/dev/null | sort | head -n 1; }

# ======================================================================================
# run
# ======================================================================================
orig_path="$PATH"
orig_ld="${LD_LIBRARY_PATH:-}"
kit_ld=""          # LD_LIBRARY_PATH for our programs (the unpacked prefix first)
have_gpu=0
num_gpus=0
gpu_why=""
build=""
out=""
commit=""
t_start=0
budget=540
failures=0
archive_to=""

# setup_env: PATH, Open MPI relocation and settings; kit_ld for our programs only.
setup_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # What tests/test_util.cc mpirun() passes: no InfiniBand/libfabric transports, ob1,
  # shared memory without CMA/KNEM (containers and VMs forbid them).
  export OMPI_MCA_btl='^openib,ofi' OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_mtl='^ofi,psm,psm2' OMPI_MCA_osc='^ucx' OMPI_MCA_rmaps_base_oversubscribe=1
  # Single node: ranks start with fork; without ssh, mpirun would refuse before that.
  command -v ssh >/dev/null 2>&1 || export OMPI_MCA_plm_rsh_agent=false
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  if [ -d "$kit_prefix/usr" ]; then
    local p="$kit_prefix/usr" ma
    ma="$(multiarch "$p/lib")"
    export PATH="$p/bin:$orig_path"
    # Debian's Open MPI relocates with OPAL_PREFIX; its external PMIx (pmix2) does not
    # relocate its plugins and help files by PMIX_INSTALL_PREFIX alone: they are named too.
    export OPAL_PREFIX="$p"
    export OMPI_MCA_mca_base_component_path="$p/lib/$ma/openmpi/lib/openmpi3"
    export PMIX_INSTALL_PREFIX="$p/lib/$ma/pmix2"
    export PMIX_PKGDATADIR="$p/lib/$ma/pmix2/share/pmix"
    export PMIX_MCA_mca_base_component_path="$p/lib/$ma/pmix2/lib/pmix"
    kit_ld="$p/lib/$ma:$p/lib/$ma/openmpi/lib:$p/lib/$ma/openblas-pthread:$p/lib/$ma/pmix2/lib"
    kit_ld="$kit_ld${orig_ld:+:$orig_ld}"
    kit_cmake_args=(-DCMAKE_PREFIX_PATH="$p" -DCMAKE_LIBRARY_ARCHITECTURE="$ma"
      -DMPI_C_COMPILER="$p/bin/mpicc" -DMPIEXEC_EXECUTABLE="$p/bin/mpiexec"
      -DProtobuf_PROTOC_EXECUTABLE="$p/bin/protoc")
  else
    kit_ld="$orig_ld"
    kit_cmake_args=()
  fi
  if [ -d /usr/local/cuda/bin ]; then
    case ":$PATH:" in *":/usr/local/cuda/bin:"*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac
  fi
  orig_path_cuda="$orig_path:/usr/local/cuda/bin"
}
kit_cmake_args=()
orig_path_cuda="$orig_path"

# ours CMD...: run one of our programs with the kit's libraries.
ours() { env LD_LIBRARY_PATH="$kit_ld" "$@"; }
# theirs CMD...: the machine's own tools (nvidia-smi, python3 with PyTorch): no kit libs.
theirs() {
  if [ -n "$orig_ld" ]; then
    env LD_LIBRARY_PATH="$orig_ld" PATH="$orig_path_cuda" "$@"
  else
    env -u LD_LIBRARY_PATH PATH="$orig_path_cuda" "$@"
  fi
}

detect_gpu() {
  have_gpu=0 num_gpus=0
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    gpu_why="nvidia-smi not found"
  elif ! gpu_list="$(theirs nvidia-smi -L 2>&1)"; then
    gpu_why="nvidia-smi -L failed: $(head -n 1 <<<"$gpu_list")"
  else
    num_gpus=$(grep -c '^GPU ' <<<"$gpu_list" || true)
    if [ "$num_gpus" -ge 1 ]; then have_gpu=1; else gpu_why="nvidia-smi lists no GPU"; fi
  fi
}

# ---- stages ----------------------------------------------------------------------------
# Each stage: one log $out/<name>.log, one line in $out/summary.tsv:
#   name <TAB> status <TAB> figure <TAB> seconds
record() {  # NAME STATUS FIGURE SECONDS
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "${3//$'\t'/ }" "$4" >>"$out/summary.tsv"
  printf '%s: %-22s %-8s %s (%s s)\n' "$prog" "$1" "$2" "$3" "$4" >&2
  case "$2" in FAIL*) failures=$((failures + 1)) ;; esac
  archive
}
# NCF_KIT_ARCHIVE=DIR: the results live in $build/kit-results (kept across calls on a warm
# machine, like $OUT), and after every stage DIR gets summary.md, info.txt and all of them in
# one results.tgz, so that a caller that brings back only a few files (or cuts the run
# short) still gets every log of the stages that ended.
archive() {
  [ -n "$archive_to" ] || return 0
  write_summary
  cp "$out/summary.md" "$out/summary.tsv" "$archive_to/" 2>/dev/null || true
  [ ! -f "$out/info.txt" ] || cp "$out/info.txt" "$archive_to/"
  tar czf "$archive_to/results.tgz.tmp" -C "$out" . 2>/dev/null &&
    mv -f "$archive_to/results.tgz.tmp" "$archive_to/results.tgz"
}
left() { echo $((budget - ($(date +%s) - t_start))); }

# limited SECONDS CMD...: CMD (a function or a program) in a subshell of its own process
# group; the group is sent TERM after SECONDS (KILL 10 s later). Exit 124 on timeout.
limited() {
  local limit=$1 pid wd rc=0 flag
  shift
  flag="$(mktemp)"
  rm -f "$flag"
  set -m
  ("$@") </dev/null &
  pid=$!
  (sleep "$limit"; touch "$flag"; kill -TERM -- "-$pid"; sleep 10; kill -KILL -- "-$pid") \
    >/dev/null 2>&1 &
  wd=$!
  set +m
  wait "$pid" || rc=$?
  kill -- "-$wd" 2>/dev/null || true
  wait "$wd" 2>/dev/null || true
  if [ -e "$flag" ]; then rc=124; rm -f "$flag"; fi
  return "$rc"
}

# stage NAME GPU TIMEOUT FIGURE_FN -- CMD...: runs CMD under a time limit (TIMEOUT times
# NCF_KIT_TIMEOUT_SCALE, shortened to the time left), its output into $out/NAME.log;
# FIGURE_FN (or -) prints the figure from the log afterwards. GPU=1: "no GPU" without
# running when there is none; GPU=2: runs, but its status is "no GPU" when there is none.
stage_status=""
stage() {
  local name=$1 gpu=$2 limit=$(($3 * ${NCF_KIT_TIMEOUT_SCALE:-1})) fig=$4 rc=0 t0 secs figure="" remaining
  shift 5
  local log="$out/$name.log"
  if [ "$gpu" = 1 ] && [ "$have_gpu" = 0 ]; then
    record "$name" "no GPU" "$gpu_why" 0
    return 0
  fi
  if [[ " ${NCF_KIT_SKIP:-} " == *" $name "* ]]; then
    record "$name" "skipped" "named in NCF_KIT_SKIP" 0
    return 0
  fi
  remaining=$(left)
  if [ "$remaining" -lt 15 ]; then
    record "$name" "skipped" "time budget of ${budget} s spent (NCF_KIT_BUDGET)" 0
    return 0
  fi
  [ "$limit" -le "$remaining" ] || limit=$remaining
  {
    echo "# $name  $(date -u +%FT%TZ)  commit $commit  timeout ${limit}s"
    printf '$'; printf ' %q' "$@"; echo
  } >"$log"
  t0=$(date +%s)
  limited "$limit" "$@" >>"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - t0))
  echo "# exit $rc after ${secs}s" >>"$log"
  stage_status=pass
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    stage_status="FAIL (timeout ${limit}s)"
  elif [ "$rc" -ne 0 ]; then
    stage_status="FAIL (exit $rc)"
  elif [ "$gpu" = 2 ] && [ "$have_gpu" = 0 ]; then
    stage_status="no GPU"
  fi
  if [ "$fig" != - ]; then figure="$("$fig" "$log" 2>/dev/null || true)"; fi
  [ -n "$figure" ] || figure="see $name.log"
  record "$name" "$stage_status" "$figure" "$secs"
}

# ---- figures read from the logs ------------------------------------------------------------
fig_ctest() {
  local line skipped
  line="$(grep -E 'tests passed|tests failed' "$1" | tail -n 1 | sed 's/^ *//')"
  skipped="$(grep -c '\*\*\*Skipped' "$1" || true)"
  echo "${line:-no ctest summary}$( [ "${skipped:-0}" -gt 0 ] && echo "; $skipped skipped")"
}
fig_tail() { grep -v '^#' "$1" | grep -v '^\s*$' | tail -n 1 | cut -c1-160; }
fig_sanitizer() { grep -hE 'ERROR SUMMARY|not counted|^# exit' "$1" | tr '\n' ' ' | sed 's/========= //g' | cut -c1-200; }
# jsonl_fig FILE MODE: samples/s of the last epoch (throughput) or time to quality (ttq).
jsonl_fig() {
  [ -s "$1" ] || { echo "no metrics"; return 0; }
  python3 "$root/scripts/gpu_kit/fig_jsonl.py" "$1" "$2"
}

# ---- info and summary ------------------------------------------------------------------------------------
write_info() {
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $commit (from .gpu-kit/commit)"
    echo "host: $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null), $(nproc) cores, $(free -g 2>/dev/null | awk '/^Mem:/{print $2}') GiB memory"
    echo "os: $(os_name), $(ldd --version 2>/dev/null | head -n 1)"
    if [ "$have_gpu" = 1 ]; then
      echo "gpus: $num_gpus"
      theirs nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total,compute_mode --format=csv,noheader |
        sed 's/^/  gpu: /'
    else
      echo "gpu: none ($gpu_why)"
    fi
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo none)"
    echo "kit: $( [ -f "$kit/manifest.txt" ] && echo "$(($(wc -l <"$kit/manifest.txt") - 2)) Debian packages in .gpu-kit" || echo "none: the machine's own packages")"
    echo "build: $build ($(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null | sed 's/^/sm_/'), generator $(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null))"
    echo "budget: ${budget} s per run"
  } >"$out/info.txt"
}
write_summary() {
  {
    echo "# GPU kit run, $(date -u +%F), commit $commit"
    echo
    if [ "$have_gpu" = 1 ]; then
      echo "Device: $(theirs nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1) ($num_gpus GPU)"
    else
      echo "Device: no GPU ($gpu_why)"
    fi
    echo
    echo "| stage | status | figure | seconds |"
    echo "| --- | --- | --- | ---: |"
    # the latest line of each stage, in first-seen order
    awk -F'\t' '!($1 in s) {o[++n] = $1} {s[$1] = $2; f[$1] = $3; t[$1] = $4}
      END {for (i = 1; i <= n; i++) printf "| %s | %s | %s | %s |\n", o[i], s[o[i]], f[o[i]], t[o[i]]}' \
      "$out/summary.tsv"
  } >"$out/summary.md"
}

cmd_run() {
  local what=${1:-all}
  case "$what" in build | tests | bench | step | tier | all) ;; *) die "run: unknown '$what' (build, tests, bench, step, tier, all)" ;; esac
  t_start=$(date +%s)
  budget="${NCF_KIT_BUDGET:-540}"
  build="${NCF_KIT_BUILD:-build-gpu}"
  [[ "$build" = /* ]] || build="$root/$build"
  data="${NCF_KIT_DATA:-$root/data}"
  [[ "$data" = /* ]] || data="$root/$data"
  m20="$data/syn-ml-20m"
  if [ -f "$kit/commit" ]; then
    commit="$(cat "$kit/commit")"
  else
    commit="${NCF_KIT_COMMIT:-unknown}"
  fi
  [ -d "$kit/debs" ] || note "no .gpu-kit/debs: using this machine's own packages (scripts/setup.sh)"
  detect_gpu
  archive_to="${NCF_KIT_ARCHIVE:-}"
  if [ -n "$archive_to" ]; then
    mkdir -p "$archive_to"
    archive_to="$(cd "$archive_to" && pwd)"
    out="$build/kit-results"
  elif [ -n "${OUT:-}" ]; then
    out="$OUT"
  else
    out="$root/bench/results/gpu_$(date -u +%F)_${commit:0:12}"
  fi
  mkdir -p "$out" "$data"
  touch "$out/summary.tsv"
  note "run $what: $( [ "$have_gpu" = 1 ] && echo "$num_gpus GPU(s)" || echo "no GPU ($gpu_why)"); results in $out"
  run_build
  write_info
  case "$what" in
    tests) run_tests ;;
    bench) run_bench ;;
    step) run_step ;;
    tier) run_tier ;;
    all) run_tests; run_bench ;;
  esac
  write_info
  write_summary
  archive
  cat "$out/summary.md"
  note "results in $out ($(($(date +%s) - t_start)) s)"
  [ "$failures" -eq 0 ]
}
