// CPU implementation of topk.h: per row, the remaining items' indices, a
// partial sort of the first K by (score descending, item ascending).
#include "model/topk.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "common/dispatch.h"
#include "common/parallel.h"

namespace ncf {

void top_k(const ExecContext& ctx, const float* scores, int64_t n, int64_t I,
           const int64_t* offsets, const int32_t* excluded, int K, int32_t* out_items,
           float* out_scores) {
  const char* op = "top_k";
  NCF_CHECK(n >= 0 && I >= 1 && K >= 1, op, ": n=", n, " I=", I, " K=", K);
  NCF_CHECK(n == 0 || (scores && out_items && out_scores), op, ": null input with n=", n);
  NCF_CHECK(!excluded || offsets, op, ": excluded items without offsets");
  NCF_DISPATCH_CUDA(ctx, top_k, ctx, scores, n, I, offsets, excluded, K, out_items, out_scores);
  parallel_for(ctx.threads, n, 1, [&](int64_t u0, int64_t u1) {
    std::vector<int32_t> cand;
    cand.reserve(size_t(I));
    for (int64_t u = u0; u < u1; ++u) {
      const float* s = scores + u * I;
      cand.clear();
      const int32_t* x = offsets ? excluded + offsets[u] : nullptr;
      const int32_t* x_end = offsets ? excluded + offsets[u + 1] : nullptr;
      for (const int32_t* e = x; e != x_end; ++e)
        NCF_CHECK(*e >= 0 && *e < I, op, ": excluded[", e - excluded, "]=", *e,
                  " outside the items [0, ", I, ")");
      for (int32_t j = 0; j < int32_t(I); ++j) {
        while (x != x_end && *x < j) ++x;
        if (x != x_end && *x == j) continue;
        cand.push_back(j);
      }
      const size_t k = std::min<size_t>(size_t(K), cand.size());
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [s](int32_t a, int32_t b) {
        return s[a] > s[b] || (s[a] == s[b] && a < b);
      });
      for (size_t r = 0; r < size_t(K); ++r) {
        out_items[u * K + r] = r < k ? cand[r] : -1;
        out_scores[u * K + r] = r < k ? s[cand[r]] + 0.0f : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

}  // namespace ncf
