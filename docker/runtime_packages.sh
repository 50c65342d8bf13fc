#!/usr/bin/env bash
# Prints, one a line, the packages the image's runtime stage installs: those that own the
# shared libraries the given programs load (as ldd resolves them in the build stage), plus
# Open MPI's launcher (mpirun) and python3 (launch/'s scripts). Deriving the list from the
# programs keeps it right on Debian and Ubuntu alike, where the library packages are named
# differently (libprotobuf32 / libprotobuf32t64). Libraries no package owns (a CUDA toolkit
# copied into the base image) are named on stderr: the runtime base must hold them, and
# `ncf-check --libraries` verifies that it does.
#   bash docker/runtime_packages.sh PROGRAM...
set -euo pipefail
prog=runtime_packages.sh
[ $# -ge 1 ] || {
  echo "usage: $prog PROGRAM..." >&2
  exit 1
}

owner() {  # PATH: the package owning PATH, or nothing
  local p="$1" line
  line="$(dpkg-query -S "$p" 2>/dev/null | grep -v '^diversion' | head -n 1)" || true
  [ -n "$line" ] || return 0
  line="${line%%: /*}"  # "pkg:arch, other:arch: /path" -> "pkg:arch, other:arch"
  line="${line%%,*}"
  echo "${line%%:*}"
}

declare -A packages=([openmpi-bin]=1 [python3]=1)
declare -A unowned=()
for program in "$@"; do
  [ -x "$program" ] || {
    echo "$prog: '$program' is not an executable file" >&2
    exit 1
  }
  while read -r name path; do
    if [ "$path" = "not" ]; then
      # libcuda.so.1 comes from the host's driver when the container is given GPUs.
      [ "$name" = libcuda.so.1 ] && continue
      echo "$prog: $program: $name is not found in the build stage" >&2
      exit 1
    fi
    pkg=""
    # /lib and /usr/lib are one directory on merged-/usr systems; dpkg knows one spelling.
    for p in "$path" "$(readlink -f "$path")" "/usr$path" "${path#/usr}"; do
      pkg="$(owner "$p")"
      [ -n "$pkg" ] && break
    done
    if [ -n "$pkg" ]; then
      packages[$pkg]=1
    else
      unowned[$path]=1
    fi
  done < <(ldd "$program" | awk '$2 == "=>" {print $1, $3}')
done
for path in "${!unowned[@]}"; do echo "$prog: owned by no package (the base provides it): $path" >&2; done
printf '%s\n' "${!packages[@]}" | sort
