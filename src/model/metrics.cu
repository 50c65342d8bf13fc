// CUDA twin of metrics.h: one warp per user counts the negatives that beat or
// tie the positive (an exact integer), writes the user's hit and NDCG term,
// then the per-user terms are summed in a fixed order (cuda_util.cuh) and the
// two totals come back to the host — the op's one wait — or, in
// hit_ndcg_accumulate, are added to running sums on the device, with no wait.
#include "common/cuda_util.cuh"
#include "model/metrics.h"

namespace ncf::cuda {
namespace {

// per_user[2u] = hit (0 or 1), per_user[2u + 1] = its NDCG term.
__global__ void rank_kernel(const float* scores, const uint8_t* dup_mask, int64_t U, int L, int K,
                            double* per_user) {
  const int lane = threadIdx.x & 31;
  // The warp index is uniform across the warp, so all 32 lanes reach the shuffles.
  for (int64_t u = thread_first() / 32; u < U; u += thread_stride() / 32) {
    const float* s = scores + u * L;
    const uint8_t* mask = dup_mask ? dup_mask + u * L : nullptr;
    const float pos = s[0];
    int count = 0;
    for (int j = 1 + lane; j < L; j += 32)
      if ((!mask || mask[j]) && !(s[j] < pos)) ++count;  // ties and NaNs count against
    for (int off = 16; off > 0; off >>= 1) count += __shfl_xor_sync(0xffffffffu, count, off);
    if (lane == 0) {
      const bool hit = count < K;
      per_user[2 * u] = hit ? 1.0 : 0.0;
      per_user[2 * u + 1] = hit ? log(2.0) / log(count + 2.0) : 0.0;
    }
  }
}

struct PerUserOp {
  const double* per_user;
  __device__ void operator()(int64_t u, double (&acc)[2]) const {
    acc[0] += per_user[2 * u];
    acc[1] += per_user[2 * u + 1];
  }
};

struct TotalsStore {
  double* totals;
  __device__ void operator()(int k, double total) const { totals[k] = total; }
};

struct TotalsAdd {  // hit_ndcg_accumulate: onto the pass's running sums
  double* sums;
  __device__ void operator()(int k, double total) const { sums[k] += total; }
};

// The batch's per-user terms (rank_kernel) into per_user, scratch of the op.
double* rank_users(const ExecContext& ctx, CudaResources& r, const float* scores,
                   const uint8_t* dup_mask, int64_t U, int L, int K, double** partial,
                   double** totals, const char* op) {
  double* per_user = nullptr;  // [U×2]
  carve_scratch(r, [&](ScratchLayout& s) {
    per_user = s.take<double>(static_cast<size_t>(U) * 2);
    *partial = s.take<double>(static_cast<size_t>(sum_chunks(U)) * 2);
    if (totals) *totals = s.take<double>(2);
  });
  if (U > 0) {
    rank_kernel<<<grid_for(U * 32), kThreads, 0, stream_of(ctx)>>>(scores, dup_mask, U, L, K,
                                                                   per_user);
    check_launch(op);
  }
  return per_user;
}

}  // namespace

void hit_ndcg_accumulate(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask,
                         int64_t U, int L, int K, double* sums) {
  const char* op = "hit_ndcg_accumulate";
  CudaResources& r = cuda_resources(ctx, op);
  double* partial = nullptr;  // [chunks×2]
  double* per_user = rank_users(ctx, r, scores, dup_mask, U, L, K, &partial, nullptr, op);
  deterministic_sums<2>(stream_of(ctx), U, PerUserOp{per_user}, partial, TotalsAdd{sums}, op);
}

void hit_ndcg(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask, int64_t U,
              int L, int K, double* hr_sum, double* ndcg_sum) {
  const char* op = "hit_ndcg";
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  double* partial = nullptr;  // [chunks×2]
  double* totals = nullptr;   // [2]
  double* per_user = rank_users(ctx, r, scores, dup_mask, U, L, K, &partial, &totals, op);
  deterministic_sums<2>(stream, U, PerUserOp{per_user}, partial, TotalsStore{totals}, op);
  auto* host = static_cast<double*>(r.pinned(2 * sizeof(double)));
  CUDA_CHECK(cudaMemcpyAsync(host, totals, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  sync_and_raise(ctx, r);
  *hr_sum = host[0];
  *ndcg_sum = host[1];
}

}  // namespace ncf::cuda
