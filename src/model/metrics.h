// Leave-one-out ranking metrics: HR@K and NDCG@K over eval lists of one
// positive followed by E negatives (L = 1 + E scores per user).
//
// Rank of the positive = the number of negatives j >= 1 with dup_mask[j] = 1
// whose score is NOT strictly below the positive's score. So ties count
// against the positive (the positive loses ties, as in the TF and MLPerf
// references), a NaN score on either side counts against it too, and masked
// negatives (dup_mask = 0: repeats of an earlier item in the list) never
// count. dup_mask[0] is ignored: the positive always takes part.
// A user is a hit when rank < K; its NDCG term is log(2) / log(rank + 2) when
// hit, 0 otherwise.
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

// scores [U×L], dup_mask [U×L] (uint8, 1 = counts; null = all count), both on
// ctx.device. Writes the SUMS over the U users (host doubles, overwritten):
// *hr_sum = number of hits, *ndcg_sum = Σ NDCG terms — so ranks can allreduce
// them and divide by the global user count. Sums are taken over fixed user
// blocks in a fixed order (the same for any thread count).
void hit_ndcg(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask, int64_t U,
              int L, int K, double* hr_sum, double* ndcg_sum);
// hit_ndcg's two sums added to sums[0] and sums[1] (2 doubles on ctx.device), in that
// order: a pass over many batches keeps its totals on the device and reads them once,
// with no wait per batch. Batch after batch, the same additions as adding hit_ndcg's
// host sums: the same bits.
void hit_ndcg_accumulate(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask,
                         int64_t U, int L, int K, double* sums);

// Full-catalogue ranking (as against E sampled negatives; Krichene and Rendle,
// KDD 2020): for each of n users, scores[u×I .. u×I + I) of all I items, in
// HOST memory; its test item test_items[u]; and the items that do not take
// part, excluded[offsets[u] .. offsets[u+1]) (its training positives, sorted
// ascending; the test item may be among them and always takes part).
// rank = the number of items j ≠ test_items[u], not excluded, whose score is
// not strictly below the test item's (ties and NaNs count against it, as in
// hit_ndcg). Hits and NDCG terms as hit_ndcg, summed over fixed user blocks.
void full_ranking_hit_ndcg(int threads, const float* scores, int64_t n, int64_t I,
                           const int32_t* test_items, const int64_t* offsets,
                           const int32_t* excluded, int K, double* hr_sum, double* ndcg_sum);

#ifdef NCF_WITH_CUDA
namespace cuda {
void hit_ndcg(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask, int64_t U,
              int L, int K, double* hr_sum, double* ndcg_sum);
void hit_ndcg_accumulate(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask,
                         int64_t U, int L, int K, double* sums);
}  // namespace cuda
#endif

}  // namespace ncf
