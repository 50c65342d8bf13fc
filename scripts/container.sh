#!/usr/bin/env bash
# Builds, tests and saves the container image of docker/Dockerfile with buildah, on a
# machine without a Docker engine or a reachable image registry:
#
#   bash scripts/container.sh build [--base IMAGE] [--runtime-base IMAGE] [--cuda DIR]
#                                   [--cuda-archs LIST] [--tag NAME] [--tests]
#   bash scripts/container.sh test  [--tag NAME] [--ca-bundle FILE]
#   bash scripts/container.sh save  [--tag NAME] [--output FILE]
#   bash scripts/container.sh all   (build, test and save, with the options of each)
#
# build: without --base, makes two local base images once (reused while they exist): a
#   Debian 12 root from debootstrap (the mirror of this machine's apt sources) plus the
#   CUDA toolkit of --cuda (default /usr/local/cuda: compiler, headers, cudart, cuBLAS,
#   NCCL) as the build stage's base, and the same root with only the CUDA runtime
#   libraries (cudart, cuBLAS, cuBLASLt, NCCL) as the runtime stage's base. Then builds
#   the image (NAME), then tags its build stage NAME-build (from the layer cache), with
#   `buildah bud --isolation chroot`, and prints the image's size. --tests also runs the
#   CPU tests during the build (the Dockerfile's RUN_TESTS=1, as `docker build` does by
#   default); without it `test` runs them.
# test: in NAME-build, `ctest -L cpu`; in NAME, ncf-check (the image's first check: the
#   programs' libraries, Open MPI, the GPUs, then ranks training the small synthetic set)
#   and what the image holds, by size.
# save: NAME as an OCI archive (default build-container/ncf_dist.oci.tar), for
#   `enroot import`, `apptainer build` or `podman load`.
#
# --ca-bundle FILE|none: the CA bundle `test`'s containers see (default: this machine's
#   /etc/ssl/certs/ca-certificates.crt, mounted read-only; never part of an image).
# Logs and step times go to build-container/logs/ (NCF_CONTAINER_DIR overrides
# build-container/). Heavy steps run under `nice -n 10`. Needs root (debootstrap, and
# buildah's chroot isolation); installs buildah, podman and debootstrap when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=container.sh
work="${NCF_CONTAINER_DIR:-$root/build-container}"
logs="$work/logs"

die() {
  echo "$prog: $*" >&2
  exit 1
}
note() { echo "$prog: $*" >&2; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

# ---- options -------------------------------------------------------------------------
base=""
runtime_base=""
cuda_dir="/usr/local/cuda"
cuda_archs="80;90"
tag="localhost/ncf_dist:latest"
tests=0
ca_bundle=/etc/ssl/certs/ca-certificates.crt
output="$work/ncf_dist.oci.tar"

need_value() {  # FLAG VALUE_COUNT_LEFT VALUE
  [ "$2" -ge 2 ] || die "$1 needs a value"
  [ -n "$3" ] || die "$1 '': the value is empty"
}

[ $# -ge 1 ] || {
  usage >&2
  die "no command given (build, test, save or all)"
}
cmd="$1"
shift
case "$cmd" in
  build | test | save | all) ;;
  -h | --help)
    usage
    exit 0
    ;;
  *) die "unknown command '$cmd' (build, test, save or all)" ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --base)
      need_value "$1" $# "${2:-}"
      base="$2"
      shift 2
      ;;
    --runtime-base)
      need_value "$1" $# "${2:-}"
      runtime_base="$2"
      shift 2
      ;;
    --cuda)
      need_value "$1" $# "${2:-}"
      cuda_dir="$2"
      shift 2
      ;;
    --cuda-archs)
      need_value "$1" $# "${2:-}"
      [[ "$2" =~ ^[0-9]+[a-z]?(\;[0-9]+[a-z]?)*$ ]] ||
        die "--cuda-archs '$2': not a list of architectures such as 90 or 80;90"
      cuda_archs="$2"
      shift 2
      ;;
    --tag)
      need_value "$1" $# "${2:-}"
      tag="$2"
      shift 2
      ;;
    --output)
      need_value "$1" $# "${2:-}"
      output="$2"
      shift 2
      ;;
    --ca-bundle)
      need_value "$1" $# "${2:-}"
      [ "$2" = none ] || [ -f "$2" ] || die "--ca-bundle '$2': no such file (or 'none')"
      ca_bundle="$2"
      shift 2
      ;;
    --tests)
      tests=1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "$cmd: unknown argument '$1' (see --help)" ;;
  esac
done
case "$tag" in
  *:*) ;;
  *) tag="$tag:latest" ;;
esac
build_tag="${tag%:*}-build:${tag##*:}"

# The tests reach the npm registry (tests/onnx/install.sh); the containers of `test` get
# this machine's CA bundle, read-only and for the run only, so that they trust what it
# trusts (a TLS-inspecting proxy's CA, say); Debian's node reads the system bundle. A
# build with --tests runs them with the image's own bundle (a RUN cannot have it mounted
# over the file that the ca-certificates package writes).
ca_mount=()
if [ "$ca_bundle" != none ] && [ -f "$ca_bundle" ]; then
  ca_mount=(--volume "$(readlink -f "$ca_bundle"):/etc/ssl/certs/ca-certificates.crt:ro")
fi

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and buildah's chroot isolation)"
mkdir -p "$logs"

# ---- helpers -------------------------------------------------------------------------
ensure_tools() {  # COMMAND...: installs the Debian packages of the same names when missing
  local missing=() t
  for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] && return
  note "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# Seconds of each step, appended to logs/times.tsv (step, seconds, exit, UTC start).
timed() {  # STEP COMMAND...
  local step="$1" start rc=0 t0
  shift
  start="$(date -u +%FT%TZ)"
  t0=$(date +%s)
  "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$step" "$(($(date +%s) - t0))" "$rc" "$start" >>"$logs/times.tsv"
  note "$step: exit $rc in $(($(date +%s) - t0)) s"
  return "$rc"
}

debian_mirror() {  # the first Debian (not security) URI of this machine's apt sources
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri="$(awk '/^URIs:/{print $2}' "$f" | grep -v security | head -n 1)"
    [ -n "$uri" ] && {
      echo "$uri"
      return
    }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri="$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f" |
      grep -v security | head -n 1)"
    [ -n "$uri" ] && {
      echo "$uri"
      return
    }
  done
}

# The CUDA version of --cuda (13.0 from nvcc), which names the local base images.
cuda_version() {
  local cuda="$1"
  [ -x "$cuda/bin/nvcc" ] || die "--cuda '$cuda': no bin/nvcc there"
  "$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p'
}

# A Debian 12 root (debootstrap minbase, apt pointed at this machine's mirror), imported
# once as localhost/ncf-debian:bookworm.
make_debian_image() {
  local image=localhost/ncf-debian:bookworm rootfs="$work/rootfs" mirror
  image_exists "$image" && return
  ensure_tools debootstrap podman
  mirror="$(debian_mirror)"
  [ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list or /etc/apt/sources.list.d/"
  note "debootstrap --variant=minbase bookworm from this machine's mirror into $rootfs"
  rm -rf "$rootfs"
  nice -n 10 debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$logs/debootstrap.log" 2>&1 ||
    die "debootstrap failed, see $logs/debootstrap.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet - "$image" >/dev/null
  rm -rf "$rootfs"
}

# The files of the CUDA toolkit a stage needs, copied into a container on the Debian
# image: for "devel" the compiler and headers too, for "runtime" the shared libraries
# ncf_dist loads. /usr/local/cuda and ld.so.conf point at them, as in NVIDIA's images.
make_cuda_image() {  # devel|runtime IMAGE
  local kind="$1" image="$2" cuda ctr
  image_exists "$image" && return
  cuda="$(readlink -f "$cuda_dir")"
  for f in include/nccl.h include/cuda_runtime.h lib64/libnccl.so.2 lib64/libcudart.so.13 \
    lib64/libcublas.so.13 lib64/libcublasLt.so.13; do
    [ -e "$cuda/$f" ] || die "--cuda '$cuda_dir': $f is missing (CUDA 13 toolkit with NCCL wanted)"
  done
  make_debian_image
  note "making $image from localhost/ncf-debian:bookworm and $cuda ($kind)"
  # Staged with cp -a, so that the library links stay links in the image.
  local stage="$work/cuda-$kind" lib dest f
  lib="$(readlink -f "$cuda/lib64")"
  dest="/usr/local/$(basename "$cuda")"
  rm -rf "$stage"
  mkdir -p "$stage/lib"
  cp -a "$lib"/libcudart.so* "$lib"/libcublas.so* "$lib"/libcublasLt.so* "$lib"/libnccl.so* "$stage/lib/"
  if [ "$kind" = devel ]; then
    cp -a "$cuda/bin" "$cuda/nvvm" "$cuda/include" "$cuda/targets" "$stage/"
    for f in libcudadevrt.a libcudart_static.a libculibos.a stubs cmake; do
      if [ -e "$lib/$f" ]; then cp -a "$lib/$f" "$stage/lib/"; fi
    done
  fi
  ctr="$(buildah from --pull-never localhost/ncf-debian:bookworm)"
  buildah copy --quiet "$ctr" "$stage" "$dest" >/dev/null
  rm -rf "$stage"
  buildah run --isolation chroot "$ctr" -- sh -c "
    [ -e $dest/lib64 ] || ln -s lib $dest/lib64
    ln -sfn $dest /usr/local/cuda
    echo /usr/local/cuda/lib64 >/etc/ld.so.conf.d/cuda.conf
    ldconfig"
  buildah config --env PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env CUDA_HOME=/usr/local/cuda --label "ncf_dist.base=debian-12 + $(basename "$cuda") $kind" "$ctr"
  buildah commit --quiet --rm "$ctr" "$image" >/dev/null
}

# An image named with --base or --runtime-base: local, or pulled (on a machine that
# reaches the registry); else the flag and its value are reported.
require_image() {  # FLAG IMAGE
  image_exists "$2" && return
  note "$1 '$2' is not a local image; trying buildah pull"
  buildah pull --quiet "$2" >/dev/null 2>"$logs/pull.log" ||
    die "$1 '$2': not a local image and buildah pull failed ($(tail -n 1 "$logs/pull.log"))"
}

image_size() { buildah images --format '{{.Size}}' --filter "reference=$1" | head -n 1; }

# ---- steps ---------------------------------------------------------------------------
cmd_build() {
  ensure_tools buildah
  if [ -z "$base" ]; then
    [ -z "$runtime_base" ] || die "--runtime-base '$runtime_base' needs --base as well"
    local v
    v="$(cuda_version "$cuda_dir")"
    [ -n "$v" ] || die "--cuda '$cuda_dir': nvcc --version names no release"
    base="localhost/ncf-base:bookworm-cuda$v-devel"
    runtime_base="localhost/ncf-base:bookworm-cuda$v-runtime"
    timed base_devel make_cuda_image devel "$base"
    timed base_runtime make_cuda_image runtime "$runtime_base"
  else
    require_image --base "$base"
    if [ -z "$runtime_base" ]; then
      note "no --runtime-base: the runtime stage starts from --base '$base' too"
      runtime_base="$base"
    else
      require_image --runtime-base "$runtime_base"
    fi
  fi
  local args=(--isolation chroot --layers --pull-never -f docker/Dockerfile
    --ignorefile docker/Dockerfile.dockerignore
    --build-arg "CUDA_IMAGE=$base" --build-arg "RUNTIME_IMAGE=$runtime_base"
    --build-arg "CUDA_ARCHS=$cuda_archs" --build-arg "RUN_TESTS=$tests")
  cd "$root"
  # The image first, then its build stage under a tag of its own: the second bud finds
  # every step in the first one's layer cache, unless the tree changed in between.
  note "building $tag (CUDA_IMAGE=$base, RUNTIME_IMAGE=$runtime_base, CUDA_ARCHS=$cuda_archs," \
    "RUN_TESTS=$tests; log: $logs/build.log)"
  echo "buildah bud ${args[*]} -t $tag ." >"$logs/build.log"
  timed build nice -n 10 buildah bud "${args[@]}" -t "$tag" . >>"$logs/build.log" 2>&1 || {
    tail -n 40 "$logs/build.log" >&2
    die "the build failed, see $logs/build.log"
  }
  note "tagging the build stage as $build_tag (log: $logs/build_stage.log)"
  echo "buildah bud ${args[*]} --target build -t $build_tag ." >"$logs/build_stage.log"
  timed build_stage nice -n 10 buildah bud "${args[@]}" --target build -t "$build_tag" . \
    >>"$logs/build_stage.log" 2>&1 || {
    tail -n 40 "$logs/build_stage.log" >&2
    die "the build stage failed, see $logs/build_stage.log"
  }
  grep -A1 'STEP [0-9]*/[0-9]*: RUN cmake' "$logs/build_stage.log" | grep -q 'Using cache' ||
    note "warning: the build stage was built again (the tree changed during the build):" \
      "$build_tag is newer than $tag"
  echo "$prog: built $tag: $(image_size "$tag") (build stage $build_tag: $(image_size "$build_tag"))"
}

in_image() {  # IMAGE COMMAND...: runs COMMAND in a fresh container of IMAGE
  local image="$1" ctr rc=0
  shift
  ctr="$(buildah from --pull-never "$image")"
  nice -n 10 buildah run --isolation chroot "${ca_mount[@]}" "$ctr" -- "$@" || rc=$?
  buildah rm "$ctr" >/dev/null
  return "$rc"
}

cmd_test() {
  ensure_tools buildah
  image_exists "$build_tag" || die "--tag '$tag': there is no $build_tag; run '$prog build' first"
  image_exists "$tag" || die "--tag '$tag': no such image; run '$prog build' first"
  note "ctest -L cpu in $build_tag (log: $logs/ctest.log)"
  timed ctest_cpu in_image "$build_tag" \
    ctest --test-dir /opt/ncf_dist/build -L cpu --output-on-failure -j"$(nproc)" --timeout 900 \
    >"$logs/ctest.log" 2>&1 || {
    tail -n 40 "$logs/ctest.log" >&2
    die "ctest -L cpu failed in $build_tag, see $logs/ctest.log"
  }
  grep -E 'tests passed|Total Test time' "$logs/ctest.log"
  note "ncf-check in $tag (log: $logs/check.log)"
  timed check in_image "$tag" ncf-check >"$logs/check.log" 2>&1 || {
    cat "$logs/check.log" >&2
    die "ncf-check failed in $tag, see $logs/check.log"
  }
  cat "$logs/check.log"
  # shellcheck disable=SC2016  # expanded in the container
  in_image "$tag" sh -c 'cd / && du -sh usr/local/cuda/lib/*.so.* usr/lib/x86_64-linux-gnu opt/ncf_dist \
    usr/lib/python3.* usr/share var/lib/dpkg | sort -h
    echo "largest in usr/lib/x86_64-linux-gnu:"
    find usr/lib/x86_64-linux-gnu -type f -size +4M -exec du -m {} + | sort -n | tail -n 8 | sed "s/^/  MiB /"
    echo "total: $(du -sxh / 2>/dev/null | cut -f1)"' |
    tee "$logs/contents.txt"
  echo "$prog: $tag: $(image_size "$tag")"
}

cmd_save() {
  ensure_tools buildah
  image_exists "$tag" || die "--tag '$tag': no such image; run '$prog build' first"
  mkdir -p "$(dirname "$output")"
  rm -f "$output"
  timed save buildah push --quiet "$tag" "oci-archive:$output:${tag#localhost/}" >"$logs/save.log" 2>&1 || {
    cat "$logs/save.log" >&2
    die "buildah push to '$output' failed"
  }
  echo "$prog: saved $tag to $output ($(du -h "$output" | cut -f1)); sha256 $(sha256sum "$output" | cut -d' ' -f1)"
}

case "$cmd" in
  build) cmd_build ;;
  test) cmd_test ;;
  save) cmd_save ;;
  all)
    cmd_build
    cmd_test
    cmd_save
    ;;
esac
