# shellcheck shell=bash
# Shared by the bench/ scripts (sourced): what a record names and needs.

# The commit the programs are built from: the short HEAD, with "+local" when src/
# or the build files differ from it.
bench_commit() {  # ROOT
  local c
  c=$(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -z "$(git -C "$1" status --porcelain --untracked-files=no -- src CMakeLists.txt cmake 2>/dev/null)" ] ||
    c="$c+local"
  echo "$c"
}

# ncf_dist and ncf_prep of BUILD, or die (the caller's die) naming where they were sought.
bench_programs() {  # BUILD
  dist="$1/src/ncf_dist"
  prep="$1/src/ncf_prep"
  if [ ! -x "$dist" ] || [ ! -x "$prep" ]; then
    die "no ncf_dist / ncf_prep in $1/src (build first: bash scripts/build.sh, or set NCF_BUILD_DIR)"
  fi
}

# Each named variable must hold a positive integer, or die (the caller's die)
# naming it as the flag --NAME and its value.
bench_positive_ints() {  # VAR...
  local v
  for v in "$@"; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v '${!v}' must be a positive integer"
  done
}
