#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer, LeakSanitizer and
# UndefinedBehaviorSanitizer: installs what is missing, builds build-asan/ with
# gcc and runs `ctest -L cpu` there. The programs the tests start (ncf_prep,
# ncf_dist under mpirun, ncf_recommend, ncf_export) come from the same build, so
# they are checked too. Exits non-zero on a failed test or on any sanitizer
# report, including one from a program a test expected to fail.
#   bash scripts/sanitize.sh [ctest arguments, e.g. -R Csv]
# NCF_ASAN_BUILD_DIR overrides the build directory. About 26 minutes on a 2-core
# machine from nothing (docs/fuzzing_and_sanitizers.md), so CI does not run it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${NCF_ASAN_BUILD_DIR:-$root/build-asan}"
mkdir -p "$build"

# float-cast-overflow is not in gcc's "undefined" group, yet a NaN or huge value
# from a hostile file cast to an integer is exactly the undefined behaviour worth
# finding. Nothing recovers: the first report ends the process.
san="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all"
san+=" -fno-omit-frame-pointer"
# -O1 -g: usable stacks at a tolerable slowdown. No NDEBUG, so assert() stays, and
# libstdc++'s own bounds checks on operator[] and friends are on (no ABI change).
opt="-O1 -g -D_GLIBCXX_ASSERTIONS"
t0=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNCF_CUDA=OFF -DNCF_WERROR=OFF \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1 || {
  grep -E -B2 -A6 "error" "$build/build.log" | head -100
  exit 1
}
t1=$(date +%s)
echo "sanitize: built $build in $((t1 - t0)) s"

# Every process writes its reports to a file of its own (report.<program>.<pid>),
# read after the run: a test that expects a program to fail would otherwise pass
# on a sanitizer's exit code, and one that parses a program's stderr would choke on
# the report instead of naming it.
reports="$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
log="log_path=$reports/report:log_exe_name=1"
# Stack-use-after-return, static initialisation order and string functions reading
# past a terminator are all cheap enough here and all real bugs.
export ASAN_OPTIONS="$log:halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1"
ASAN_OPTIONS+=":check_initialization_order=1:strict_init_order=1:strict_string_checks=1"
# Its reports go to stderr whatever log_path says; the preloaded library below
# copies them into the reports directory.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# Leaks stay on. The suppressions name only third-party libraries that keep
# allocations to process exit by design (see the file); print_suppressions
# records which of them matched, so the list can be kept short.
supp="$root/scripts/sanitize/lsan.supp"
export LSAN_OPTIONS="$log:suppressions=$supp:print_suppressions=1"
# The one suppression that names a function rather than a library is glibc's
# asprintf, on the grounds that only Open MPI calls it; keep that true.
if grep -rn --include='*.cc' --include='*.h' -E '\basprintf|vasprintf' \
  "$root/src" "$root/tests" "$root/bench"; then
  echo "sanitize: our code calls asprintf, which $supp suppresses for Open MPI" >&2
  exit 1
fi
# A library preloaded into every process (scripts/sanitize/preload.c): keeps
# Open MPI's components loaded so that leaks in them can be named and suppressed,
# and writes UndefinedBehaviorSanitizer's reports, which ignore log_path beside
# AddressSanitizer, into the same directory. It is not the sanitizer runtime, hence
# verify_asan_link_order=0.
gcc -shared -fPIC -O2 -Wall -o "$build/sanitize_preload.so" "$root/scripts/sanitize/preload.c"
export LD_PRELOAD="$build/sanitize_preload.so${LD_PRELOAD:+:$LD_PRELOAD}"
export NCF_SANITIZER_REPORTS="$reports"
ASAN_OPTIONS+=":verify_asan_link_order=0"
# Open MPI refuses root without these; tests/test_util.cc sets them for mpirun,
# but a program started alone (one rank) calls MPI_Init too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "sanitize: $(g++ --version | head -1); $(mpirun --version | head -1)"
echo "sanitize: CXXFLAGS $san $opt"
echo "sanitize: ASAN_OPTIONS=$ASAN_OPTIONS"
echo "sanitize: UBSAN_OPTIONS=$UBSAN_OPTIONS"
echo "sanitize: LSAN_OPTIONS=$LSAN_OPTIONS"
echo "sanitize: LD_PRELOAD=$LD_PRELOAD"

cd "$build"
status=0
# No test watches its own wall time closely (test_export's memory bound does watch
# the allocator: it turns the quarantine off). The longest tests take about 2 min
# here; the limit leaves room for a loaded machine.
ctest -L cpu --output-on-failure -j "$(nproc)" --timeout 1800 "$@" || status=$?
t2=$(date +%s)
echo "sanitize: ctest -L cpu took $((t2 - t1)) s (exit $status); build and tests $((t2 - t0)) s"

# A file with an error or summary line is a report; one holding only the
# suppressions LeakSanitizer matched is not.
mapfile -t bad < <(grep -l -E "ERROR: |runtime error|SUMMARY: " "$reports"/report.* 2>/dev/null || true)
if [ ${#bad[@]} -gt 0 ]; then
  for f in "${bad[@]}"; do
    echo "==== $f"
    cat "$f"
  done
  echo "sanitize: ${#bad[@]} sanitizer report(s) in $reports" >&2
  status=1
fi
# Warnings are not failures but may explain one (e.g. false positives to follow).
grep -h "WARNING" "$reports"/report.* 2>/dev/null | sed "s/^==[0-9]*==//" | sort | uniq -c | head -20 || true
matched=$(cat "$reports"/report.* 2>/dev/null | grep -E "^ +[0-9]+ +[0-9]+ +[^ ]+$" |
  awk '{n[$3] += $1; b[$3] += $2} END {for (s in n) printf "  %s: %d leaks, %d bytes\n", s, n[s], b[s]}' |
  sort || true)
[ -n "$matched" ] && printf 'sanitize: suppressed at exit (scripts/sanitize/lsan.supp):\n%s\n' "$matched"
[ "$status" -eq 0 ] && echo "sanitize: clean"
exit "$status"
