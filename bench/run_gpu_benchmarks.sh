#!/usr/bin/env bash
# The GPU benchmarks on a machine with a GPU and our packages installed (scripts/setup.sh):
#   bash bench/run_gpu_benchmarks.sh [bench | tests | all]          (default: bench)
# A thin wrapper over `bash scripts/gpu_kit.sh run ...`, which holds the stages
# (docs/gpu_machines.md): it configures and builds $BUILD for this GPU, then runs bench_kernels, the
# ml-20m-mlperf throughput and time to quality under tf32 and bf16, two ranks sharing GPU 0
# (mpirun with the MCA settings of the tests), one rank per GPU over NCCL when there are
# several, and the PyTorch NeuMF peer; `tests` runs the gpu and cpu test labels,
# compute-sanitizer and the determinism check. Records into $OUT, else
# bench/results/gpu_<UTC date>_<commit>/ (info.txt, one log per stage, summary.md).
# Without .gpu-kit/commit the commit is NCF_KIT_COMMIT, else "unknown" (git is not asked).
# Env: BUILD (build-gpu), DATA (data), TTQ_EPOCHS (20), PRECISIONS ("tf32 bf16"),
# BUDGET (seconds for the whole run, 3600); the NCF_KIT_* variables of gpu_kit.sh win.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
what="${1:-bench}"
export NCF_KIT_BUILD="${NCF_KIT_BUILD:-${BUILD:-build-gpu}}"
export NCF_KIT_DATA="${NCF_KIT_DATA:-${DATA:-data}}"
export NCF_KIT_TTQ_EPOCHS="${NCF_KIT_TTQ_EPOCHS:-${TTQ_EPOCHS:-20}}"
export NCF_KIT_PRECISIONS="${NCF_KIT_PRECISIONS:-${PRECISIONS:-tf32 bf16}}"
export NCF_KIT_BUDGET="${NCF_KIT_BUDGET:-${BUDGET:-3600}}"
exec bash "$root/scripts/gpu_kit.sh" run "$what"
