#!/usr/bin/env bash
# The GPU bring-up kit: build and run ncf_dist on a bare, short-lived GPU machine that has
# the NVIDIA driver, the CUDA toolkit, CMake, g++ and Python (PyTorch, nvidia-nccl-cu13) but
# none of our Debian packages and no network.
#
#   bash scripts/gpu_kit.sh pack       here (Debian 12): the Debian packages the build and the
#                                      runs need, minus what any machine with a compiler has,
#                                      into .gpu-kit/ (git-ignored); bring .gpu-kit along
#   bash scripts/gpu_kit.sh run [build|tests|bench|step|tier|all]
#                                      there, from the repository root: unpack .gpu-kit into a
#                                      prefix under .gpu-kit/, configure and build build-gpu/
#                                      for that GPU, run the stages, record the results
#   bash scripts/gpu_kit.sh rehearse [build|tests|bench|step|tier|all]
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
#
# The parts: scripts/gpu_kit/*.sh, sourced below (common.sh: paths, the stage runner, the
# summary, `run`; pack.sh; build, tests, profile, bench, pytorch, step, nccl, eval: the
# stages and their figures; rehearse.sh), and scripts/gpu_kit/*.py, the figures that
# read JSON (stdlib only), pack's dependency closure and the PyTorch NeuMF of `run bench`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=gpu_kit
# shellcheck source=scripts/gpu_kit/common.sh
. "$root/scripts/gpu_kit/common.sh"
# shellcheck source=scripts/gpu_kit/pack.sh
. "$root/scripts/gpu_kit/pack.sh"
# shellcheck source=scripts/gpu_kit/build.sh
. "$root/scripts/gpu_kit/build.sh"
# shellcheck source=scripts/gpu_kit/tests.sh
. "$root/scripts/gpu_kit/tests.sh"
# shellcheck source=scripts/gpu_kit/profile.sh
. "$root/scripts/gpu_kit/profile.sh"
# shellcheck source=scripts/gpu_kit/bench.sh
. "$root/scripts/gpu_kit/bench.sh"
# shellcheck source=scripts/gpu_kit/pytorch.sh
. "$root/scripts/gpu_kit/pytorch.sh"
# shellcheck source=scripts/gpu_kit/step.sh
. "$root/scripts/gpu_kit/step.sh"
# shellcheck source=scripts/gpu_kit/nccl.sh
. "$root/scripts/gpu_kit/nccl.sh"
# shellcheck source=scripts/gpu_kit/eval.sh
. "$root/scripts/gpu_kit/eval.sh"
# shellcheck source=scripts/gpu_kit/tier.sh
. "$root/scripts/gpu_kit/tier.sh"
# shellcheck source=scripts/gpu_kit/rehearse.sh
. "$root/scripts/gpu_kit/rehearse.sh"

main() {
  case "${1:-}" in
    pack) cmd_pack ;;
    run) shift; cmd_run "$@" ;;
    rehearse) shift; cmd_rehearse "$@" ;;
    *) die "usage: bash scripts/gpu_kit.sh pack | run [build|tests|bench|step|tier|all] | rehearse [same]" ;;
  esac
}
# main and exit on one line: bash has read all of it, and each stage file whole (source reads
# a file before running it), before main runs, so editing the kit's files while a run is
# under way cannot feed the running bash new lines.
main "$@"; exit
