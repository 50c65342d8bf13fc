# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: `rehearse`: `run` inside a clean Debian 12 root, no
# network, no GPU.

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
  case "$what" in build | tests | bench | step | tier | all) ;; *) die "rehearse: unknown '$what' (build, tests, bench, step, tier, all)" ;; esac
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
  # The archive is what a device call brings back: it must hold every stage's log. (Its
  # listing read whole first: grep -q leaving at the first match would cut tar off with
  # SIGPIPE, which pipefail counts as a failure whenever tar had more names to write.)
  local listing
  listing="$(tar tzf "$inner/results.tgz" 2>/dev/null || true)"
  if ! grep -qx '\./build\.log' <<<"$listing"; then
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
