// CPU side of ops_groups.h: argument checks, the dispatch to the CUDA twins, and the
// CPU kernels (cpu_matmul on fixed row blocks for layer 0's product, parallel_for loops).
#include "model/ops_groups.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/prefetch.h"
#include "common/vector_isa.h"
#include "model/cpu_matmul.h"
#include "model/ops_internal.h"

namespace ncf {

void repeat_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, float* Y, int64_t n,
                 int S) {
  const char* op = "repeat_rows";
  check_rows(op, n);
  check_width(op, "w", w);
  check_width(op, "S", S);
  check_ld(op, "ldx", ldx, w);
  check_ptr(op, "X", X, n);
  check_ptr(op, "Y", Y, n);
  NCF_DISPATCH_CUDA(ctx, repeat_rows, ctx, X, ldx, w, Y, n, S);
  parallel_for(ctx.threads, n * S, row_grain(w), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) std::copy_n(X + (b / S) * ldx, w, Y + b * w);
  });
}

int64_t relu_mask_words(int out) { return (int64_t{out} + 127) / 128 * 4; }

void group_bias_act(const ExecContext& ctx, float* Y, const float* Yg, const float* bias, int64_t n,
                    int S, int out, bool relu) {
  const char* op = "group_bias_act";
  check_rows(op, n);
  check_width(op, "S", S);
  check_width(op, "out", out);
  check_ptr(op, "Y", Y, n);
  check_ptr(op, "Yg", Yg, n);
  NCF_DISPATCH_CUDA(ctx, group_bias_act, ctx, Y, Yg, bias, n, S, out, relu);
  parallel_for(ctx.threads, n * S, row_grain(out), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* y = Y + b * out;
      const float* u = Yg + (b / S) * out;
      for (int j = 0; j < out; ++j) {
        const float z = (y[j] + u[j]) + (bias ? bias[j] : 0.0f);
        y[j] = relu ? (z > 0.0f ? z : 0.0f) : z;
      }
    }
  });
}

namespace {

// Rows [r0, r1) of a [B × out] output's ReLU bit mask (relu_mask_words' layout).
template <typename T>
void write_relu_mask_rows(const T* Y, int64_t r0, int64_t r1, int out, uint32_t* mask) {
  const int64_t words = relu_mask_words(out);
  for (int64_t b = r0; b < r1; ++b) {
    const T* y = Y + b * out;
    uint32_t* m = mask + b * words;
    for (int64_t w = 0; w < words; ++w) {
      // Whole words as an OR over the bit table (vectorised); the last one bit by bit.
      const int64_t j0 = w * 32;
      uint32_t word = 0;
      if (out - j0 >= 32) {
        for (int bit = 0; bit < 32; ++bit) word |= positive(y[j0 + bit]) ? kBitOf[bit] : 0u;
      } else {
        for (int bit = 0; bit < 32 && j0 + bit < out; ++bit)
          word |= positive(y[j0 + bit]) ? kBitOf[bit] : 0u;
      }
      m[w] = word;
    }
  }
}

// The argument checks of group_linear_forward (either storage).
void check_group_linear(const char* op, const void* X, int64_t ldx, const void* weight, int64_t ldw,
                        const float* Yg, const void* Y, int64_t n, int S, int in, int out,
                        bool relu = true, const uint32_t* mask = nullptr) {
  NCF_CHECK(!mask || relu, op, ": a ReLU bit mask without the ReLU");
  check_rows(op, n);
  check_width(op, "S", S);
  check_width(op, "in", in);
  check_width(op, "out", out);
  check_ld(op, "ldx", ldx, in);
  check_ld(op, "ldw", ldw, in);
  NCF_CHECK(ldx <= INT_MAX && ldw <= INT_MAX, op, ": stride ldx=", ldx, " or ldw=", ldw,
            " exceeds the BLAS int range");
  NCF_CHECK(n * S <= INT_MAX, op, ": B=", n * S, " exceeds the BLAS int range");
  check_ptr(op, "X", X, n);
  check_ptr(op, "weight", weight, n);
  check_ptr(op, "Yg", Yg, n);
  check_ptr(op, "Y", Y, n);
}

}  // namespace

void group_linear_forward(const ExecContext& ctx, const float* X, int64_t ldx, const float* weight,
                          int64_t ldw, const float* Yg, const float* bias, float* Y, int64_t n,
                          int S, int in, int out, bool relu, uint32_t* mask) {
  check_group_linear("group_linear_forward", X, ldx, weight, ldw, Yg, Y, n, S, in, out, relu, mask);
  NCF_DISPATCH_CUDA(ctx, group_linear_forward, ctx, X, ldx, weight, ldw, Yg, bias, Y, n, S, in, out,
                    relu, mask);
  const int64_t B = n * S;
  const int64_t blocks = (B + kGemmRows - 1) / kGemmRows;
  const MatmulPrecision prec = matmul_precision();
  parallel_for_wide(ctx.threads, blocks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * kGemmRows, r1 = std::min(B, r0 + kGemmRows);
      // The block's rows start as their users' rows; the product adds to them
      // while the block is in cache.
      for (int64_t b = r0; b < r1; ++b)
        std::copy(Yg + (b / S) * out, Yg + (b / S + 1) * out, Y + b * out);
      MatmulEpilogue ep;
      ep.beta = 1.0f;
      ep.bias = bias;
      ep.relu = relu;
      cpu_matmul(matmul_shape(static_cast<int>(r1 - r0), out, in, false, true,
                              static_cast<int>(ldx), static_cast<int>(ldw), out),
                 X + r0 * ldx, weight, Y + r0 * out, ep, prec);
      if (mask) write_relu_mask_rows(Y, r0, r1, out, mask);
    }
  });
}

namespace {

void check_group_sum(const char* op, const void* Y, const void* dY, int64_t n, int S, int out,
                     const float* dYg, int64_t lddyg, bool relu, const uint32_t* mask) {
  check_rows(op, n);
  check_width(op, "S", S);
  check_width(op, "out", out);
  check_ld(op, "lddyg", lddyg, out);
  check_ptr(op, "dY", dY, n);
  check_ptr(op, "dYg", dYg, n);
  NCF_CHECK(!mask || relu, op, ": a ReLU bit mask without the ReLU");
  if (relu && !mask) check_ptr(op, "Y (needed for the ReLU mask)", Y, n);
}

// group_sum_backward on the CPU, T float or uint16_t (BF16 bits).
template <typename T>
void group_sum_cpu(const ExecContext& ctx, const T* Y, T* dY, int64_t n, int S, int out, float* dYg,
                   int64_t lddyg, float* db, bool relu, const uint32_t* mask) {
  const int64_t words = relu_mask_words(out);
  parallel_for_wide(ctx.threads, n, row_grain(int64_t(out) * S), [&](int64_t p0, int64_t p1) {
    std::vector<double> acc_buf(static_cast<size_t>(out));
    double* acc = acc_buf.data();
    for (int64_t p = p0; p < p1; ++p) {
      std::fill(acc, acc + out, 0.0);
      for (int s = 0; s < S; ++s) {
        T* dy = dY + (p * S + s) * out;
        // Two branch-free loops (the mask, then the sums), which the compiler
        // vectorises; the same values as masking and adding element by element.
        if (relu && mask) {
          apply_relu_mask(mask + (p * S + s) * words, dy, out);
        } else if (relu) {
          const T* y = Y + (p * S + s) * out;
          for (int j = 0; j < out; ++j) dy[j] = positive(y[j]) ? dy[j] : T{0};
        }
        for (int j = 0; j < out; ++j) acc[j] += static_cast<double>(ld(dy[j]));
      }
      for (int j = 0; j < out; ++j) dYg[p * lddyg + j] = static_cast<float>(acc[j]);
    }
  });
  if (!db) return;
  std::vector<double> sums(static_cast<size_t>(out));
  block_sums_wide(
      ctx.threads, n, out,
      [&](int64_t p0, int64_t p1, double* acc) {
        for (int64_t p = p0; p < p1; ++p)
          for (int j = 0; j < out; ++j) acc[j] += dYg[p * lddyg + j];
      },
      sums.data());
  for (int j = 0; j < out; ++j) db[j] = static_cast<float>(sums[size_t(j)]);
}

}  // namespace

void group_sum_backward(const ExecContext& ctx, const float* Y, float* dY, int64_t n, int S,
                        int out, float* dYg, int64_t lddyg, float* db, bool relu,
                        const uint32_t* mask) {
  check_group_sum("group_sum_backward", Y, dY, n, S, out, dYg, lddyg, relu, mask);
  NCF_DISPATCH_CUDA(ctx, group_sum_backward, ctx, Y, dY, n, S, out, dYg, lddyg, db, relu, mask);
  group_sum_cpu(ctx, Y, dY, n, S, out, dYg, lddyg, db, relu, mask);
}

void group_linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, int64_t ldx,
                               const uint16_t* weight, int64_t ldw, const float* Yg,
                               const float* bias, uint16_t* Y, int64_t n, int S, int in, int out,
                               bool relu, uint32_t* mask) {
  check_group_linear("group_linear_forward_bf16", X, ldx, weight, ldw, Yg, Y, n, S, in, out, relu,
                     mask);
  NCF_DISPATCH_CUDA(ctx, group_linear_forward_bf16, ctx, X, ldx, weight, ldw, Yg, bias, Y, n, S, in,
                    out, relu, mask);
  const int64_t B = n * S;
  const int64_t blocks = (B + kGemmRows - 1) / kGemmRows;
  parallel_for_wide(ctx.threads, blocks, 1, [&](int64_t k0, int64_t k1) {
    // The block's FP32 product, then its epilogue (the bias, the users' rows, the
    // ReLU: oneDNN's order for group_linear_forward's bias and sum post-ops) and
    // the rounding in one pass while the block is in cache.
    thread_local std::vector<float> block;
    if (block.size() < static_cast<size_t>(kGemmRows * out))
      block.resize(static_cast<size_t>(kGemmRows * out));
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * kGemmRows, r1 = std::min(B, r0 + kGemmRows);
      cpu_matmul_bf16(matmul_shape(static_cast<int>(r1 - r0), out, in, false, true,
                                   static_cast<int>(ldx), static_cast<int>(ldw), out),
                      X + r0 * ldx, weight, block.data(), nullptr, MatmulEpilogue{});
      for (int64_t b = r0; b < r1; ++b)
        epilogue_to_bf16_bits(block.data() + (b - r0) * out, bias, Yg + (b / S) * out, relu,
                              Y + b * out, out);
      if (mask) write_relu_mask_rows(Y, r0, r1, out, mask);
    }
  });
}

namespace {

// gather_bias_act's rows: the ReLU mask of a block of kGatherBlock rows written while
// the block is in cache, and the row of sample b + kGatherAhead fetched ahead (the ids
// pick rows of P at random, each a cache miss otherwise).
constexpr int64_t kGatherBlock = 256;
constexpr int64_t kGatherAhead = 4;

// Both storages' gather_bias_act on the CPU: row(z, b) writes sample b's output row from
// z = P's row ids[b]; then the ReLU bit mask of each block of rows.
template <typename T, typename RowFn>
void gather_rows_cpu(const ExecContext& ctx, const float* P, const int32_t* ids, T* Y, int64_t B,
                     int out, uint32_t* mask, RowFn row) {
  parallel_for_wide(ctx.threads, B, row_grain(out), [&](int64_t b0, int64_t b1) {
    for (int64_t c0 = b0; c0 < b1; c0 += kGatherBlock) {
      const int64_t c1 = std::min(b1, c0 + kGatherBlock);
      for (int64_t b = c0; b < c1; ++b) {
        if (b + kGatherAhead < b1) prefetch_row(P + int64_t(ids[b + kGatherAhead]) * out, out);
        row(P + int64_t(ids[b]) * out, b);
      }
      if (mask) write_relu_mask_rows(Y, c0, c1, out, mask);
    }
  });
}

}  // namespace

void gather_bias_act(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                     const float* Yg, const float* bias, float* Y, int64_t n, int S, int out,
                     bool relu, uint32_t* mask) {
  const char* op = "gather_bias_act";
  check_gather_bias_act(op, P, R, ids, Yg, Y, n, S, out);
  if (!relu) mask = nullptr;
  NCF_DISPATCH_CUDA(ctx, gather_bias_act, ctx, P, R, ids, Yg, bias, Y, n, S, out, relu, mask);
  check_ids_cpu(op, ids, n * S, R);
  gather_rows_cpu(ctx, P, ids, Y, n * S, out, mask, [&](const float* z, int64_t b) {
    const float* u = Yg + (b / S) * out;
    float* y = Y + b * out;
    for (int j = 0; j < out; ++j) {
      const float v = (z[j] + u[j]) + (bias ? bias[j] : 0.0f);
      y[j] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
  });
}

void gather_bias_act_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                          const float* Yg, const float* bias, uint16_t* Y, int64_t n, int S,
                          int out, bool relu, uint32_t* mask) {
  const char* op = "gather_bias_act_bf16";
  check_gather_bias_act(op, P, R, ids, Yg, Y, n, S, out);
  if (!relu) mask = nullptr;
  NCF_DISPATCH_CUDA(ctx, gather_bias_act_bf16, ctx, P, R, ids, Yg, bias, Y, n, S, out, relu, mask);
  check_ids_cpu(op, ids, n * S, R);
  gather_rows_cpu(ctx, P, ids, Y, n * S, out, mask, [&](const float* z, int64_t b) {
    epilogue_to_bf16_bits(z, bias, Yg + (b / S) * out, relu, Y + b * out, out);
  });
}

void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask) {
  check_group_sum("group_sum_backward_bf16", Y, dY, n, S, out, dYg, lddyg, relu, mask);
  NCF_DISPATCH_CUDA(ctx, group_sum_backward_bf16, ctx, Y, dY, n, S, out, dYg, lddyg, db, relu,
                    mask);
  group_sum_cpu(ctx, Y, dY, n, S, out, dYg, lddyg, db, relu, mask);
}

}  // namespace ncf
