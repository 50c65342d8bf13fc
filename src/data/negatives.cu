// CUDA twin of online negative sampling: one thread per positive runs the
// same rejection draw as the CPU (negatives.h, negatives_detail), binary
// searching the user's sorted positives in the device copy of the lists, the
// searches of a round of draws in lock step (draw_negatives_ahead).
#include "common/cuda_util.cuh"
#include "data/negatives.h"

namespace ncf::cuda {
namespace {

// K: draws searched together per round (draw_negatives_ahead<K>). Four lanes hold
// ml-20m-mlperf's four negatives in one round; eight serve more negatives in fewer rounds,
// at more registers.
template <int K>
__global__ void sample_negatives_kernel(const int64_t* offsets, const int32_t* pos_items,
                                        uint64_t num_users, uint64_t num_items,
                                        const int32_t* users, const int32_t* items,
                                        int64_t slice_begin, int64_t n, int num_neg, uint64_t seed,
                                        int64_t epoch, int32_t* out_users, int32_t* out_items,
                                        float* out_labels, DeviceErrorRecord* err) {
  const int64_t S = 1 + num_neg;
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const int32_t u = users[k];
    int32_t* ou = out_users + k * S;
    int32_t* oi = out_items + k * S;
    float* ol = out_labels + k * S;
    for (int64_t j = 0; j < S; ++j) {
      ou[j] = u;
      ol[j] = j == 0 ? 1.0f : 0.0f;
    }
    oi[0] = items[k];
    if (u < 0 || static_cast<uint64_t>(u) >= num_users) {
      record_error(err, DeviceErrorCode::kNegativesUserOutOfRange, k, u,
                   static_cast<int64_t>(num_users));
      for (int64_t j = 1; j < S; ++j) oi[j] = -1;
      continue;
    }
    const int64_t begin = offsets[u], count = offsets[u + 1] - begin;
    if (static_cast<uint64_t>(count) >= num_items) {  // rejection would never end
      record_error(err, DeviceErrorCode::kNegativesNoFreeItem, k, u,
                   static_cast<int64_t>(num_items));
      for (int64_t j = 1; j < S; ++j) oi[j] = -1;
      continue;
    }
    const CounterRng rng =
        negatives_detail::positive_rng(seed, epoch, static_cast<uint64_t>(slice_begin + k));
    negatives_detail::draw_negatives_ahead<K>(rng, pos_items + begin, count, num_items, num_neg,
                                              oi + 1);
  }
}

}  // namespace

void sample_negatives(const ExecContext& ctx, const DevicePositiveLists& positives,
                      uint64_t num_items, const int32_t* users, const int32_t* items,
                      int64_t slice_begin, int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                      int32_t* out_users, int32_t* out_items, float* out_labels) {
  const char* op = "sample_negatives";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  // Each thread's rejection loop runs for a while: smaller blocks spread the
  // positives over more SMs.
  constexpr int kSampleThreads = 128;
  auto kernel = num_neg <= 4 ? sample_negatives_kernel<4> : sample_negatives_kernel<8>;
  kernel<<<grid_for(n, kSampleThreads), kSampleThreads, 0, stream_of(ctx)>>>(
      positives.offsets.data(), positives.items.data(), positives.num_users, num_items, users,
      items, slice_begin, n, num_neg, seed, epoch, out_users, out_items, out_labels, r.error_dev);
  check_launch(op);
}

}  // namespace ncf::cuda
