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
bash "$root/scripts/build.sh"
phase_done build
# The GPU kit's shell check needs ShellCheck: a test-only package, so not in the build's
# list (nor the image's). The PyTorch checks of bench/pytorch_variants.py run where
# Debian's python3-torch is installed and are listed as skipped elsewhere: it brings about
# 200 packages (OpenCV, Qt, GTK), minutes of a fresh machine's test run; they run before
# every GPU window (docs/gpu_machines.md).
bash "$root/scripts/setup.sh" shellcheck
phase_done "test packages"
build="${NCF_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
phase_done ctest
# Every reader of outside bytes under libFuzzer with ASan and UBSan (fuzz/):
# each seed and each finding's reproducer replayed, then a few seconds of
# fuzzing per target. Builds build-fuzz/ with clang (installed when missing).
bash "$root/scripts/fuzz_replay.sh"
phase_done fuzz
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
