// Top-K of every row of a score matrix: the items ncf_recommend shows a user.
//
// Row u of scores [n×I] holds the scores of items 0 .. I-1 for one user. Items
// excluded[offsets[u] .. offsets[u+1]) (sorted ascending, distinct, in
// [0, I): the user's known interactions) never appear. The K best remaining
// items come out by descending score; equal scores go by ascending item id, so
// the order is total and the same on every backend (-0 and +0 count as equal).
// When fewer than K items remain, the row's tail holds item -1 and score -inf.
// Scores must not be NaN (the tower's logits never are).
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

// scores [n×I], offsets [n+1] and excluded on ctx.device (offsets and excluded
// both null: no exclusions). Writes out_items [n×K] and out_scores [n×K] on
// ctx.device. The CPU path selects with a partial sort per row; the CUDA twin
// sorts each row on the device (CUB's segmented radix sort) and keeps the
// first K, so no scores travel to the host.
void top_k(const ExecContext& ctx, const float* scores, int64_t n, int64_t I,
           const int64_t* offsets, const int32_t* excluded, int K, int32_t* out_items,
           float* out_scores);

#ifdef NCF_WITH_CUDA
namespace cuda {
void top_k(const ExecContext& ctx, const float* scores, int64_t n, int64_t I,
           const int64_t* offsets, const int32_t* excluded, int K, int32_t* out_items,
           float* out_scores);
}  // namespace cuda
#endif

}  // namespace ncf
