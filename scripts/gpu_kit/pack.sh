# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: `pack`: the Debian packages the build and the runs need,
# into .gpu-kit/; and their unpacking on the GPU machine (the first stage of `run`).

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
  python3 "$root/scripts/gpu_kit/closure.py" "$*" "build-essential" "${kit_skip[*]}"
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
  bash scripts/gpu_kit.sh run            # or: run build, run tests, run bench, run step, run tier
EOF
}

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
