// CPU implementation of online negative sampling (see negatives.h).
#include "data/negatives.h"

#include <algorithm>

#include "common/check.h"
#include "common/parallel.h"
#include "common/philox.h"

namespace ncf {

void sample_negatives(const ExecContext& ctx, const PositiveLists& positives, uint64_t num_items,
                      const int32_t* users, const int32_t* items, int64_t slice_begin,
                      int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                      int32_t* out_users, int32_t* out_items, float* out_labels) {
  NCF_CHECK(ctx.device == Device::kCpu, "sample_negatives: only the CPU path is built");
  const int64_t S = 1 + num_neg;
  parallel_for(ctx.threads, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int32_t u = users[k];
      const int32_t* pb = positives.begin(uint64_t(u));
      const int32_t* pe = positives.end(uint64_t(u));
      if (uint64_t(pe - pb) >= num_items)
        NCF_FAIL("user ", u, " interacted with all ", num_items, " items: no negative exists");
      const uint64_t p = uint64_t(slice_begin + k);
      CounterRng rng{seed, kStreamTrainNegatives, (uint64_t(epoch) << 40) | p};
      int32_t* ou = out_users + k * S;
      int32_t* oi = out_items + k * S;
      float* ol = out_labels + k * S;
      ou[0] = u;
      oi[0] = items[k];
      ol[0] = 1.0f;
      uint64_t d = 0;
      for (int j = 1; j < S; ++j) {
        int32_t c;
        do {
          c = int32_t(rng.below(d++, num_items));
        } while (std::binary_search(pb, pe, c));
        ou[j] = u;
        oi[j] = c;
        ol[j] = 0.0f;
      }
    }
  });
}

}  // namespace ncf
