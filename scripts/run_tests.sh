#!/usr/bin/env bash
# Quick start #2: set up, build, and run the whole test suite (CPU tests; GPU
# tests run when a GPU is present and are listed as skipped otherwise), and beside
# it the Slurm preemption test and the tests across simulated hosts.
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
slurm_pid=""
trap 'kill -TERM -- "-$fuzz_pid" 2>/dev/null || true
      [ -z "$slurm_pid" ] || pkill -TERM -P "$slurm_pid" 2>/dev/null || true' EXIT
bash "$root/scripts/build.sh"
phase_done build
cd "$build"
# Beside ctest, one after the other: preemption under a real one-node Slurm cluster
# (tests/slurm/), then ranks on several hosts of this machine (tests/cluster/: network
# namespaces joined by a bridge, mpirun and a multi-node Slurm across them, a host
# lost mid-run, the two-hop exchange). Both need root (slurmd, namespaces) and say
# why when skipped; Slurm and munge are installed on first use. They spend most of
# their time waiting (Slurm starting and requeueing jobs, a lost host's timeouts,
# heartbeats to age): alone the simulated hosts took 278 s of wall time for 174
# CPU-seconds, a third of this machine's 2 cores. Run beside ctest, they ended in 552 s
# and ctest in 591 s; one after the other, a CI run took 481 s and 469 s. Neither uses the
# other's daemons or files: ctest's ranks run on this host, the clusters' in their own
# namespaces and directories under /var/tmp. Their log is printed after ctest's.
slurm_log="$build.slurm.log"
{
  rc=0
  t0=$SECONDS
  if [ "$(id -u)" -eq 0 ]; then
    bash "$root/tests/slurm/test_preempt.sh" "$build" || rc=$?
  else
    echo "run_tests: skipped tests/slurm/test_preempt.sh (slurmd needs root)"
  fi
  echo "run_tests: slurm preemption took $((SECONDS - t0)) s"
  t0=$SECONDS
  [ "$rc" -ne 0 ] || bash "$root/tests/cluster/run_all.sh" "$build" || rc=$?
  echo "run_tests: simulated hosts took $((SECONDS - t0)) s"
  exit "$rc"
} >"$slurm_log" 2>&1 </dev/null &
slurm_pid=$!
ctest_rc=0
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@" || ctest_rc=$?
phase_done ctest
slurm_rc=0
wait "$slurm_pid" || slurm_rc=$?
slurm_pid=""
cat "$slurm_log"
phase_done "slurm preemption and simulated hosts (beside ctest; the wait for their end)"
[ "$ctest_rc" -eq 0 ] || { echo "run_tests: ctest failed (exit $ctest_rc)" >&2; exit "$ctest_rc"; }
[ "$slurm_rc" -eq 0 ] || { echo "run_tests: the Slurm or simulated-host tests failed" >&2; exit 1; }
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
