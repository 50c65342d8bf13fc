// CPU side of ops_elementwise.h: argument checks, the dispatch to the CUDA twins, and
// parallel_for loops over the elements or rows.
#include "model/ops_elementwise.h"

#include <algorithm>

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/prefetch.h"
#include "model/cpu_matmul.h"
#include "model/ops_internal.h"

namespace ncf {

void fill(const ExecContext& ctx, float* x, int64_t n, float value) {
  check_rows("fill", n);
  check_ptr("fill", "x", x, n);
  NCF_DISPATCH_CUDA(ctx, fill, ctx, x, n, value);
  parallel_for(ctx.threads, n, 1 << 16,
               [&](int64_t i0, int64_t i1) { std::fill(x + i0, x + i1, value); });
}

// ---- BF16 storage -----------------------------------------------------------------

void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B) {
  const char* op = "to_bf16_rows";
  check_rows(op, B);
  check_width(op, "w", w);
  check_ld(op, "ldx", ldx, w);
  check_ld(op, "ldy", ldy, w);
  check_ptr(op, "X", X, B);
  check_ptr(op, "Y", Y, B);
  NCF_DISPATCH_CUDA(ctx, to_bf16_rows, ctx, X, ldx, w, Y, ldy, B);
  parallel_for(ctx.threads, B, row_grain(w), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      // Rows of a stride (a lookup's rows: ldx > w) the hardware prefetch follows poorly.
      if (ldx > w && b + 4 < b1) prefetch_row(X + (b + 4) * ldx, w);
      round_to_bf16_bits(X + b * ldx, Y + b * ldy, w);
    }
  });
}

namespace {

// The argument checks of split_tf32 and split_bf16.
void check_split(const char* op, const float* X, int64_t n, const void* hi, const void* lo) {
  check_rows(op, n);
  check_ptr(op, "X", X, n);
  check_ptr(op, "hi", hi, n);
  check_ptr(op, "lo", lo, n);
}

}  // namespace

void split_tf32(const ExecContext& ctx, const float* X, int64_t n, float* hi, float* lo) {
  check_split("split_tf32", X, n, hi, lo);
  NCF_DISPATCH_CUDA(ctx, split_tf32, ctx, X, n, hi, lo);
  parallel_for(ctx.threads, n, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      hi[i] = round_to_tf32(X[i]);
      lo[i] = X[i] - hi[i];
    }
  });
}

void split_bf16(const ExecContext& ctx, const float* X, int64_t n, uint16_t* hi, uint16_t* lo) {
  check_split("split_bf16", X, n, hi, lo);
  NCF_DISPATCH_CUDA(ctx, split_bf16, ctx, X, n, hi, lo);
  parallel_for(ctx.threads, n, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      hi[i] = float_to_bf16_bits(X[i]);
      lo[i] = float_to_bf16_bits(X[i] - bf16_bits_to_float(hi[i]));
    }
  });
}

}  // namespace ncf
