#!/usr/bin/env bash
# The GPU bring-up kit: build and run ncf_dist on a bare, short-lived GPU machine that has
# the NVIDIA driver, the CUDA toolkit, CMake, g++ and Python (PyTorch, nvidia-nccl-cu13) but
# none of our Debian packages and no network.
#
#   bash scripts/gpu_kit.sh pack       here (Debian 12): the Debian packages the build and the
#                                      runs need, minus what any machine with a compiler has,
#                                      into .gpu-kit/ (git-ignored); bring .gpu-kit along
#   bash scripts/gpu_kit.sh run [build|tests|bench|step|all]
#                                      there, from the repository root: unpack .gpu-kit into a
#                                      prefix under .gpu-kit/, configure and build build-gpu/
#                                      for that GPU, run the stages, record the results
#   bash scripts/gpu_kit.sh rehearse [build|tests|bench|step|all]
#                                      here, as root: `run` inside a clean Debian 12 root
#                                      (debootstrap minbase + build-essential, cmake, python3),
#                                      /usr/local/cuda bind-mounted, no network, no GPU
#
# `run` without .gpu-kit/debs uses the machine's own packages (scripts/setup.sh); that is what
# bench/run_gpu_benchmarks.sh does. Results go to $OUT when set, else
# bench/results/gpu_<UTC date>_<commit>/: info.txt, one log per stage, summary.md (one line
# per stage: status, figure, seconds). A stage that fails is recorded and the next one runs;
# every GPU stage reports "no GPU" on a machine without one. Exit status: 1 when a stage
# failed, else 0.
#
# Env: NCF_KIT_BUILD (build-gpu), NCF_KIT_DATA (data), NCF_KIT_PREFIX (where the kit is
# unpacked, .gpu-kit/prefix), NCF_KIT_BUDGET (seconds one `run` may take, 540: a stage that
# would not fit is shortened, or skipped when < 15 s are left), NCF_KIT_TIMEOUT_SCALE (1,
# multiplies every stage's limit), NCF_KIT_BUILD_TIMEOUT (900), NCF_KIT_ARCH (the GPU's
# compute capability, e.g. 90; default: nvidia-smi's, else 90), NCF_KIT_TTQ_EPOCHS (20),
# NCF_KIT_PRECISIONS ("tf32 bf16"), NCF_KIT_PARITY_FILTER (the parity tests run under
# compute-sanitizer), NCF_KIT_STEP_PARITY_FILTER (the parity tests of `run step`: a window
# too short for all of them runs those of the ops it changed), NCF_KIT_COMMIT (the commit
# to report when there is no .gpu-kit/commit),
# NCF_KIT_ROOTFS (rehearse: the cached Debian root, .gpu-kit-root/bookworm), NCF_KIT_SKIP
# (stage names, space-separated, recorded as skipped without running: a short window spends
# itself on the stages that matter most to it), NCF_KIT_ARCHIVE (a folder: the results go to
# $build/kit-results, and the folder gets summary.md, summary.tsv, info.txt and results.tgz,
# all of them, refreshed after every stage).
# shellcheck disable=SC2317  # most functions run indirectly, through stage and limited
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=gpu_kit
kit="$root/.gpu-kit"
# where `run` unpacks the kit; rehearse puts it outside .gpu-kit, which stays as pack left it
kit_prefix="${NCF_KIT_PREFIX:-$kit/prefix}"
die() { echo "$prog: error: $*" >&2; exit 1; }
note() { echo "$prog: $*" >&2; }
os_name() { sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || uname -sr; }
multiarch() { find "$1" -maxdepth 1 -name '*-linux-gnu' -printf '%f\n' 2>/dev/null | sort | head -n 1; }

# The packages of scripts/setup.sh that the build and the runs need (not the compiler,
# cmake or python: those are the GPU machine's).
kit_packages=(openmpi-bin libopenmpi-dev libprotobuf-dev protobuf-compiler libopenblas-dev
  libdnnl-dev libgtest-dev libcli11-dev nlohmann-json3-dev zlib1g-dev)
# Dependencies never shipped: compilers (gfortran for mpifort), ssh (single-node runs start
# ranks with fork), autotools (libltdl-dev), hwloc's optional plugins (X11, libxml2, ICU,
# OpenCL), Open MPI's HTML docs. The baseline (below) covers libc6, libstdc++6, libgcc-s1.
kit_skip=(gfortran-12 gfortran-mod-15 gfortran fortran-compiler openssh-client ssh-client
  libjs-jquery libjs-jquery-ui automake-1.16 automake autoconf libhwloc-plugins)
kit_limit_mib=60

# ======================================================================================
# pack
# ======================================================================================
# closure ROOTS... : "name version" of the candidate packages ROOTS need, following Depends
# and Pre-Depends (first alternative), minus the baseline: the installed packages of
# Priority required / Essential and build-essential, and everything they depend on.
closure() {
  python3 - "$*" "build-essential" "${kit_skip[*]}" <<'EOF'
import re, subprocess, sys
roots, base_roots, skip = sys.argv[1].split(), sys.argv[2].split(), set(sys.argv[3].split())
def paras(text):
    for p in text.split("\n\n"):
        m = re.search(r"^Package: (\S+)", p, re.M)
        if m:
            yield m.group(1), p
def field(p, name):
    m = re.search(rf"^{name}: (.*(?:\n .*)*)", p, re.M)
    return m.group(1).replace("\n", " ") if m else ""
def bare(d):  # "libfoo:any (>= 1)" -> "libfoo"
    return re.sub(r"\(.*?\)", "", d).strip().split(":")[0]
def groups(p):
    for g in (field(p, "Pre-Depends") + "," + field(p, "Depends")).split(","):
        alts = [bare(a) for a in g.split("|") if bare(a)]
        if alts:
            yield alts
def provides(pk):
    prov = {}
    for n, p in pk.items():
        prov.setdefault(n, []).insert(0, n)
        for d in field(p, "Provides").split(","):
            if bare(d):
                prov.setdefault(bare(d), []).append(n)
    return prov
inst = {n: p for n, p in paras(open("/var/lib/dpkg/status", encoding="utf-8").read())
        if re.search(r"^Status: .* installed$", p, re.M)}
iprov = provides(inst)
todo = [n for n, p in inst.items() if re.search(r"^(Priority: required|Essential: yes)$", p, re.M)]
todo += [r for r in base_roots if r in inst]
base = set()
while todo:
    n = todo.pop()
    if n in base:
        continue
    base.add(n)
    for alts in groups(inst[n]):
        for a in alts:
            if a in iprov:
                todo.append(iprov[a][0])
                break
for must in ("libc6", "libstdc++6", "libgcc-s1", "g++", "gcc"):
    if must not in base:
        sys.exit(f"closure: the baseline lacks {must}: install build-essential here first")
in_base = set()
for n in base:
    in_base.add(n)
    in_base.update(bare(d) for d in field(inst[n], "Provides").split(",") if bare(d))
avail = dict(paras(subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                                  check=True).stdout))
aprov = provides(avail)
kit, todo = set(), list(roots)
while todo:
    n = todo.pop()
    if n in kit:
        continue
    if n not in avail:
        sys.exit(f"closure: package {n} is not available (apt-get update first?)")
    kit.add(n)
    for alts in groups(avail[n]):
        if any(a in in_base or a in skip or a in kit for a in alts):
            continue
        pick = next((aprov[a][0] for a in alts if a in aprov), None)
        if pick is None:
            sys.exit(f"closure: {n} depends on {' | '.join(alts)}, none available")
        todo.append(pick)
for n in sorted(kit):
    print(n, re.search(r"^Version: (\S+)", avail[n], re.M).group(1))
EOF
}

cmd_pack() {
  if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    die "pack runs on a Debian machine (apt-get, dpkg-deb)"
  fi
  command -v python3 >/dev/null || die "pack needs python3"
  local arch
  arch="$(dpkg --print-architecture)"
  [ "$arch" = amd64 ] || note "packing for $arch: the GPU machine must be $arch too"
  rm -rf "$kit"
  mkdir -p "$kit/debs"
  note "resolving the dependency closure of ${kit_packages[*]}"
  closure "${kit_packages[@]}" >"$kit/manifest.tmp" || die "dependency closure failed"
  local specs=()
  while read -r name version; do specs+=("$name=$version"); done <"$kit/manifest.tmp"
  note "downloading ${#specs[@]} packages"
  if ! (cd "$kit/debs" && apt-get download -q -o APT::Sandbox::User=root "${specs[@]}" >/dev/null); then
    note "apt-get download failed; running apt-get update and retrying"
    apt-get update -qq
    (cd "$kit/debs" && apt-get download -q -o APT::Sandbox::User=root "${specs[@]}" >/dev/null) || die "apt-get download failed"
  fi
  {
    echo "# ncf_dist GPU kit: Debian packages (name version size file), $(date -u +%FT%TZ)"
    echo "# from: $(os_name), architecture $arch"
    local name version f
    while read -r name version; do
      f="$(cd "$kit/debs" && ls "${name}"_*.deb)"
      echo "$name $version $(stat -c %s "$kit/debs/$f") $f"
    done <"$kit/manifest.tmp"
  } >"$kit/manifest.txt"
  rm -f "$kit/manifest.tmp"
  local commit
  commit="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  if [ "$commit" != unknown ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit-dirty"
  fi
  echo "$commit" >"$kit/commit"
  local kit_bytes tree_bytes total_mib
  kit_bytes=$(du -sb "$kit" | cut -f1)
  tree_bytes=$( (git -C "$root" ls-files -z 2>/dev/null || true) |
    (cd "$root" && xargs -0 -r stat -c %s 2>/dev/null) | awk '{s += $1} END {print s + 0}')
  total_mib=$(( (kit_bytes + tree_bytes + 1048575) / 1048576 ))
  if [ "$kit_bytes" -gt $((kit_limit_mib * 1048576)) ]; then
    die ".gpu-kit is $((kit_bytes / 1048576)) MiB, over $kit_limit_mib MiB: add packages to kit_skip"
  fi
  cat <<EOF
$prog: packed $(wc -l <"$kit/debs/../manifest.txt" | awk '{print $1 - 2}') Debian packages for commit $commit
  .gpu-kit: $(awk -v b="$kit_bytes" 'BEGIN{printf "%.1f", b / 1048576}') MiB ($kit/manifest.txt lists them)
  checkout (tracked files): $(awk -v b="$tree_bytes" 'BEGIN{printf "%.1f", b / 1048576}') MiB; together about $total_mib MiB
Bring along the checkout plus this one git-ignored path:
  .gpu-kit
On the GPU machine, from the repository root:
  bash scripts/gpu_kit.sh run            # or: run build, run tests, run bench, run step
EOF
}

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

# unpack: the .debs into $kit_prefix (once per manifest), with the links the packages'
# postinst would make with update-alternatives (OpenBLAS, Open MPI).
unpack() {
  local prefix="$kit_prefix" stamp="$kit_prefix/.unpacked" want ctl="$kit_prefix/.control"
  want="$(cat "$kit/manifest.txt"; echo "unpack layout 2 (merged usr, alternatives)")"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "already unpacked in $prefix"
    return 0
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix" "$ctl"
  local deb name tmp
  for deb in "$kit"/debs/*.deb; do
    name="$(basename "$deb" .deb)"
    mkdir -p "$ctl/$name"
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$prefix"
      dpkg-deb -e "$deb" "$ctl/$name"
    else
      command -v ar >/dev/null 2>&1 || die "neither dpkg-deb nor ar (binutils) is installed"
      tmp="$(mktemp -d)"
      (cd "$tmp" && ar x "$deb")
      tar -xf "$tmp"/data.tar.* -C "$prefix"
      tar -xf "$tmp"/control.tar.* -C "$ctl/$name"
      rm -rf "$tmp"
    fi
  done
  # Merged /usr, as the packages' target systems have it: /lib/x86_64-linux-gnu/libnl-3.so.200
  # (Debian 12 still ships some files under /lib, /bin, /sbin) goes to usr/lib/..., and
  # lib, bin, sbin become links to their usr/ twins.
  local d
  for d in lib lib64 bin sbin; do
    if [ -d "$prefix/$d" ] && [ ! -L "$prefix/$d" ]; then
      mkdir -p "$prefix/usr/$d"
      cp -a "$prefix/$d/." "$prefix/usr/$d/"
      rm -rf "${prefix:?}/$d"
      ln -s "usr/$d" "$prefix/$d"
    fi
  done
  # update-alternatives --install LINK NAME PATH PRIO [--slave LINK NAME PATH]...
  local link target n=0
  while read -r link target; do
    [ -e "$prefix$target" ] || continue
    mkdir -p "$(dirname "$prefix$link")"
    ln -sfnr "$prefix$target" "$prefix$link"
    n=$((n + 1))
  done < <(cat "$ctl"/*/postinst 2>/dev/null | tr '\t' ' ' | sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' |
    grep -E 'update-alternatives.*--install' |
    grep -oE -- '--(install|slave) +[^ ]+ +[^ ]+ +[^ ]+' | awk '{print $2, $4}')
  # cblas.h where a plain #include <cblas.h> finds it (the alternative libblas.so-dev makes).
  local ma inc
  ma="$(multiarch "$prefix/usr/lib")"
  inc="$prefix/usr/include/$ma"
  if [ -d "$inc/openblas-pthread" ]; then
    for f in "$inc"/openblas-pthread/*.h; do ln -sfnr "$f" "$inc/$(basename "$f")"; done
  fi
  echo "unpacked $(find "$kit/debs/" -name '*.deb' | wc -l) packages into $prefix ($n alternative links)"
  echo "$want" >"$stamp"
}

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
  python3 - "$1" "$2" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = rows[-1]
if sys.argv[2] == "throughput":
    print(f"{r['samples_per_second']:,.0f} samples/s (epoch {r['epoch']}, W {r.get('world', 1)}, "
          f"loss {r['loss']:.5f})")
else:
    spent = 0.0
    for r in rows:
        spent += r["train_seconds"] + r["eval_seconds"]
        if r["hr"] >= 0.635:
            print(f"HR@10 {r['hr']:.4f} >= 0.635 at epoch {r['epoch']}, {spent:.1f} s train+eval")
            break
    else:
        print(f"0.635 not reached in {len(rows)} epochs; best HR@10 "
              f"{max(x['hr'] for x in rows):.4f}, {spent:.1f} s")
EOF
}

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

# ---- tests ------------------------------------------------------------------------------------------
do_ctest() { ours env NCF_REQUIRE_GPU="$2" ctest --test-dir "$build" -L "$1" --output-on-failure --no-tests=error -j "$3"; }
san_parity="${NCF_KIT_PARITY_FILTER:-Parity.Fill:Parity.GmfForwardBackwardOnStridedRows:Parity.HeadForwardBackward:Parity.SortReduceRowsBitExact:Parity.BucketizeByOwnerExact:Parity.UniqueIdsExact:Parity.ReduceUpdateRowsEveryOptimizer:Parity.BadRowLeavesTablesAloneWithEveryOptimizer:Parity.TopKRefusesExcludedItemsOutsideTheRow}"
# nccl_probe_only LOG: true when every error compute-sanitizer counted in LOG is an API error
# "no kernel image" whose innermost host frame is in libnccl (NCCL's kernel probe).
nccl_probe_only() {
  awk '/ERROR SUMMARY: [0-9]+ error/ {total += $(NF - 1); next}
    /Program hit .* on CUDA API call/ {head = /cudaErrorNoKernelImageForDevice/; frame = 1; next}
    frame && /Host Frame:/ {if (head && / in libnccl\.so/) probe++; frame = 0}
    END {
      if (total > 0 && probe == total) {
        printf "gpu_kit: %d API errors, all NCCL probing its kernel images (libnccl), not counted\n", probe
        exit 0
      }
      exit 1
    }' "$1"
}
do_sanitizer() {
  local tool=$1 rc=0 cs
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  local sc=("$cs" --tool "$tool" --error-exitcode 99)
  [ "$tool" = memcheck ] && sc+=(--leak-check no --padding 64)
  # NCF_SCRATCH_DEBUG=separate: every array an op takes from the scratch arena is an
  # allocation of its own, so memcheck sees an overrun from one array into the next, and
  # initcheck a read of an array no kernel of this op wrote (the arena would hide both).
  local dbg=(env NCF_SCRATCH_DEBUG=separate)
  if [ "$tool" != initcheck ]; then
    echo "== test_pipeline_gpu"
    # NCCL probes its kernels with cudaFuncGetAttributes at communicator creation and
    # takes "no kernel image" for the architectures its build lacks; memcheck reports those
    # API errors. They are NCCL's own, handled by NCCL: counted apart, not failures. Any
    # other error (an access, a leak, an API error outside libnccl) still fails the stage.
    local logf prc=0
    logf="$(mktemp)"
    ours env NCF_REQUIRE_GPU=1 "${sc[@]}" "$build/tests/test_pipeline_gpu" >"$logf" 2>&1 || prc=$?
    cat "$logf"
    if [ "$prc" -ne 0 ]; then
      # forgiven only when the tests themselves passed and the sanitizer's errors are all
      # NCCL's probe (exit 99 is --error-exitcode's)
      [ "$prc" -eq 99 ] && grep -q '^\[  PASSED  \]' "$logf" && ! grep -q '^\[  FAILED  \]' "$logf" &&
        nccl_probe_only "$logf" || rc=1
    fi
    rm -f "$logf"
  fi
  echo "== test_parity_gpu --gtest_filter=$san_parity (NCF_SCRATCH_DEBUG=separate)"
  ours "${dbg[@]}" NCF_REQUIRE_GPU=1 "${sc[@]}" "$build/tests/test_parity_gpu" \
    --gtest_filter="$san_parity" || rc=1
  echo "== ncf_dist --device cuda --max_steps 20 (NCF_SCRATCH_DEBUG=separate)"
  ours "${dbg[@]}" "${sc[@]}" "$build/src/ncf_dist" --device cuda --data_dir "$data/small" \
    --train_epochs 1 --max_steps 20 --progress off || rc=1
  return "$rc"
}
do_parity() {
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_parity_gpu" --gtest_brief=1
}
fig_parity() {
  grep -hE '^\[  (PASSED|FAILED|SKIPPED) +\]' "$1" | grep -v ', listed below' | tr '\n' ' ' | cut -c1-160
}
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
do_small_data() {
  [ -f "$data/small/metadata.json" ] && { echo "have $data/small"; return 0; }
  ours "$build/src/ncf_prep" --synthetic small --output "$data/small"
}
do_determinism() {
  local d="$out/determinism" run
  rm -rf "$d"; mkdir -p "$d"
  # runs 1 and 2 eager, run graph with each step after the first of its size as one CUDA graph
  for run in 1 2 graph; do
    local graph=off
    [ "$run" = graph ] && graph=on
    ours "$build/src/ncf_dist" --device cuda --data_dir "$data/small" --train_epochs 2 \
      --progress off --cuda_graph "$graph" --save_params "$d/params_$run.bin" \
      --metrics_json "$d/metrics_$run.jsonl" || return 1
    # timings differ between runs; everything else must not
    sed -E 's/"[A-Za-z_]*(seconds|per_second|_s)": *[-0-9.eE+]+,? *//g' "$d/metrics_$run.jsonl" >"$d/metrics_$run.cmp"
  done
  cmp "$d/params_1.bin" "$d/params_2.bin" && cmp "$d/metrics_1.cmp" "$d/metrics_2.cmp" &&
    echo "identical: $(stat -c %s "$d/params_1.bin") bytes of parameters, $(wc -l <"$d/metrics_1.cmp") metric lines" ||
    return 1
  cmp "$d/params_1.bin" "$d/params_graph.bin" && cmp "$d/metrics_1.cmp" "$d/metrics_graph.cmp" &&
    echo "--cuda_graph on: identical to the eager runs"
}

# The order gives a short GPU window the most: the parity suite, the sanitizers and one
# profile of ml-20m steps first; the whole GPU label, determinism and the CPU tests (which
# CI runs anyway) after them.
run_tests() {
  built || { record tests FAIL "no build in $build" 0; return 0; }
  local j
  j=$(nproc)
  stage parity 1 180 fig_parity -- do_parity
  stage data_small 0 120 fig_tail -- do_small_data
  local tool
  for tool in memcheck initcheck racecheck synccheck; do
    stage "sanitizer_$tool" 1 150 fig_sanitizer -- do_sanitizer "$tool"
  done
  if [ "$have_gpu" = 1 ]; then
    stage data_ml20m 0 240 fig_tail -- do_m20_data
  else
    record data_ml20m "no GPU" "only the GPU runs read it" 0
  fi
  stage profile_steps 1 120 fig_tail -- do_profile_steps
  stage profile_kernels 1 180 fig_tail -- do_profile_kernels
  stage ctest_gpu 1 300 fig_ctest -- do_ctest gpu 1 1
  stage determinism 1 120 fig_tail -- do_determinism
  stage ctest_cpu 0 420 fig_ctest -- do_ctest cpu 0 "$j"
}

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
  python3 - "$out/kernels.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
cases = j["cases"]
bad = [c["name"] for c in cases if str(c.get("check", "ok")).startswith("FAIL")]
print(f"{len(cases)} kernels at batch {j.get('batch')}; " + (f"check not ok: {', '.join(bad)}" if bad else "all checks ok"))
EOF
}
mpirun_args=(--oversubscribe --bind-to none --mca btl '^openib,ofi' --mca pml ob1
  --mca btl_vader_single_copy_mechanism none)

do_pytorch() {
  local bs=$1
  theirs python3 - "$root/bench/pytorch_neumf.py" "$m20/metadata.json" "$bs" <<'EOF'
# The NeuMF of bench/pytorch_neumf.py on the GPU: same model and Adam, random ids over the
# synthetic ml-20m sizes, the ml-20m-mlperf batch; eager FP32, TF32, AMP (bf16 autocast),
# and torch.compile where they work.
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("pytorch_neumf", sys.argv[1])
sys_argv, sys.argv = sys.argv, [sys.argv[0]]
pn = importlib.util.module_from_spec(spec); spec.loader.exec_module(pn)
sys.argv = sys_argv
import torch
from torch import nn
meta = json.load(open(sys.argv[2]))
def count(*keys):
    for k in keys:
        for d in (meta, meta.get("counts", {})):
            if isinstance(d, dict) and k in d:
                return int(d[k])
    raise KeyError(keys)
U, I = count("num_users", "users"), count("num_items", "items")
p = pn.PRESETS["ml-20m-mlperf"]
B = int(sys.argv[3]) // (1 + p["num_neg"]) * (1 + p["num_neg"])
dev = torch.device("cuda")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, U {U}, I {I}, batch {B}")
results = {}
def run(label, amp=False, tf32=False, compile_=False, steps=30, warmup=10):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    model = pn.NeuMF(U, I, p["factors"], p["layers"]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=p["lr"], betas=(p["beta1"], p["beta2"]), eps=p["eps"])
    fwd = torch.compile(model) if compile_ else model
    loss_fn = nn.BCEWithLogitsLoss()
    pool = [(torch.randint(0, U, (B,), device=dev), torch.randint(0, I, (B,), device=dev),
             (torch.rand(B, device=dev) < 1 / (1 + p["num_neg"])).float()) for _ in range(4)]
    def step(k):
        u, i, y = pool[k % len(pool)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = fwd(u, i)
        loss = loss_fn(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    for k in range(warmup):
        step(k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        loss = step(k)
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    results[label] = steps * B / s
    print(f"{label}: {steps} steps in {s:.3f} s = {steps * B / s:,.0f} samples/s, loss {loss.item():.4f}", flush=True)
for label, kw in [("fp32", {}), ("tf32", dict(tf32=True)), ("amp_bf16", dict(tf32=True, amp=True)),
                  ("compile_tf32", dict(tf32=True, compile_=True)),
                  ("compile_amp_bf16", dict(tf32=True, amp=True, compile_=True))]:
    try:
        run(label, **kw)
    except Exception as e:  # torch.compile needs a working Triton / C compiler
        print(f"{label}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
print(json.dumps(dict(bench="pytorch_neumf_gpu", users=U, items=I, batch=B, samples_per_s=results)))
if not results:
    sys.exit(1)
EOF
}
fig_pytorch() {
  python3 - "$1" "$out/train_tf32_throughput.jsonl" <<'EOF'
import json, re, sys
best = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^([a-z_0-9]+): \d+ steps in [\d.]+ s = ([\d,]+) samples/s", line)
    if m and (best is None or int(m.group(2).replace(",", "")) > best[1]):
        best = (m.group(1), int(m.group(2).replace(",", "")))
ours = None
try:
    ours = [json.loads(l) for l in open(sys.argv[2]) if l.strip()][-1]["samples_per_second"]
except (OSError, IndexError, KeyError, ValueError):
    pass
torch_fig = f"{best[1]:,} samples/s ({best[0]})" if best else "none"
ours_fig = f"{ours:,.0f} samples/s" if ours else "n/a"
ratio = f"; ncf_dist / PyTorch {ours / best[1]:.2f}x" if best and ours else ""
print(f"PyTorch best {torch_fig}; ncf_dist tf32 {ours_fig}{ratio}")
EOF
}

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

# ---- step ------------------------------------------------------------------------------------------------
# The GPU step's kernels, old against new, in one call of about 6 minutes after the build:
# first what shows a broken kernel (the parity of the changed ops, the streaming kernels
# against the legacy ones bit for bit, NeuMF's fused top against the unfused ops, the
# BF16-storage ops and NeuMF on them against the CPU, two identical runs), then the speed (the changed ops
# in both variants at B = 1,048,575; ncf_dist ml-20m-mlperf steps 10-40 under tf32 and
# bf16, legacy and streaming, each against bench/step_floor.py's floor; an epoch's
# samples/s; the top kernels per step), then ncf_dist's HR@10 after 3 epochs and PyTorch's
# variants (bench/pytorch_variants.py) on the same GPU, data, batch and epochs.
step_parity_filter="${NCF_KIT_STEP_PARITY_FILTER:-Parity.StreamingStepKernelsAreTheLegacyKernelsBitForBit:Parity.StreamingBf16CopiesAreTheLegacyOnesBitForBit:Parity.Bf16StorageOpsTrackTheCpuTwins:Parity.TopOnBf16StorageIsTheFp32TopOfTheSameValuesOnTheGpu:Parity.NeuMFOnBf16StorageTracksTheCpuAndRepeatsItself:Parity.GemmBf16*:Parity.FusedTopIsTheUnfusedOpsOnTheGpu:Parity.HeadForwardBackward:Parity.GroupOpsForwardAndBackward:Parity.LinearBackward*:Parity.ColumnSumsAtLargeBatches:Parity.TrainStep*:Parity.GatherBiasActIsTheCpuTwinBitForBit:Parity.GatherRowsExactWithDuplicates:Parity.DenseAdamOverSteps:Parity.ReduceUpdateRowsEveryOptimizer:Parity.Bf16MaskAndGroupSumAtEveryWidthAreTheCpuTwinsBitForBit:Parity.Layer0BitMaskIsTheGpuOutputsSignAndMasksAsYDoes:Parity.LinearBackwardMasksDxByTheLayerBelowsBitsOnTheGpu:Parity.ScoreItemsTracksTheCpuTwinAndForward:Parity.FusedScoreItemsTracksTheOpsItFuses:Parity.NeuMFScoresItemsInOneKernelWhereAsked:Parity.HitNdcgAccumulateAddsEachBatchsSumsOnTheDevice:Parity.TopForwardReadsItemRowsByIdAsGatheredOnTheGpu:Parity.Layer0ByItemOpsAreTheCpuTwinsBitForBit:Parity.NeuMFLayer0ByItemTracksTheCpuAndRepeatsItself:Parity.NegativesBitIdenticalToCpu:Parity.NarrowItemLookupStepIsTheWholeRowStepBitForBit:Parity.DenseAdamGivenColumnsAreTheirFirstRowSums:Parity.BadRowLeavesTablesAloneWithEveryOptimizer}"
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
  python3 - "$out/step_kernels.json" <<'EOF'
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
bad = [c["name"] for c in cases if str(c.get("check", "ok")).startswith("FAIL")]
parts = [f"{c['name']} {c['median_ms']:.2f} ms" for c in cases]
print(("FAIL: " + ", ".join(bad) + "; " if bad else "") + "; ".join(parts))
EOF
}
do_step_train() {  # PRECISION KERNELS [FLAGS...]: 40 ml-20m-mlperf steps, each one's phases on its line
  ours env NCF_STEP_KERNELS="$2" "$build/src/ncf_dist" --data_dir "$m20" \
    --preset ml-20m-mlperf --device cuda --precision "$1" --train_epochs 1 --max_steps 40 \
    --no_eval --step_log --progress off "${@:3}"
}
do_step_train_env() {  # "VAR=VALUE ..." PRECISION KERNELS: do_step_train with those variables
  local vars=$1
  shift
  # shellcheck disable=SC2086,SC2163  # one word per variable, each exported
  (export $vars && do_step_train "$@")
}
fig_step_train() {  # the median over steps 10-40 of exchange + compute + allreduce, vs the floor
  local precision gpu med
  precision=$(basename "$1" .log | cut -d_ -f2)
  med=$(python3 - "$1" <<'EOF'
import re, statistics, sys
ms, samples = [], 0
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s*step (\d+): (\d+) samples, exchange ([\d.]+) ms, compute ([\d.]+) ms, allreduce ([\d.]+) ms", line)
    if m and 10 <= int(m.group(1)) <= 40:
        ms.append(float(m.group(3)) + float(m.group(4)) + float(m.group(5)))
        samples = int(m.group(2))
if ms:
    print(f"{statistics.median(ms):.3f} {samples} {len(ms)}")
EOF
)
  [ -n "$med" ] || { echo "no step lines"; return 0; }
  read -r ms samples steps <<<"$med"
  gpu=$(theirs nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  echo "median step $ms ms over $steps steps = $(python3 -c "print(f'{$samples / $ms / 1e3:.1f}')") M samples/s; $(python3 "$root/bench/step_floor.py" --gpu "${gpu:-H200}" --precision "$precision" --batch "$samples" --measured_ms "$ms" 2>&1)"
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
do_nccl_resume() {  # a checkpoint of 4 NCCL ranks on the GPU resumed by 1 GPU rank and 2 CPU ranks
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_train_gpu" --gtest_brief=1 \
    --gtest_filter='TrainGpu.ANcclCheckpointResumesOnOneGpuRankAndOnTwoCpuRanks'
}
fig_ctest_filter() { grep -hE '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' ' | cut -c1-200; }
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
# Several NCCL ranks on the one GPU (issue: NCCL refuses two ranks with the same host hash
# and PCI bus id; a host id of each rank's own, NCCL_HOSTID, should make them look like
# ranks of different hosts that talk over sockets on loopback): bench_nccl_share checks an
# allreduce and a send/recv ring; --same_host records NCCL's refusal without the ids.
do_nccl_share() {  # W [--same_host]
  ours env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$(command -v mpirun)" -np "$1" \
    "${mpirun_args[@]}" "$build/bench/bench_nccl_share" --floats 4194304 "${@:2}"
}
do_nccl_refusal() {  # the same without the ids: NCCL's words, recorded, not a failure
  do_nccl_share 2 --same_host || echo "exit $? (NCCL refuses ranks on one GPU of one host)"
}
do_nccl_dist() {  # W: ncf_dist over NCCL with W ranks on the one GPU, one NCCL_HOSTID each
  # shellcheck disable=SC2016  # expanded by each rank's sh
  ours env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 "$(command -v mpirun)" -np "$1" \
    "${mpirun_args[@]}" sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
    "$build/src/ncf_dist" --device cuda --comm nccl --data_dir "$data/small" --train_epochs 2 \
    --progress off
}
# Two NCCL ranks on the GPU (one NCCL_HOSTID each); rank 1 is stopped (SIGSTOP) in its
# 20th step. Rank 0 must end within --peer_timeout 20 + 10 s, naming its rank, host and
# the collective it waited in (the NCCL communicator's stalled-collective check; the
# peer watch is off, so that it is this path that ends it).
do_nccl_stop() {
  local log="$out/nccl_stop.out" pid p r1="" t0 rc=0
  # shellcheck disable=SC2016  # expanded by each rank's sh
  ours env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 "$(command -v mpirun)" -np 2 \
    "${mpirun_args[@]}" sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
    "$build/src/ncf_dist" --device cuda --comm nccl --data_dir "$data/small" --train_epochs 1000 \
    --step_log --progress off --peer_timeout 20 --peer_lost_after 0 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 900); do
    grep -q '^ *step 20:' "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  for p in $(pgrep -f "$build/src/ncf_dist"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && r1=$p
  done
  if [ -z "$r1" ]; then
    echo "rank 1 not found (the run: $(tail -n 3 "$log" | tr '\n' ' '))"
    kill "$pid" 2>/dev/null
    return 1
  fi
  kill -STOP "$r1"
  t0=$(date +%s)
  while kill -0 "$pid" 2>/dev/null && [ $(($(date +%s) - t0)) -lt 90 ]; do sleep 1; done
  kill -KILL "$r1" 2>/dev/null
  kill -CONT "$r1" 2>/dev/null
  wait "$pid" || rc=$?
  grep -h 'ncf_dist: error' "$log" | head -n 4
  echo "rank 1 stopped: the launcher exited $rc after $(($(date +%s) - t0)) s (limit 20 + 10 s)"
  grep -q '^ncf_dist: error: \[rank 0 on .*waited .* in NCCL ' "$log" &&
    [ $(($(date +%s) - t0)) -le 30 ]
}
# Four NCCL ranks on the GPU in 2 declared nodes of 2 (--topology ranks_per_node=2, one
# NCCL_HOSTID each): two_hop must end with flat's parameters byte for byte, --dedup node
# must repeat itself; the figure names NCCL's version and the transport it chose.
do_nccl_two_hop() {
  local tag rc=0 d="$out/nccl_two_hop"
  mkdir -p "$d"
  for tag in flat two node_a node_b; do
    local flags=(--shard_plan row --dedup on --exchange flat)
    case $tag in
      two) flags=(--shard_plan row --dedup on --exchange two_hop) ;;
      node_*) flags=(--shard_plan row --dedup node --exchange two_hop) ;;
    esac
    # shellcheck disable=SC2016  # expanded by each rank's sh
    ours env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
      "$(command -v mpirun)" -np 4 "${mpirun_args[@]}" \
      sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
      "$build/src/ncf_dist" --device cuda --comm nccl --data_dir "$data/small" --train_epochs 2 \
      --progress off --topology ranks_per_node=2 "${flags[@]}" --save_params "$d/$tag.bin" \
      >"$d/$tag.out" 2>&1 || { echo "$tag: exit $?: $(grep -h 'error' "$d/$tag.out" | head -n 2)"; rc=1; }
    grep -h '^ncf_dist: \(nodes\|exchange\):' "$d/$tag.out" | sed "s/^/$tag: /" | cut -c1-160
  done
  if cmp -s "$d/flat.bin" "$d/two.bin"; then
    echo "fig: two_hop's parameters are flat's byte for byte"
  else
    echo "fig: two_hop's parameters differ from flat's"
    rc=1
  fi
  if cmp -s "$d/node_a.bin" "$d/node_b.bin"; then
    echo "fig: node dedup repeats itself"
  else
    echo "fig: two node dedup runs differ"
    rc=1
  fi
  echo "fig: $(grep -ohE 'NCCL version [0-9.+a-z]*|via (NET/[A-Za-z]+|P2P[^ ]*|SHM[^ ]*)' \
    "$d/two.out" | sort -u | paste -s -d ' ')"
  return "$rc"
}
fig_nccl_two_hop() { grep -h '^fig: ' "$1" | cut -c6- | paste -s -d ';' | cut -c1-220; }
fig_nccl_share() {
  { grep -h '^bench_nccl_share: NCCL' "$1" | tail -n 1
    grep -ohE 'via (NET/[A-Za-z]+|P2P[^ ]*|SHM[^ ]*)' "$1" | sort -u | paste -s -d ' '
    grep -hE 'Duplicate GPU|ncclCommInitRank: ' "$1" | head -n 1; } | paste -s -d ';' | cut -c1-220
}
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
# HR@10 after 3 epochs of ncf_dist on the GPU (the figure: the last epoch's HR@10), the
# figure pytorch_variants' HR@10 is held to.
do_step_hr_ours() {
  train_m20 step_hr_ours "$build/src/ncf_dist" --precision tf32 --train_epochs 3
}
fig_step_hr() {
  python3 - "$out/step_hr_ours.jsonl" <<'EOF'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
r = rows[-1] if rows else None
print(f"ncf_dist HR@10 {r['hr']:.4f} after epoch {r['epoch']}, "
      f"{r['samples_per_second']:,.0f} samples/s" if r else "ncf_dist: no metrics")
EOF
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
  python3 - "$out/pytorch_variants.jsonl" "$1" "$out/step_tf32_streaming.log" \
    "$out/step_bf16_streaming.log" "$out/step_hr_ours.jsonl" <<'EOF'
import json, re, statistics, sys
def lines(path):
    try:
        return [json.loads(l) for l in open(path, errors="replace") if l.startswith("{")]
    except (OSError, ValueError):
        return []
recs = [r for r in lines(sys.argv[1]) if r.get("kind") == "variant"]
summary = next((r for r in lines(sys.argv[2]) if r.get("kind") == "summary"), None)
if not recs:
    print("no variant records")
    sys.exit(0)
parts = []
for r in recs:
    if r["status"] != "ok":
        parts.append(f"{r['variant']} failed")
        continue
    c = {True: "counts", False: "off", None: "?"}[r.get("counts")]
    parts.append(f"{r['variant']} {r['samples_per_s'] / 1e6:.1f}M/s HR {r['hr'][-1]:.4f} {c}")
def ours(path):
    ms, samples = [], 0
    try:
        for line in open(path, errors="replace"):
            m = re.match(r"\s*step (\d+): (\d+) samples, exchange ([\d.]+) ms, compute ([\d.]+) ms, allreduce ([\d.]+) ms", line)
            if m and 10 <= int(m.group(1)) <= 40:
                ms.append(float(m.group(3)) + float(m.group(4)) + float(m.group(5)))
                samples = int(m.group(2))
    except OSError:
        pass
    return samples / statistics.median(ms) * 1e3 if ms else None
# the summary's choice; without it (the run cut short), the fastest counting variant so far
best = (summary or {}).get("fastest_counting")
if best is None:
    best = {}
    for r in recs:
        b = best.get(r["precision"])
        if r.get("counts") and (b is None or r["samples_per_s"] > b[1]):
            best[r["precision"]] = (r["variant"], r["samples_per_s"])
    best = {k: v[0] for k, v in best.items()}
for prec, path in (("tf32", sys.argv[3]), ("bf16", sys.argv[4])):
    v = best.get(prec)
    mine = ours(path)
    theirs = next((r["samples_per_s"] for r in recs if r["variant"] == v), None) if v else None
    if v and mine and theirs:
        parts.append(f"ncf_dist/{v} {mine / theirs:.2f}x")
    else:
        parts.append(f"ncf_dist/best {prec}: n/a")
hr = lines(sys.argv[5])
if hr and "hr" in hr[-1]:
    parts.append(f"ncf_dist HR {hr[-1]['hr']:.4f}")
print("; ".join(parts))
EOF
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
  stage data_ml20m 0 240 fig_tail -- do_m20_data
  local p k
  for p in tf32 bf16; do
    for k in legacy streaming; do
      stage "step_${p}_${k}" 1 90 fig_step_train -- do_step_train "$p" "$k"
    done
  done
  # each step after the first as one CUDA graph (--cuda_graph on), against streaming above
  for p in tf32 bf16; do
    stage "step_${p}_graph" 1 90 fig_step_train -- do_step_train "$p" streaming --cuda_graph on
  done
  # layer 0's mask in layer 1's dX epilogue (NCF_LT_DRELU=1) instead of its group sums
  stage step_tf32_drelu 1 90 fig_step_train -- do_step_train_env NCF_LT_DRELU=1 tf32 streaming
  # the BF16 layers above layer 0 as GEMM + epilogue kernel (NCF_LT_BF16_OUT=0), the
  # path their cuBLASLt BF16 epilogue replaced
  stage step_bf16_no_lt_out 1 90 fig_step_train -- \
    do_step_train_env NCF_LT_BF16_OUT=0 bf16 streaming
  # Kernels kept selectable, each step_PRECISION_NAME with its variables, in this order:
  #   2blocks      the kernels capped for 3 blocks per SM as they were, at 2
  #   neg_one      negatives searched one draw at a time, as before the lock-step rounds
  #   sums_thread  layer 0's per-item sums with each thread loading its rows' indices, as
  #                before a warp's indices came 32 at a time, a chunk ahead
  #   scatter_one  the items' MLP gradients put back on the samples one sample per thread,
  #                as before four per thread; the narrow item lookup, which skips that pass,
  #                off: against whole_rows
  #   whole_rows   the samples' item rows looked up and their gradients reduced whole, as
  #                before layer 0 read its runs' MLP columns from the item table and handed
  #                the update their gradient by item
  #   by_sample    layer 0's items' half once per sample, the path layer 0 by item replaced
  local v
  for v in "2blocks:NCF_3BLOCK_KERNELS=0" "neg_one:NCF_NEGATIVES_AHEAD=0" \
    "sums_thread:NCF_RUN_SUMS_WARP=0" \
    "scatter_one:NCF_NARROW_ITEM_LOOKUP=0 NCF_SCATTER_BY_FOUR=0" \
    "whole_rows:NCF_NARROW_ITEM_LOOKUP=0" "by_sample:NCF_L0_BY_ITEM=0"; do
    for p in tf32 bf16; do
      stage "step_${p}_${v%%:*}" 1 90 fig_step_train -- do_step_train_env "${v#*:}" "$p" streaming
    done
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
  case "$what" in build | tests | bench | step | all) ;; *) die "run: unknown '$what' (build, tests, bench, step, all)" ;; esac
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
    all) run_tests; run_bench ;;
  esac
  write_info
  write_summary
  archive
  cat "$out/summary.md"
  note "results in $out ($(($(date +%s) - t_start)) s)"
  [ "$failures" -eq 0 ]
}

# ======================================================================================
# rehearse
# ======================================================================================
mounts=()
cleanup_mounts() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  mounts=()
}
bind() {  # SRC DST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}
debian_mirror() {  # the first Debian (not security) URI of this machine's apt sources
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri="$(awk '/^URIs:/{print $2}' "$f" | grep -v security | head -n 1)"
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri="$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f" |
      grep -v security | head -n 1)"
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
}

cmd_rehearse() {
  local what=${1:-all}
  case "$what" in build | tests | bench | step | all) ;; *) die "rehearse: unknown '$what' (build, tests, bench, step, all)" ;; esac
  [ "$(id -u)" = 0 ] || die "rehearse needs root (debootstrap, mount, chroot)"
  [ -f "$kit/manifest.txt" ] || die "no .gpu-kit: run 'bash scripts/gpu_kit.sh pack' first"
  local rootfs="${NCF_KIT_ROOTFS:-$root/.gpu-kit-root/bookworm}"
  if [ ! -x "$rootfs/usr/bin/cmake" ]; then
    command -v debootstrap >/dev/null 2>&1 || {
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
    }
    local mirror
    mirror="$(debian_mirror)"
    [ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list*"
    note "debootstrap bookworm into $rootfs (a few minutes; cached for the next rehearsal)"
    rm -rf "$rootfs.tmp"
    mkdir -p "$(dirname "$rootfs")"
    debootstrap --variant=minbase --include=build-essential,cmake,python3 bookworm "$rootfs.tmp" \
      "$mirror" >"$(dirname "$rootfs")/debootstrap.log" 2>&1 ||
      die "debootstrap failed, see $(dirname "$rootfs")/debootstrap.log"
    mv "$rootfs.tmp" "$rootfs"
  fi
  trap cleanup_mounts EXIT
  trap 'exit 130' INT TERM
  bind /proc "$rootfs/proc"
  bind /dev "$rootfs/dev"
  mkdir -p "$rootfs/dev/shm"
  mount -t tmpfs -o size=2g,mode=1777 tmpfs "$rootfs/dev/shm"   # Open MPI's shared memory
  mounts+=("$rootfs/dev/shm")
  bind /sys "$rootfs/sys" ro
  [ -d /usr/local/cuda/ ] && bind "$(readlink -f /usr/local/cuda)" "$rootfs/usr/local/cuda" ro
  bind "$root" "$rootfs$root"
  [ -f "$rootfs/etc/hosts" ] || printf '127.0.0.1 localhost\n::1 localhost\n' >"$rootfs/etc/hosts"
  local stamp res
  stamp="$(date -u +%F)"
  res="$root/bench/results/gpu_kit_rehearsal_$stamp"
  local inner="$root/build-kit/rehearsal-out"
  rm -rf "$inner" "$root/build-kit/rehearsal/kit-results"
  mkdir -p "$inner" "$res"
  note "rehearsal: gpu_kit.sh run $what in $rootfs, no network, no GPU"
  local rc=0 t0
  t0=$(date +%s)
  # A fresh network namespace has only a loopback, down; a real machine's is up.
  # shellcheck disable=SC2016  # expanded by the inner sh
  unshare -n -- sh -c 'ip link set lo up 2>/dev/null || true
    exec chroot "$0" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 NCF_KIT_ARCHIVE="$1" NCF_KIT_BUILD="$2" NCF_KIT_BUDGET="$3" NCF_KIT_TIMEOUT_SCALE=6 \
      NCF_KIT_BUILD_TIMEOUT=3000 NCF_KIT_PREFIX="$2-prefix" NCF_KIT_DATA="$2-data" \
      bash -c "cd \"\$0\" && bash scripts/gpu_kit.sh run \"\$1\"" "$4" "$5"' \
    "$rootfs" "$inner" "$root/build-kit/rehearsal" "${NCF_KIT_BUDGET:-7200}" "$root" "$what" || rc=$?
  note "rehearsal finished in $(($(date +%s) - t0)) s, exit $rc"
  # The archive is what a device call brings back: it must hold every stage's log.
  if ! tar tzf "$inner/results.tgz" 2>/dev/null | grep -q '^\./build\.log$'; then
    note "no build.log in $inner/results.tgz (NCF_KIT_ARCHIVE)"
    rc=1
  fi
  cp "$inner/summary.md" "$inner/info.txt" "$res/" 2>/dev/null || true
  {
    echo "# Rehearsal of scripts/gpu_kit.sh run $what on $(date -u +%FT%TZ)"
    echo "# debootstrap --variant=minbase --include=build-essential,cmake,python3 bookworm (Debian 12),"
    echo "# /usr/local/cuda bind-mounted read-only, unshare -n (no network), no GPU; wall $(($(date +%s) - t0)) s, exit $rc"
  } >"$res/rehearsal.txt"
  note "recorded $res (logs of every stage: $root/build-kit/rehearsal/kit-results, and $inner/results.tgz)"
  return "$rc"
}

main() {
  case "${1:-}" in
    pack) cmd_pack ;;
    run) shift; cmd_run "$@" ;;
    rehearse) shift; cmd_rehearse "$@" ;;
    *) die "usage: bash scripts/gpu_kit.sh pack | run [build|tests|bench|step|all] | rehearse [same]" ;;
  esac
}
# main and exit on one line: bash has read all of it before main runs, so editing this file
# while a run is under way cannot feed the running bash new lines.
main "$@"; exit
