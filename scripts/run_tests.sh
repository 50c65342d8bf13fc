#!/usr/bin/env bash
# Quick start #2: set up, build, and run the whole test suite (CPU tests; GPU
# tests run when a GPU is present and are listed as skipped otherwise), then
# the Slurm preemption test and the tests across simulated hosts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Each phase's wall time, on one line, so that a slow CI run says where its time went.
phase_start=$SECONDS
phase_done() {
  echo "run_tests: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)"
  phase_start=$SECONDS
}
# Every package first, in one apt run: the build's, ShellCheck (the GPU kit's shell check;
# test-only, so not in the build's list nor the image's) and the fuzz build's (clang, its
# libFuzzer and sanitizer runtimes, lld, llvm). Nothing below then runs apt beside another
# apt. The PyTorch checks of bench/pytorch_variants.py run where Debian's python3-torch is
# installed and are listed as skipped elsewhere: it brings about 200 packages (OpenCV, Qt,
# GTK), minutes of a fresh machine's test run; they run before every GPU window
# (docs/gpu_machines.md).
bash "$root/scripts/setup.sh" shellcheck clang libclang-rt-14-dev lld llvm
phase_done packages
build="${NCF_BUILD_DIR:-$root/build}"
# Every reader of outside bytes under libFuzzer with ASan and UBSan (fuzz/, build-fuzz/
# with clang): each seed and each finding's reproducer replayed, then a few seconds of
# fuzzing per target. It runs beside the phases below at the lowest CPU priority, in a
# session of its own, on the CPU they leave idle (waits for launches, heartbeats and lost
# hosts: about a fifth of the run's CPU); an input is a hang after 300 s of wall time
# there instead of 10, as the others may hold the CPU. Its log is printed at the end, and
# its failure fails the run; it is stopped if the run ends first. Where the kernel
# groups each session's processes for the scheduler (sched_autogroup_enabled), nice
# ranks processes only inside their group and a session's group takes an equal share of
# the CPU: the new session's group gets the lowest priority too, or the fuzz build
# would take half of the CPU from the build beside it (790 s instead of 571 when it did).
# The group is the child's own only once it leads its session: set earlier, the nice
# lands on this script's group.
fuzz_log="$build.fuzz.log"
mkdir -p "$(dirname "$fuzz_log")"
NCF_FUZZ_INPUT_TIMEOUT=300 setsid nice -n 19 bash "$root/scripts/fuzz_replay.sh" \
  >"$fuzz_log" 2>&1 </dev/null &
fuzz_pid=$!
# Once the child leads its own session (before that, its group is this script's).
for _ in $(seq 100); do
  [ "$(ps -o sid= -p "$fuzz_pid" | tr -d ' ')" = "$fuzz_pid" ] && break
  sleep 0.05
done
if [ "$(ps -o sid= -p "$fuzz_pid" | tr -d ' ')" = "$fuzz_pid" ] && [ -w "/proc/$fuzz_pid/autogroup" ]; then
  echo 19 >"/proc/$fuzz_pid/autogroup" || true
fi
trap 'kill -TERM -- "-$fuzz_pid" 2>/dev/null || true' EXIT
bash "$root/scripts/build.sh"
phase_done build
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
phase_done ctest
# Preemption under a real one-node Slurm cluster (tests/slurm/): needs root to
# run slurmd; installs Debian's Slurm and munge on first use.
if [ "$(id -u)" -eq 0 ]; then
  bash "$root/tests/slurm/test_preempt.sh" "$build"
else
  echo "run_tests: skipped tests/slurm/test_preempt.sh (slurmd needs root)"
fi
phase_done "slurm preemption"
# Ranks on several hosts of this machine (tests/cluster/: network namespaces joined
# by a bridge, mpirun and a multi-node Slurm across them, a host lost mid-run, the
# two-hop exchange). Needs root; each test says why when it is skipped.
bash "$root/tests/cluster/run_all.sh" "$build"
phase_done "simulated hosts"
fuzz_rc=0
wait "$fuzz_pid" || fuzz_rc=$?
trap - EXIT
grep '^fuzz_replay' "$fuzz_log" || true
phase_done "fuzz (beside the phases above; the wait for its end)"
if [ "$fuzz_rc" -ne 0 ]; then
  echo "run_tests: scripts/fuzz_replay.sh failed (exit $fuzz_rc); its log, $fuzz_log:" >&2
  tail -n 80 "$fuzz_log" >&2
  exit "$fuzz_rc"
fi
