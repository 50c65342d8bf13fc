// CPU side of metrics.h: per-user ranks in parallel, sums over fixed blocks.
#include "model/metrics.h"

#include <cmath>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"

namespace ncf {

void hit_ndcg(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask, int64_t U,
              int L, int K, double* hr_sum, double* ndcg_sum) {
  const char* op = "hit_ndcg";
  NCF_CHECK(U >= 0, op, ": negative user count U=", U);
  NCF_CHECK(L >= 1, op, ": list length L=", L, " must be >= 1 (the positive)");
  NCF_CHECK(K >= 1, op, ": K=", K, " must be >= 1");
  NCF_CHECK(U == 0 || scores, op, ": scores is null with U=", U);
  NCF_CHECK(hr_sum && ndcg_sum, op, ": hr_sum or ndcg_sum is null");
  NCF_DISPATCH_CUDA(ctx, hit_ndcg, ctx, scores, dup_mask, U, L, K, hr_sum, ndcg_sum);
  const double log2 = std::log(2.0);
  double sums[2];
  block_sums(
      ctx.threads, U, 2,
      [&](int64_t u0, int64_t u1, double* acc) {
        for (int64_t u = u0; u < u1; ++u) {
          const float* s = scores + u * L;
          const uint8_t* mask = dup_mask ? dup_mask + u * L : nullptr;
          const float pos = s[0];
          int rank = 0;
          for (int j = 1; j < L; ++j)
            if ((!mask || mask[j]) && !(s[j] < pos)) ++rank;
          if (rank < K) {
            acc[0] += 1.0;
            acc[1] += log2 / std::log(rank + 2.0);
          }
        }
      },
      sums);
  *hr_sum = sums[0];
  *ndcg_sum = sums[1];
}

}  // namespace ncf
