# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: the build stages: probe, configure, build (and again
# without -Werror).

# ---- the build ---------------------------------------------------------------------------------
gpu_arch() {
  if [ -n "${NCF_KIT_ARCH:-}" ]; then echo "$NCF_KIT_ARCH"; return; fi
  local cc=""
  if [ "$have_gpu" = 1 ]; then
    cc="$(theirs nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')"
  fi
  if [[ "$cc" =~ ^[0-9]+$ ]]; then echo "$cc"; else echo 90; fi
}

nccl_root() {  # the toolkit's NCCL, else the Python wheel's
  local c
  for c in "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda /usr; do
    if [ -f "$c/include/nccl.h" ] && ls "$c"/lib*/libnccl.so* "$c"/lib/*-linux-gnu/libnccl.so* >/dev/null 2>&1; then
      echo "$c"; return
    fi
  done
  theirs python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true
}

do_configure() {
  local gen=() arch nroot
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  arch="$(gpu_arch)"
  nroot="$(nccl_root)"
  if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}$" "$build/CMakeCache.txt"; then
    rm -rf "$build"
  fi
  echo "CUDA architectures: $arch"
  echo "NCCL root: ${nroot:-(not found: CMake searches itself)}"
  ours cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DNCF_WERROR="$werror" \
    -DNCF_CUDA=AUTO -DCMAKE_CUDA_ARCHITECTURES="$arch" ${nroot:+-DNCCL_ROOT="$nroot"} \
    "${kit_cmake_args[@]}"
}
fig_configure() {
  { sed -n 's/^CUDA architectures: /sm_/p' "$1"
    grep -E 'ncf_dist: (CUDA backend|NCCL)|CMake Error' "$1" | sed 's/^-- ncf_dist: //'; } |
    paste -s -d ';' | sed 's/;/; /g' | cut -c1-220
}
do_build() { ours cmake --build "$build" -j "$(nproc)"; }
fig_build() {
  if grep -q '^# exit 0' "$1"; then
    echo "$(find "$build" -maxdepth 2 -type f -perm -u+x \( -name 'ncf_*' -o -name 'test_*' -o -name 'bench_*' \) | wc -l) programs"
  else
    { grep -m1 -E 'error:|Error' "$1" || grep -m1 -E 'error|Error' "$1"; } | cut -c1-180
  fi
}
werror=ON

run_build() {
  if [ -d "$kit/debs" ]; then
    stage unpack 0 300 fig_tail -- unpack
  fi
  setup_env
  stage probe 2 60 fig_probe -- do_probe
  stage configure 0 300 fig_configure -- do_configure
  stage build 0 "${NCF_KIT_BUILD_TIMEOUT:-900}" fig_build -- do_build
  # A warning this compiler raises and ours did not must not cost the window: the failure
  # stays recorded (and the run's exit status), and the stages run on a build without -Werror.
  if ! built && grep -q 'Werror' "$out/build.log" 2>/dev/null; then
    werror=OFF
    stage configure_no_werror 0 300 fig_configure -- do_configure
    stage build_no_werror 0 "${NCF_KIT_BUILD_TIMEOUT:-900}" fig_build -- do_build
  fi
}
built() { [ -x "$build/src/ncf_dist" ] && [ -x "$build/src/ncf_prep" ]; }
cuda_built() { grep -q '^ncf_dist: CUDA backend ON\|NCF_WITH_CUDA' "$build/compile_commands.json" 2>/dev/null; }

# ---- probe -----------------------------------------------------------------------------------------
do_probe() {
  echo "== nvidia-smi"; theirs nvidia-smi || true
  echo "== nvidia-smi --query-gpu"
  theirs nvidia-smi --query-gpu=index,name,compute_cap,compute_mode,driver_version,memory.total \
    --format=csv || true
  echo "== nvcc"; nvcc --version || true
  echo "== glibc"; ldd --version | head -n 1
  echo "== os"; os_name
  echo "== cores: $(nproc)"; echo "== memory"; free -g || true
  echo "== python3 / torch"
  theirs python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' || true
  echo "== mpirun"; ours mpirun --version 2>&1 | head -n 1 || true
}
fig_probe() {
  if [ "$have_gpu" = 1 ]; then
    theirs nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1
  else
    echo "$gpu_why; $(ldd --version | head -n 1 | awk '{print "glibc " $NF}'), $(nproc) cores"
  fi
}
