// CPU side of metrics.h: per-user ranks in parallel, sums over fixed blocks.
#include "model/metrics.h"

#include <cmath>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"

namespace ncf {

namespace {

void check_hit_ndcg(const char* op, const float* scores, int64_t U, int L, int K) {
  NCF_CHECK(U >= 0, op, ": negative user count U=", U);
  NCF_CHECK(L >= 1, op, ": list length L=", L, " must be >= 1 (the positive)");
  NCF_CHECK(K >= 1, op, ": K=", K, " must be >= 1");
  NCF_CHECK(U == 0 || scores, op, ": scores is null with U=", U);
}

}  // namespace

void hit_ndcg_accumulate(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask,
                         int64_t U, int L, int K, double* sums) {
  const char* op = "hit_ndcg_accumulate";
  check_hit_ndcg(op, scores, U, L, K);
  NCF_CHECK(sums, op, ": sums is null");
  NCF_DISPATCH_CUDA(ctx, hit_ndcg_accumulate, ctx, scores, dup_mask, U, L, K, sums);
  double hr = 0, ndcg = 0;
  hit_ndcg(ctx, scores, dup_mask, U, L, K, &hr, &ndcg);
  sums[0] += hr;
  sums[1] += ndcg;
}

void hit_ndcg(const ExecContext& ctx, const float* scores, const uint8_t* dup_mask, int64_t U,
              int L, int K, double* hr_sum, double* ndcg_sum) {
  const char* op = "hit_ndcg";
  check_hit_ndcg(op, scores, U, L, K);
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

void full_ranking_hit_ndcg(int threads, const float* scores, int64_t n, int64_t I,
                           const int32_t* test_items, const int64_t* offsets,
                           const int32_t* excluded, int K, double* hr_sum, double* ndcg_sum) {
  const char* op = "full_ranking_hit_ndcg";
  NCF_CHECK(n >= 0 && I >= 1 && K >= 1, op, ": n=", n, " I=", I, " K=", K);
  NCF_CHECK(n == 0 || (scores && test_items && offsets), op, ": null input with n=", n);
  NCF_CHECK(hr_sum && ndcg_sum, op, ": hr_sum or ndcg_sum is null");
  const double log2 = std::log(2.0);
  double sums[2];
  block_sums(
      threads, n, 2,
      [&](int64_t u0, int64_t u1, double* acc) {
        for (int64_t u = u0; u < u1; ++u) {
          const int32_t test = test_items[u];
          NCF_CHECK(test >= 0 && test < I, op, ": test item ", test, " of user ", u,
                    " outside [0, ", I, ")");
          const float* s = scores + u * I;
          const float pos = s[test];
          // Every item at or above the test item's score, then the ones that
          // do not take part taken out again.
          int64_t rank = 0;
          for (int64_t j = 0; j < I; ++j) rank += !(s[j] < pos);
          rank -= 1;  // the test item itself
          for (int64_t k = offsets[u]; k < offsets[u + 1]; ++k) {
            const int32_t e = excluded[k];
            if (e != test && e >= 0 && e < I) rank -= !(s[e] < pos);
          }
          if (rank < K) {
            acc[0] += 1.0;
            acc[1] += log2 / std::log(double(rank) + 2.0);
          }
        }
      },
      sums);
  *hr_sum = sums[0];
  *ndcg_sum = sums[1];
}

}  // namespace ncf
