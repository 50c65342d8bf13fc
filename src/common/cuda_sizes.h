// The sizes the CUDA ops carve their scratch and workspaces by, in plain C++: the
// kernels (common/cuda_util.cuh, model/topk.cu, common/cuda_context.cu) and the
// memory guard's estimate of them (train/memory_estimate.cc) read the same numbers,
// in every build, so the estimate cannot drift from what the ops allocate.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ncf::cuda {

constexpr int kThreads = 256;  // threads per block of the 1-D kernels

// Every array of a scratch carve starts on this boundary (CUB, float4; ScratchLayout).
constexpr size_t kScratchAlign = 256;

// The deterministic scalar sums: items per chunk partial (cuda_util.cuh).
constexpr int kSumItemsPerThread = 8;
constexpr int64_t kSumChunk = int64_t{kThreads} * kSumItemsPerThread;  // 2048 items
inline int64_t sum_chunks(int64_t n) { return (n + kSumChunk - 1) / kSumChunk; }

// The deterministic column sums: rows per chunk partial (cuda_util.cuh).
constexpr int64_t kColChunk = 256;
inline int64_t col_chunks(int64_t B) { return (B + kColChunk - 1) / kColChunk; }

// neumf_top_backward (model/ops_top.cu): groups per block partial, and the partial
// columns (dw's GMF and tower parts and the bias gradient, 32 lanes × ⌈width/32⌉
// each, then dc and the loss).
constexpr int64_t kNeumfTopGroups = 64;
inline int64_t neumf_top_chunks(int64_t n) { return (n + kNeumfTopGroups - 1) / kNeumfTopGroups; }
inline int neumf_top_partial_cols(int mf, int last) {
  return 32 * ((mf + 31) / 32 + 2 * ((last + 31) / 32)) + 2;
}

// top_k: keys sorted per CUB call (topk.cu), so the sort's size stays within int.
constexpr int64_t kTopKBlockElements = int64_t{1} << 26;

// cuBLASLt may use this much workspace per matmul (split-K partials); 32 MiB is
// what NVIDIA's samples suggest for Hopper-class GPUs (cuda_context.cu).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
// cuBLAS's own workspace, given to its handle (cublasSetWorkspace): the size the cuBLAS
// reference recommends for Hopper. Given, so that cuBLAS never allocates one while a
// step is captured as a CUDA graph (train/step_graph.h).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

}  // namespace ncf::cuda
