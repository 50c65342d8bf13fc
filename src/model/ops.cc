// CPU side of ops.h: argument checks, the dispatch to the CUDA twins, and the
// CPU kernels (OpenBLAS for GEMMs, on BF16-rounded operand copies in
// MathMode::kBf16; parallel_for row loops for the rest).
#include "model/ops.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/env_switch.h"
#include "common/parallel.h"
#include "common/prefetch.h"
#include "common/vector_isa.h"
#include "model/cpu_matmul.h"
#include "model/ops_internal.h"

namespace ncf {
namespace {

// The tower's products: cpu_matmul (model/cpu_matmul.h, oneDNN) on fixed
// blocks, with BF16 operands when the math mode is kBf16 (kTf32 and kFp32 are
// plain FP32 here), and the epilogue (bias, ReLU) fused into each block's
// product. The blocks' shapes depend on M, N and K only, never on the thread
// count, and each runs single-threaded on one pool thread: kGemmRows output rows
// when M is large (the batch); else, for a long K (K ≥ 2·kGemmDepth: a weight
// gradient), tiles of one slice of kGemmDepth along K by up to kGemmTileCols
// output columns, whose partial products are summed in slice order, in double;
// else kGemmCols output columns when N is large.
// The tiles are as wide as they are because every partial product packs its
// slices of A and B again: 64-column blocks over the whole of K packed A once
// per block, and oneDNN spent 13% more time on the ml-20m tower's weight
// gradients in either precision (bench/results/gemm_tiles_2026-11-28).
// T is float, or uint16_t for operands already stored as BF16 bits (their
// products run on cpu_matmul_bf16, whatever the math mode); TC is float, or
// uint16_t for a BF16 output (then beta is 0: each element is
// act(alpha·op(A)·op(B) + bias) rounded once).
template <typename T, typename TC>
void cpu_gemm_t(int threads, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                const T* A, int lda, const T* B, int ldb, float beta, TC* C, int ldc,
                const float* bias, bool relu) {
  constexpr bool c16 = std::is_same<TC, uint16_t>::value;
  static_assert(std::is_same<T, float>::value || std::is_same<T, uint16_t>::value, "operands");
  static_assert(!c16 || std::is_same<T, uint16_t>::value, "a BF16 output needs BF16 operands");
  NCF_CHECK(!c16 || beta == 0.0f, "cpu_gemm: beta=", beta, " with a BF16 output");
  if (M == 0 || N == 0) return;
  // The epilogue on one element's FP32 value v (the product, plus beta·C).
  auto store = [&](TC& c, int j, float v) {
    if (bias) v += bias[j];
    v = relu ? (v > 0.0f ? v : 0.0f) : v;
    if constexpr (c16) {
      c = float_to_bf16_bits(v);
    } else {
      c = v;
    }
  };
  auto old = [&](const TC& c) -> float {
    if constexpr (c16) {
      return 0.0f;
    } else {
      return c;
    }
  };
  if (K == 0) {  // no product: C = act(beta·C + bias), spelled out
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        TC& c = C[static_cast<int64_t>(i) * ldc + j];
        store(c, j, beta == 0.0f ? 0.0f : beta * old(c));
      }
    return;
  }
  const MatmulPrecision prec = matmul_precision();
  // cpu_matmul adds C with weight 0 or 1; another beta scales C first.
  auto prescale = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if constexpr (!c16) {
      if (beta == 0.0f || beta == 1.0f) return;
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = c0; j < c1; ++j) C[i * ldc + j] *= beta;
    } else {
      (void)r0, (void)r1, (void)c0, (void)c1;
    }
  };
  const float mm_beta = beta == 0.0f ? 0.0f : 1.0f;
  auto product = [&](int m, int n, int k, const T* a, const T* bb, auto* c, int ldc_out,
                     const float* bias_part, float b, bool act) {
    MatmulEpilogue ep;
    ep.alpha = alpha;
    ep.beta = b;
    ep.bias = bias_part;
    ep.relu = act;
    const MatmulShape sh = matmul_shape(m, n, k, trans_a, trans_b, lda, ldb, ldc_out);
    using Out = std::remove_pointer_t<decltype(c)>;
    if constexpr (std::is_same<T, float>::value) {
      cpu_matmul(sh, a, bb, c, ep, prec);
    } else if constexpr (std::is_same<Out, uint16_t>::value) {
      cpu_matmul_bf16(sh, a, bb, nullptr, c, ep);
    } else {
      cpu_matmul_bf16(sh, a, bb, c, nullptr, ep);
    }
  };
  if (M >= 2 * kGemmRows) {
    const int64_t blocks = (M + kGemmRows - 1) / kGemmRows;
    parallel_for(threads, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t m0 = b * kGemmRows;
        const int m = static_cast<int>(std::min<int64_t>(kGemmRows, M - m0));
        prescale(m0, m0 + m, 0, N);
        // Rows m0.. of op(A): rows of A, or columns of A when transposed.
        const T* a = trans_a ? A + m0 : A + m0 * lda;
        product(m, N, K, a, B, C + m0 * ldc, ldc, bias, mm_beta, relu);
      }
    });
  } else if (K >= 2 * kGemmDepth) {
    const int64_t slices = (K + kGemmDepth - 1) / kGemmDepth;
    const int64_t col_blocks = (N + kGemmTileCols - 1) / kGemmTileCols;
    const int64_t mn = static_cast<int64_t>(M) * N;
    thread_local std::vector<float> partial;
    if (partial.size() < static_cast<size_t>(slices * mn))
      partial.resize(static_cast<size_t>(slices * mn));
    float* p = partial.data();
    parallel_for(threads, slices * col_blocks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t s = t / col_blocks, n0 = (t % col_blocks) * kGemmTileCols;
        const int64_t k0 = s * kGemmDepth;
        const int k = static_cast<int>(std::min<int64_t>(kGemmDepth, K - k0));
        const int n = static_cast<int>(std::min<int64_t>(kGemmTileCols, N - n0));
        // Columns k0.. of op(A); rows k0.. and columns n0.. of op(B).
        const T* a = trans_a ? A + k0 * lda : A + k0;
        const T* bb = trans_b ? B + n0 * ldb + k0 : B + k0 * ldb + n0;
        // The bias and the ReLU apply to the sum of the slices, below.
        product(M, n, k, a, bb, p + s * mn + n0, static_cast<int>(N), nullptr, 0.0f, false);
      }
    });
    // Each element sums its slices in slice order, whichever thread has its row.
    parallel_for(threads, M, row_grain(N * slices), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int j = 0; j < N; ++j) {
          double acc = 0.0;
          for (int64_t s = 0; s < slices; ++s) acc += p[s * mn + i * N + j];
          TC& c = C[i * ldc + j];
          store(c, j,
                static_cast<float>(beta == 0.0f ? acc : acc + static_cast<double>(beta) * old(c)));
        }
    });
  } else if (N >= 2 * kGemmCols) {
    const int64_t blocks = (N + kGemmCols - 1) / kGemmCols;
    parallel_for(threads, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n0 = b * kGemmCols;
        const int n = static_cast<int>(std::min<int64_t>(kGemmCols, N - n0));
        prescale(0, M, n0, n0 + n);
        // Columns n0.. of op(B): columns of B, or rows of B when transposed.
        const T* bb = trans_b ? B + n0 * ldb : B + n0;
        product(M, n, K, A, bb, C + n0, ldc, bias ? bias + n0 : nullptr, mm_beta, relu);
      }
    });
  } else {
    prescale(0, M, 0, N);
    product(M, N, K, A, B, C, ldc, bias, mm_beta, relu);
  }
}

void cpu_gemm(int threads, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
              const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc,
              const float* bias = nullptr, bool relu = false) {
  cpu_gemm_t<float, float>(threads, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                           bias, relu);
}

}  // namespace

namespace {
std::atomic<MathMode> g_math_mode{MathMode::kTf32};
std::atomic<StepKernels> g_step_kernels{StepKernels::kStreaming};
}  // namespace

void set_step_kernels(StepKernels kernels) { g_step_kernels.store(kernels); }
StepKernels step_kernels() { return g_step_kernels.load(); }

StepKernels parse_step_kernels(const std::string& name, const std::string& what) {
  if (name == "streaming") return StepKernels::kStreaming;
  if (name == "legacy") return StepKernels::kLegacy;
  NCF_FAIL(what, "=", name, ": expected streaming or legacy");
}

const char* step_kernels_name(StepKernels kernels) {
  return kernels == StepKernels::kLegacy ? "legacy" : "streaming";
}

namespace {
std::atomic<int> g_lt_bf16_out{-1};    // -1: not read from the environment yet
std::atomic<int> g_three_blocks{-1};   // likewise
std::atomic<int> g_run_sums_warp{-1};  // likewise
std::atomic<int> g_scatter_four{-1};   // likewise
}  // namespace

bool lt_bf16_out_enabled() { return env_switch(g_lt_bf16_out, "NCF_LT_BF16_OUT"); }
void set_lt_bf16_out(bool on) { g_lt_bf16_out.store(on ? 1 : 0); }
bool three_block_kernels() { return env_switch(g_three_blocks, "NCF_3BLOCK_KERNELS"); }
void set_three_block_kernels(bool on) { g_three_blocks.store(on ? 1 : 0); }
bool run_sums_by_warp() { return env_switch(g_run_sums_warp, "NCF_RUN_SUMS_WARP"); }
void set_run_sums_by_warp(bool on) { g_run_sums_warp.store(on ? 1 : 0); }
bool scatter_rows_by_four() { return env_switch(g_scatter_four, "NCF_SCATTER_BY_FOUR"); }
void set_scatter_rows_by_four(bool on) { g_scatter_four.store(on ? 1 : 0); }

void set_math_mode(MathMode mode) { g_math_mode.store(mode); }
MathMode math_mode() { return g_math_mode.load(); }

MathMode parse_math_mode(const std::string& name) {
  if (name == "tf32") return MathMode::kTf32;
  if (name == "fp32") return MathMode::kFp32;
  if (name == "bf16") return MathMode::kBf16;
  NCF_FAIL("unknown precision '", name, "' (expected tf32, fp32 or bf16)");
}

const char* math_mode_name(MathMode mode) {
  switch (mode) {
    case MathMode::kTf32:
      return "tf32";
    case MathMode::kFp32:
      return "fp32";
    case MathMode::kBf16:
      return "bf16";
  }
  return "unknown";
}

void fill(const ExecContext& ctx, float* x, int64_t n, float value) {
  check_rows("fill", n);
  check_ptr("fill", "x", x, n);
  NCF_DISPATCH_CUDA(ctx, fill, ctx, x, n, value);
  parallel_for(ctx.threads, n, 1 << 16,
               [&](int64_t i0, int64_t i1) { std::fill(x + i0, x + i1, value); });
}

void gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  NCF_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  NCF_CHECK(lda >= std::max(1, trans_a ? M : K), "gemm: lda=", lda, " too small (M=", M, " K=", K,
            trans_a ? ", A transposed)" : ")");
  NCF_CHECK(ldb >= std::max(1, trans_b ? K : N), "gemm: ldb=", ldb, " too small (K=", K, " N=", N,
            trans_b ? ", B transposed)" : ")");
  NCF_CHECK(ldc >= std::max(1, N), "gemm: ldc=", ldc, " too small (N=", N, ")");
  bool any = M > 0 && N > 0;
  NCF_CHECK(!any || C != nullptr, "gemm: C is null");
  NCF_CHECK(!any || K == 0 || (A != nullptr && B != nullptr), "gemm: A or B is null");
  NCF_DISPATCH_CUDA(ctx, gemm, ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  cpu_gemm(ctx.threads, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

// The argument checks of linear_forward (either storage).
void check_linear_forward(const char* op, const void* X, const void* weight, const void* Y,
                          int64_t B, int in, int out) {
  check_rows(op, B);
  check_width(op, "in", in);
  check_width(op, "out", out);
  NCF_CHECK(B <= INT_MAX, op, ": B=", B, " exceeds the BLAS int range");
  check_ptr(op, "X", X, B);
  check_ptr(op, "weight", weight, B);
  check_ptr(op, "Y", Y, B);
}

}  // namespace

void linear_forward(const ExecContext& ctx, const float* X, const float* weight, const float* bias,
                    float* Y, int64_t B, int in, int out, bool relu) {
  check_linear_forward("linear_forward", X, weight, Y, B, in, out);
  NCF_DISPATCH_CUDA(ctx, linear_forward, ctx, X, weight, bias, Y, B, in, out, relu);
  if (B == 0) return;
  // Y = act(X · weight^T + bias), the bias and the ReLU applied by each block's product
  cpu_gemm(ctx.threads, false, true, static_cast<int>(B), out, in, 1.0f, X, in, weight, in, 0.0f, Y,
           out, bias, relu);
}

namespace {

// The argument checks of linear_backward (either storage).
void check_linear_backward(const char* op, const void* X, const void* weight, const void* Y,
                           const void* dY, const float* dweight, int64_t B, int in, int out,
                           bool relu) {
  check_rows(op, B);
  check_width(op, "in", in);
  check_width(op, "out", out);
  NCF_CHECK(B <= INT_MAX, op, ": B=", B, " exceeds the BLAS int range");
  check_ptr(op, "X", X, B);
  check_ptr(op, "weight", weight, B);
  check_ptr(op, "dY", dY, B);
  if (relu) check_ptr(op, "Y (needed for the ReLU mask)", Y, B);
  NCF_CHECK(dweight != nullptr, op, ": dweight is null");
}

// db[j] = Σ_k partial[k, j] in block order (in double), written as `mode` says.
void finish_block_sums(const std::vector<double>& partial, int64_t blocks, int out, float* db,
                       GradMode mode) {
  for (int j = 0; j < out; ++j) {
    double sum = 0.0;
    for (int64_t k = 0; k < blocks; ++k) sum += partial[static_cast<size_t>(k) * out + j];
    const float v = static_cast<float>(sum);
    db[j] = mode == GradMode::kAccumulate ? db[j] + v : v;
  }
}

// linear_backward on the CPU, T float or uint16_t (BF16 bits, linear_backward_bf16).
// One pass over fixed blocks of kReduceBlock rows, each while it is in cache: the
// ReLU mask applied to dY in place, the block's column sums of dZ (in double, summed
// over blocks in block order afterwards: block_sums' order), and the block's rows of
// dX[B×in] = dZ[B×out] · weight[out×in]; then dweight = dZ^T · X.
template <typename T>
void linear_backward_cpu(const ExecContext& ctx, const T* X, const T* weight, const T* Y, T* dY,
                         T* dX, float* dweight, float* db, int64_t B, int in, int out, bool relu,
                         GradMode mode, const uint32_t* dx_mask = nullptr) {
  const int64_t mask_words = relu_mask_words(in);
  const int64_t blocks = (B + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partial(db ? static_cast<size_t>(blocks) * out : 0, 0.0);
  const MatmulPrecision prec = matmul_precision();
  parallel_for_wide(ctx.threads, blocks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * kReduceBlock, r1 = std::min(B, r0 + kReduceBlock);
      T* dz = dY + r0 * out;
      const int64_t len = (r1 - r0) * out;
      if (relu) {
        const T* y = Y + r0 * out;
        for (int64_t i = 0; i < len; ++i) dz[i] = positive(y[i]) ? dz[i] : T{0};  // branch-free
      }
      if (db) {
        double* acc = &partial[static_cast<size_t>(k) * out];
        for (int64_t r = 0; r < r1 - r0; ++r)
          for (int j = 0; j < out; ++j) acc[j] += ld(dz[r * out + j]);
      }
      if (dX) {
        const MatmulShape sh =
            matmul_shape(static_cast<int>(r1 - r0), in, out, false, false, out, in, in);
        if constexpr (std::is_same<T, float>::value) {
          cpu_matmul(sh, dz, weight, dX + r0 * in, MatmulEpilogue{}, prec);
        } else {
          cpu_matmul_bf16(sh, dz, weight, nullptr, dX + r0 * in, MatmulEpilogue{});
        }
        if (dx_mask)
          for (int64_t r = r0; r < r1; ++r)
            apply_relu_mask(dx_mask + r * mask_words, dX + r * in, in);
      }
    }
  });
  // dweight[out×in] = dZ^T[out×B] · X[B×in]
  cpu_gemm_t<T, float>(ctx.threads, true, false, out, in, static_cast<int>(B), 1.0f, dY, out, X, in,
                       mode == GradMode::kAccumulate ? 1.0f : 0.0f, dweight, in, nullptr, false);
  if (db) finish_block_sums(partial, blocks, out, db, mode);
}

}  // namespace

void linear_backward(const ExecContext& ctx, const float* X, const float* weight, const float* Y,
                     float* dY, float* dX, float* dweight, float* db, int64_t B, int in, int out,
                     bool relu, GradMode mode, const uint32_t* dx_mask) {
  check_linear_backward("linear_backward", X, weight, Y, dY, dweight, B, in, out, relu);
  NCF_CHECK(!dx_mask || dX, "linear_backward: a mask for dX without dX");
  NCF_DISPATCH_CUDA(ctx, linear_backward, ctx, X, weight, Y, dY, dX, dweight, db, B, in, out, relu,
                    mode, dx_mask);
  linear_backward_cpu(ctx, X, weight, Y, dY, dX, dweight, db, B, in, out, relu, mode, dx_mask);
}

void gmf_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                 int64_t ldi, float* gmf, int64_t ldg, int64_t B, int mf) {
  const char* op = "gmf_forward";
  check_rows(op, B);
  check_width(op, "mf", mf);
  check_ld(op, "ldu", ldu, mf);
  check_ld(op, "ldi", ldi, mf);
  check_ld(op, "ldg", ldg, mf);
  check_ptr(op, "urows", urows, B);
  check_ptr(op, "irows", irows, B);
  check_ptr(op, "gmf", gmf, B);
  NCF_DISPATCH_CUDA(ctx, gmf_forward, ctx, urows, ldu, irows, ldi, gmf, ldg, B, mf);
  parallel_for(ctx.threads, B, row_grain(mf), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* u = urows + b * ldu;
      const float* it = irows + b * ldi;
      float* g = gmf + b * ldg;
      for (int k = 0; k < mf; ++k) g[k] = u[k] * it[k];
    }
  });
}

void gmf_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                  int64_t ldi, const float* dgmf, int64_t ldg, float* durows, int64_t lddu,
                  float* dirows, int64_t lddi, int64_t B, int mf) {
  const char* op = "gmf_backward";
  check_rows(op, B);
  check_width(op, "mf", mf);
  check_ld(op, "ldu", ldu, mf);
  check_ld(op, "ldi", ldi, mf);
  check_ld(op, "ldg", ldg, mf);
  check_ld(op, "lddu", lddu, mf);
  check_ld(op, "lddi", lddi, mf);
  check_ptr(op, "urows", urows, B);
  check_ptr(op, "irows", irows, B);
  check_ptr(op, "dgmf", dgmf, B);
  check_ptr(op, "durows", durows, B);
  check_ptr(op, "dirows", dirows, B);
  NCF_DISPATCH_CUDA(ctx, gmf_backward, ctx, urows, ldu, irows, ldi, dgmf, ldg, durows, lddu, dirows,
                    lddi, B, mf);
  parallel_for(ctx.threads, B, row_grain(mf), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* u = urows + b * ldu;
      const float* it = irows + b * ldi;
      const float* g = dgmf + b * ldg;
      float* du = durows + b * lddu;
      float* di = dirows + b * lddi;
      for (int k = 0; k < mf; ++k) {
        du[k] = g[k] * it[k];
        di[k] = g[k] * u[k];
      }
    }
  });
}

void concat_cols(const ExecContext& ctx, const float* A, int64_t lda, int wa, const float* C,
                 int64_t ldc, int wc, float* Y, int64_t B) {
  const char* op = "concat_cols";
  check_rows(op, B);
  check_width(op, "wa", wa);
  check_width(op, "wc", wc);
  check_ld(op, "lda", lda, wa);
  check_ld(op, "ldc", ldc, wc);
  check_ptr(op, "A", A, B);
  check_ptr(op, "C", C, B);
  check_ptr(op, "Y", Y, B);
  NCF_DISPATCH_CUDA(ctx, concat_cols, ctx, A, lda, wa, C, ldc, wc, Y, B);
  const int64_t w = static_cast<int64_t>(wa) + wc;
  parallel_for(ctx.threads, B, row_grain(w), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      std::copy(A + b * lda, A + b * lda + wa, Y + b * w);
      std::copy(C + b * ldc, C + b * ldc + wc, Y + b * w + wa);
    }
  });
}

void split_cols(const ExecContext& ctx, const float* dY, int wa, int wc, float* dA, int64_t ldda,
                float* dC, int64_t lddc, int64_t B) {
  const char* op = "split_cols";
  check_rows(op, B);
  check_width(op, "wa", wa);
  check_width(op, "wc", wc);
  check_ld(op, "ldda", ldda, wa);
  check_ld(op, "lddc", lddc, wc);
  check_ptr(op, "dY", dY, B);
  check_ptr(op, "dA", dA, B);
  check_ptr(op, "dC", dC, B);
  NCF_DISPATCH_CUDA(ctx, split_cols, ctx, dY, wa, wc, dA, ldda, dC, lddc, B);
  const int64_t w = static_cast<int64_t>(wa) + wc;
  parallel_for(ctx.threads, B, row_grain(w), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* y = dY + b * w;
      std::copy(y, y + wa, dA + b * ldda);
      std::copy(y + wa, y + w, dC + b * lddc);
    }
  });
}

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

void gemm_bf16(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
               const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc) {
  const char* op = "gemm_bf16";
  NCF_CHECK(M >= 0 && N >= 0 && K >= 0, op, ": negative size M=", M, " N=", N, " K=", K);
  check_ld(op, "lda", lda, trans_a ? M : K);
  check_ld(op, "ldb", ldb, trans_b ? K : N);
  check_ld(op, "ldc", ldc, N);
  if (int64_t(M) * N == 0) return;
  check_ptr(op, "C", C, 1);
  if (K > 0) {
    check_ptr(op, "A", A, 1);
    check_ptr(op, "B", B, 1);
  }
  NCF_DISPATCH_CUDA(ctx, gemm_bf16, ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  cpu_gemm_t<uint16_t, float>(ctx.threads, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C,
                              ldc, nullptr, false);
}

void linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                         const uint16_t* bias, uint16_t* Y, int64_t B, int in, int out, bool relu) {
  check_linear_forward("linear_forward_bf16", X, weight, Y, B, in, out);
  NCF_DISPATCH_CUDA(ctx, linear_forward_bf16, ctx, X, weight, bias, Y, B, in, out, relu);
  if (B == 0) return;
  std::vector<float> bias32;  // the BF16 bias's values, which the FP32 epilogue adds
  if (bias) {
    bias32.resize(static_cast<size_t>(out));
    for (int j = 0; j < out; ++j) bias32[size_t(j)] = bf16_bits_to_float(bias[j]);
  }
  cpu_gemm_t<uint16_t, uint16_t>(ctx.threads, false, true, static_cast<int>(B), out, in, 1.0f, X,
                                 in, weight, in, 0.0f, Y, out, bias ? bias32.data() : nullptr,
                                 relu);
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

void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first) {
  const char* op = "item_runs";
  check_rows(op, B);
  NCF_CHECK(B <= INT_MAX, op, ": B=", B, " samples exceed the int32 positions");
  NCF_CHECK(bound >= 1 && bound <= int64_t{INT_MAX} + 1, op, ": id bound ", bound,
            " is outside [1, 2^31]");
  NCF_CHECK(R >= std::min(B, bound) && R <= INT_MAX, op, ": R=", R,
            " runs cannot hold the distinct ids of B=", B, " samples below ", bound);
  check_ptr(op, "ids", ids, B);
  check_ptr(op, "order", order, B);
  check_ptr(op, "inv", inv, B);
  NCF_CHECK(starts != nullptr, op, ": starts is null");
  check_ptr(op, "first", first, R);
  NCF_DISPATCH_CUDA(ctx, item_runs, ctx, ids, B, bound, R, order, starts, inv, first);
  check_ids_cpu(op, ids, B, bound);
  // A stable sort of the positions by id: counting where the ids are few against the
  // samples, else std::stable_sort.
  if (bound <= 2 * B + 1024) {
    std::vector<int32_t> at(static_cast<size_t>(bound) + 1, 0);
    for (int64_t b = 0; b < B; ++b) ++at[static_cast<size_t>(ids[b]) + 1];
    for (int64_t k = 0; k < bound; ++k) at[k + 1] += at[k];
    for (int64_t b = 0; b < B; ++b) order[at[ids[b]]++] = static_cast<int32_t>(b);
  } else {
    for (int64_t b = 0; b < B; ++b) order[b] = static_cast<int32_t>(b);
    std::stable_sort(order, order + B, [&](int32_t x, int32_t y) { return ids[x] < ids[y]; });
  }
  int64_t u = -1;
  for (int64_t k = 0; k < B; ++k) {
    const int32_t b = order[k];
    if (k == 0 || ids[b] != ids[order[k - 1]]) {
      ++u;
      starts[u] = static_cast<int32_t>(k);
      first[u] = b;
    }
    inv[b] = static_cast<int32_t>(u);
  }
  for (int64_t v = u + 1; v < R; ++v) {
    starts[v] = static_cast<int32_t>(B);
    first[v] = -1;
  }
  starts[R] = static_cast<int32_t>(B);
}

void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids) {
  const char* op = "gather_run_rows";
  check_rows(op, R);
  check_width(op, "w", w);
  check_ld(op, "ldx", ldx, w);
  check_ptr(op, "first", first, R);
  check_ptr(op, "Y", Y, R);
  NCF_DISPATCH_CUDA(ctx, gather_run_rows, ctx, X, ldx, w, first, R, Y, ids);
  parallel_for(ctx.threads, R, row_grain(w), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      float* y = Y + u * w;
      if (first[u] < 0) {
        std::fill(y, y + w, 0.0f);
      } else {
        const int64_t row = ids != nullptr ? ids[first[u]] : first[u];
        std::copy_n(X + row * ldx, w, y);
      }
    }
  });
}

namespace {

template <typename T>
void run_sums_cpu(const ExecContext& ctx, const T* dZ, const int32_t* order, const int32_t* starts,
                  int64_t R, int out, float* dP) {
  parallel_for(ctx.threads, R, row_grain(out), [&](int64_t u0, int64_t u1) {
    std::vector<double> acc(static_cast<size_t>(out));
    for (int64_t u = u0; u < u1; ++u) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = starts[u]; k < starts[u + 1]; ++k) {
        const T* z = dZ + int64_t{order[k]} * out;
        for (int j = 0; j < out; ++j) acc[j] += static_cast<double>(ld(z[j]));
      }
      for (int j = 0; j < out; ++j) dP[u * out + j] = static_cast<float>(acc[j]);
    }
  });
}

// dZ and order have as many rows as the runs' samples, which only starts[R] knows.
void check_run_sums(const char* op, const int32_t* starts, int64_t R, int out, const float* dP) {
  check_rows(op, R);
  check_width(op, "out", out);
  NCF_CHECK(starts != nullptr, op, ": starts is null");
  check_ptr(op, "dP", dP, R);
}

}  // namespace

void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP) {
  check_run_sums("run_sums", starts, R, out, dP);
  NCF_DISPATCH_CUDA(ctx, run_sums, ctx, dZ, order, starts, R, out, dP);
  run_sums_cpu(ctx, dZ, order, starts, R, out, dP);
}

void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP) {
  check_run_sums("run_sums_bf16", starts, R, out, dP);
  NCF_DISPATCH_CUDA(ctx, run_sums_bf16, ctx, dZ, order, starts, R, out, dP);
  run_sums_cpu(ctx, dZ, order, starts, R, out, dP);
}

namespace {
// y[0..w) = run u's row: its parts' rows Yr[p·R + u] added in p order (scatter_run_rows,
// put_run_rows).
void run_row(const float* Yr, int64_t R, int parts, int w, int64_t u, float* y) {
  for (int c = 0; c < w; ++c) {
    float s = Yr[u * w + c];
    for (int p = 1; p < parts; ++p) s += Yr[(p * R + u) * w + c];
    y[c] = s;
  }
}
}  // namespace

void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy) {
  const char* op = "scatter_run_rows";
  check_rows(op, R);
  check_rows(op, B);
  check_width(op, "w", w);
  check_width(op, "parts", parts);
  check_ld(op, "ldy", ldy, w);
  check_ptr(op, "Yr", Yr, R);
  check_ptr(op, "inv", inv, B);
  check_ptr(op, "first", first, R);
  check_ptr(op, "Y", Y, B);
  NCF_DISPATCH_CUDA(ctx, scatter_run_rows, ctx, Yr, R, parts, w, inv, first, B, Y, ldy);
  parallel_for(ctx.threads, B, row_grain(w), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t u = inv[b];
      NCF_CHECK(u >= 0 && u < R, op, ": inv[", b, "] = ", u, " is outside [0, ", R, ")");
      float* y = Y + b * ldy;
      if (first[u] != b)
        std::fill(y, y + w, 0.0f);
      else
        run_row(Yr, R, parts, w, u, y);
    }
  });
}

void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy) {
  const char* op = "put_run_rows";
  check_rows(op, R);
  check_rows(op, bound);
  check_width(op, "w", w);
  check_width(op, "parts", parts);
  check_ld(op, "ldy", ldy, w);
  check_ptr(op, "Yr", Yr, R);
  check_ptr(op, "first", first, R);
  check_ptr(op, "Y", Y, bound);
  NCF_DISPATCH_CUDA(ctx, put_run_rows, ctx, Yr, R, parts, w, ids, first, bound, Y, ldy);
  parallel_for(ctx.threads, R, row_grain(w), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      if (first[u] < 0) continue;
      const int64_t i = ids[first[u]];
      NCF_CHECK(i >= 0 && i < bound, op, ": ids[", first[u], "] = ", i, " is outside [0, ", bound,
                ")");
      run_row(Yr, R, parts, w, u, Y + i * ldy);
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

void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu) {
  check_linear_backward("linear_backward_bf16", X, weight, Y, dY, dweight, B, in, out, relu);
  NCF_DISPATCH_CUDA(ctx, linear_backward_bf16, ctx, X, weight, Y, dY, dX, dweight, db, B, in, out,
                    relu);
  linear_backward_cpu(ctx, X, weight, Y, dY, dX, dweight, db, B, in, out, relu,
                      GradMode::kOverwrite);
}

void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask) {
  check_group_sum("group_sum_backward_bf16", Y, dY, n, S, out, dYg, lddyg, relu, mask);
  NCF_DISPATCH_CUDA(ctx, group_sum_backward_bf16, ctx, Y, dY, n, S, out, dYg, lddyg, db, relu,
                    mask);
  group_sum_cpu(ctx, Y, dY, n, S, out, dYg, lddyg, db, relu, mask);
}

void head_forward(const ExecContext& ctx, const float* H, const float* w, const float* c,
                  float* logits, int64_t B, int F) {
  const char* op = "head_forward";
  check_rows(op, B);
  check_width(op, "F", F);
  check_ptr(op, "H", H, B);
  check_ptr(op, "w", w, B);
  check_ptr(op, "c", c, B);
  check_ptr(op, "logits", logits, B);
  NCF_DISPATCH_CUDA(ctx, head_forward, ctx, H, w, c, logits, B, F);
  // A dot product per row in a fixed order: no GEMV, whose blocking may vary.
  parallel_for(ctx.threads, B, row_grain(F), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* h = H + b * F;
      float s = 0.0f;
      for (int k = 0; k < F; ++k) s += h[k] * w[k];
      logits[b] = s + c[0];
    }
  });
}

void head_backward(const ExecContext& ctx, const float* H, const float* w, const float* dlogits,
                   float* dH, float* dw, float* dc, int64_t B, int F, GradMode mode) {
  const char* op = "head_backward";
  check_rows(op, B);
  check_width(op, "F", F);
  check_ptr(op, "H", H, B);
  check_ptr(op, "w", w, B);
  check_ptr(op, "dlogits", dlogits, B);
  check_ptr(op, "dH", dH, B);
  NCF_CHECK(dw != nullptr && dc != nullptr, op, ": dw or dc is null");
  NCF_DISPATCH_CUDA(ctx, head_backward, ctx, H, w, dlogits, dH, dw, dc, B, F, mode);
  parallel_for(ctx.threads, B, row_grain(F), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float g = dlogits[b];
      float* dh = dH + b * F;
      for (int k = 0; k < F; ++k) dh[k] = g * w[k];
    }
  });
  // dw and dc together as F + 1 fixed-block sums.
  std::vector<double> sums(static_cast<size_t>(F) + 1);
  block_sums(
      ctx.threads, B, F + 1,
      [&](int64_t b0, int64_t b1, double* acc) {
        for (int64_t b = b0; b < b1; ++b) {
          double g = dlogits[b];
          const float* h = H + b * F;
          for (int k = 0; k < F; ++k) acc[k] += g * h[k];
          acc[F] += g;
        }
      },
      sums.data());
  bool add = mode == GradMode::kAccumulate;
  for (int k = 0; k < F; ++k) dw[k] = (add ? dw[k] : 0.0f) + static_cast<float>(sums[k]);
  dc[0] = (add ? dc[0] : 0.0f) + static_cast<float>(sums[F]);
}

namespace {

void check_bce(const char* op, const float* logits, const float* labels, int64_t B, int64_t n_valid,
               int64_t global_batch) {
  check_rows(op, B);
  NCF_CHECK(n_valid >= 0 && n_valid <= B, op, ": n_valid=", n_valid, " outside [0, B=", B, "]");
  NCF_CHECK(global_batch > 0, op, ": global_batch=", global_batch, " must be positive");
  check_ptr(op, "logits", logits, B);
  check_ptr(op, "labels", labels, B);
}

// One row's loss: max(z, 0) − z·y + log(1 + exp(−|z|)), in double (no overflow).
inline double bce_row_loss(double z, double y) {
  return std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::fabs(z)));
}

// One row's gradient w·(sigmoid(z) − y)/global_batch, the sigmoid without
// overflow (exp of a non-positive number only). bce_with_logits_backward and
// neumf_top_backward share it, so they give the same bits.
inline float bce_row_grad(float z, float y, float wb, float inv_batch) {
  const float e = std::exp(-std::fabs(z));
  const float sig = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return wb * (sig - y) * inv_batch;
}

}  // namespace

void bce_with_logits_forward(const ExecContext& ctx, const float* logits, const float* labels,
                             const float* weights, double* loss, int64_t B, int64_t n_valid,
                             int64_t global_batch) {
  const char* op = "bce_with_logits_forward";
  check_bce(op, logits, labels, B, n_valid, global_batch);
  NCF_CHECK(loss != nullptr, op, ": loss is null");
  NCF_DISPATCH_CUDA(ctx, bce_with_logits_forward, ctx, logits, labels, weights, loss, B, n_valid,
                    global_batch);
  double sum = 0.0;
  block_sums(
      ctx.threads, n_valid, 1,
      [&](int64_t b0, int64_t b1, double* acc) {
        for (int64_t b = b0; b < b1; ++b) {
          double wb = weights ? weights[b] : 1.0;
          if (wb == 0.0) continue;  // a masked row may hold garbage logits
          acc[0] += wb * bce_row_loss(logits[b], labels[b]);
        }
      },
      &sum);
  *loss = sum / static_cast<double>(global_batch);
}

void bce_with_logits_backward(const ExecContext& ctx, const float* logits, const float* labels,
                              const float* weights, float* dlogits, int64_t B, int64_t n_valid,
                              int64_t global_batch) {
  const char* op = "bce_with_logits_backward";
  check_bce(op, logits, labels, B, n_valid, global_batch);
  check_ptr(op, "dlogits", dlogits, B);
  NCF_DISPATCH_CUDA(ctx, bce_with_logits_backward, ctx, logits, labels, weights, dlogits, B,
                    n_valid, global_batch);
  const float inv_batch = static_cast<float>(1.0 / static_cast<double>(global_batch));
  parallel_for(ctx.threads, B, 1 << 14, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float wb = b < n_valid ? (weights ? weights[b] : 1.0f) : 0.0f;
      if (wb == 0.0f) {
        dlogits[b] = 0.0f;
        continue;
      }
      dlogits[b] = bce_row_grad(logits[b], labels[b], wb, inv_batch);
    }
  });
}

namespace {

void check_top(const char* op, const float* urows, int64_t ldu, const float* irows, int64_t ldi,
               const void* A, const float* w, int64_t n, int S, int mf, int last) {
  check_rows(op, n);
  check_width(op, "S", S);
  NCF_CHECK(mf >= 1 && mf <= kNeumfTopMaxWidth && last >= 1 && last <= kNeumfTopMaxWidth, op,
            ": mf=", mf, " and last=", last, " must be in [1, ", kNeumfTopMaxWidth, "]");
  check_ld(op, "ldu", ldu, mf);
  check_ld(op, "ldi", ldi, mf);
  check_ptr(op, "urows", urows, n);
  check_ptr(op, "irows", irows, n);
  check_ptr(op, "A", A, n);
  check_ptr(op, "w", w, n);
}

}  // namespace

namespace {

#if defined(__SSE2__)
// Four consecutive elements as floats (BF16 bits widened exactly).
inline __m128 load4(const float* p) { return _mm_loadu_ps(p); }
inline __m128 load4(const uint16_t* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

// s + x0·w[0] + x1·w[1] + x2·w[2] + x3·w[3], added in that order, where x0..x3 are the
// columns of the 4×4 block whose rows r0..r3 are given (row i: sample i, lane i).
inline __m128 add_cols4(__m128 s, __m128 r0, __m128 r1, __m128 r2, __m128 r3, const float* w) {
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  s = _mm_add_ps(s, _mm_mul_ps(r0, _mm_set1_ps(w[0])));
  s = _mm_add_ps(s, _mm_mul_ps(r1, _mm_set1_ps(w[1])));
  s = _mm_add_ps(s, _mm_mul_ps(r2, _mm_set1_ps(w[2])));
  return _mm_add_ps(s, _mm_mul_ps(r3, _mm_set1_ps(w[3])));
}

// The logits of four samples, one per lane: top_forward_cpu's scalar sum of each,
// the same products added in the same column order (the same bits), the four
// chains side by side instead of one add waiting on the last. Four columns of the
// four rows are loaded as rows and transposed.
template <typename TA>
__m128 top_logits4(const float* const u[4], const float* const it[4], const TA* const a[4],
                   const float* w, int mf, int last) {
  __m128 s = _mm_setzero_ps();
  int k = 0;
  auto gmf = [&](int r, int j) {
    return _mm_mul_ps(_mm_loadu_ps(u[r] + j), _mm_loadu_ps(it[r] + j));
  };
  for (; k + 4 <= mf; k += 4) s = add_cols4(s, gmf(0, k), gmf(1, k), gmf(2, k), gmf(3, k), w + k);
  for (; k < mf; ++k) {
    const __m128 g =
        _mm_setr_ps(u[0][k] * it[0][k], u[1][k] * it[1][k], u[2][k] * it[2][k], u[3][k] * it[3][k]);
    s = _mm_add_ps(s, _mm_mul_ps(g, _mm_set1_ps(w[k])));
  }
  const float* wa = w + mf;
  k = 0;
  for (; k + 4 <= last; k += 4)
    s = add_cols4(s, load4(a[0] + k), load4(a[1] + k), load4(a[2] + k), load4(a[3] + k), wa + k);
  for (; k < last; ++k) {
    const __m128 x = _mm_setr_ps(ld(a[0][k]), ld(a[1][k]), ld(a[2][k]), ld(a[3][k]));
    s = _mm_add_ps(s, _mm_mul_ps(x, _mm_set1_ps(wa[k])));
  }
  return s;
}
#endif

template <typename TA>
void top_forward_cpu(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                     int64_t ldi, const TA* A, const float* w, const float* c, float* logits,
                     int64_t n, int S, int mf, int last, const int32_t* irow_ids) {
  // head_forward's dot product over [u ⊙ i ; A] in column order, the GMF
  // products rounded to float as gmf_forward stores them.
  auto urow = [&](int64_t b) { return urows + (b / S) * ldu; };
  auto irow = [&](int64_t b) { return irows + (irow_ids ? int64_t{irow_ids[b]} : b) * ldi; };
  parallel_for_wide(ctx.threads, n * S, row_grain(mf + last), [&](int64_t b0, int64_t b1) {
    int64_t b = b0;
#if defined(__SSE2__)
    for (; b + 4 <= b1; b += 4) {
      // The item rows two rounds ahead: by id (evaluation) they are random rows of the
      // table, else rows of a stride the hardware prefetch follows poorly.
      for (int64_t q = b + 8; q < std::min(b1, b + 12); ++q) prefetch_row(irow(q), mf);
      // The user row of the first of those samples (a group's S samples share it).
      if (b + 8 < b1) prefetch_row(urow(b + 8), mf);
      const float* const u[4] = {urow(b), urow(b + 1), urow(b + 2), urow(b + 3)};
      const float* const it[4] = {irow(b), irow(b + 1), irow(b + 2), irow(b + 3)};
      const TA* const a[4] = {A + b * last, A + (b + 1) * last, A + (b + 2) * last,
                              A + (b + 3) * last};
      _mm_storeu_ps(logits + b, _mm_add_ps(top_logits4(u, it, a, w, mf, last), _mm_set1_ps(c[0])));
    }
#endif
    for (; b < b1; ++b) {
      const float* u = urow(b);
      const float* it = irow(b);
      const TA* a = A + b * last;
      float s = 0.0f;
      for (int k = 0; k < mf; ++k) {
        const float g = u[k] * it[k];
        s += g * w[k];
      }
      for (int k = 0; k < last; ++k) s += ld(a[k]) * w[mf + k];
      logits[b] = s + c[0];
    }
  });
}

template <typename TA>
void top_backward_cpu(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                      int64_t ldi, const TA* A, const float* w, const float* dlogits,
                      const float* logits, const float* labels, int64_t global_batch, double* loss,
                      TA* dA, float* durows, int64_t lddu, float* dirows, int64_t lddi, float* dw,
                      float* dc, float* db, int64_t n, int S, int mf, int last, bool relu) {
  const bool from_labels = loss != nullptr;
  const int64_t B = n * S;
  const int F = mf + last;
  const float inv_batch =
      from_labels ? static_cast<float>(1.0 / static_cast<double>(global_batch)) : 0.0f;
  auto grad_of = [&](int64_t b) {
    return from_labels ? bce_row_grad(logits[b], labels[b], 1.0f, inv_batch) : dlogits[b];
  };
  // Sample b's dA row (masked; in BF16 the FP32 row rounded as one vector).
  auto da_row = [&](float gb, const TA* a, TA* da) {
    if constexpr (std::is_same<TA, float>::value) {
      for (int k = 0; k < last; ++k) {
        const float dh = gb * w[mf + k];
        da[k] = relu ? (a[k] > 0.0f ? dh : 0.0f) : dh;
      }
    } else {
      float row[kNeumfTopMaxWidth];
      for (int k = 0; k < last; ++k) {
        const float dh = gb * w[mf + k];
        row[k] = relu ? (bf16_positive(a[k]) ? dh : 0.0f) : dh;
      }
      round_to_bf16_bits(row, da, last);
    }
  };
  // Sample b's terms of the sums in the unfused ops' order: dw and dc (head_backward),
  // the bias gradient (linear_backward) and the loss (bce_with_logits_forward).
  const int K = F + 1 + last + 1;
  auto add_terms = [&](int64_t b, float g, const TA* da, double* acc) {
    const double gb = g;
    const float* u = urows + (b / S) * ldu;
    const float* it = irows + b * ldi;
    const TA* a = A + b * last;
    for (int k = 0; k < mf; ++k) {
      const float h = u[k] * it[k];
      acc[k] += gb * h;
    }
    for (int k = 0; k < last; ++k) acc[mf + k] += gb * ld(a[k]);
    acc[F] += gb;
    for (int k = 0; k < last; ++k) acc[F + 1 + k] += ld(da[k]);
    if (from_labels) acc[K - 1] += bce_row_loss(logits[b], labels[b]);
  };
  // One pass over block_sums' blocks of samples, each row read once while in cache:
  // every group that starts in the block gets its logits' gradients, dA, the items'
  // GMF gradients and the user's (summed over its samples in double in s order), its
  // samples past the block's end included; every sample of the block adds its terms,
  // in sample order. A group begun in an earlier block has its first samples there:
  // their terms are added here from the same values computed again (another thread
  // may still be writing them).
  std::vector<double> sums(static_cast<size_t>(K));
  block_sums_wide(
      ctx.threads, B, K,
      [&](int64_t b0, int64_t b1, double* acc) {
        double uacc[kNeumfTopMaxWidth];
        TA da_again[kNeumfTopMaxWidth];
        const int64_t p0 = (b0 + S - 1) / S;  // the first group starting at or after b0
        for (int64_t b = b0; b < std::min(b1, p0 * S); ++b) {
          const float gb = grad_of(b);
          da_row(gb, A + b * last, da_again);
          add_terms(b, gb, da_again, acc);
        }
        for (int64_t p = p0; p < n && p * S < b1; ++p) {
          // The user's and the items' rows and their gradient rows two groups ahead:
          // rows of a stride (the lookup's row width) the hardware prefetch follows poorly.
          if (p + 2 < n) {
            prefetch_row(urows + (p + 2) * ldu, mf);
            prefetch_row(durows + (p + 2) * lddu, mf);
          }
          for (int64_t q = (p + 2) * S; q < std::min(B, (p + 3) * S); ++q) {
            prefetch_row(irows + q * ldi, mf);
            prefetch_row(dirows + q * lddi, mf);
          }
          const float* u = urows + p * ldu;
          std::fill(uacc, uacc + mf, 0.0);
          for (int s = 0; s < S; ++s) {
            const int64_t b = p * S + s;
            const float gb = grad_of(b);
            const float* it = irows + b * ldi;
            float* di = dirows + b * lddi;
            for (int k = 0; k < mf; ++k) {
              const float dgk = gb * w[k];
              di[k] = dgk * u[k];
              uacc[k] += static_cast<double>(dgk * it[k]);
            }
            TA* da = dA + b * last;
            da_row(gb, A + b * last, da);
            if (b < b1) add_terms(b, gb, da, acc);
          }
          for (int k = 0; k < mf; ++k) durows[p * lddu + k] = static_cast<float>(uacc[k]);
        }
      },
      sums.data());
  for (int k = 0; k < F; ++k) dw[k] = 0.0f + static_cast<float>(sums[size_t(k)]);
  dc[0] = 0.0f + static_cast<float>(sums[size_t(F)]);
  if (db)
    for (int k = 0; k < last; ++k) db[k] = static_cast<float>(sums[size_t(F + 1 + k)]);
  if (from_labels) *loss = sums[size_t(K - 1)] / static_cast<double>(global_batch);
}

// The argument checks of neumf_top_backward (either storage).
void check_top_backward(const char* op, const float* urows, int64_t ldu, const float* irows,
                        int64_t ldi, const void* A, const float* w, const float* dlogits,
                        const float* logits, const float* labels, int64_t global_batch,
                        double* loss, const void* dA, float* durows, int64_t lddu, float* dirows,
                        int64_t lddi, float* dw, float* dc, int64_t n, int S, int mf, int last) {
  check_top(op, urows, ldu, irows, ldi, A, w, n, S, mf, last);
  const bool from_labels = loss != nullptr;  // else from dlogits
  if (from_labels) {
    NCF_CHECK(!dlogits, op, ": dlogits given together with a loss");
    NCF_CHECK(global_batch > 0, op, ": global_batch=", global_batch, " must be positive");
    check_ptr(op, "logits", logits, n);
    check_ptr(op, "labels", labels, n);
  } else {
    check_ptr(op, "dlogits (no loss given)", dlogits, n);
  }
  check_ld(op, "lddu", lddu, mf);
  check_ld(op, "lddi", lddi, mf);
  check_ptr(op, "dA", dA, n);
  check_ptr(op, "durows", durows, n);
  check_ptr(op, "dirows", dirows, n);
  NCF_CHECK(dw != nullptr && dc != nullptr, op, ": dw or dc is null");
}

}  // namespace

void neumf_top_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                       int64_t ldi, const float* A, const float* w, const float* c, float* logits,
                       int64_t n, int S, int mf, int last, const int32_t* irow_ids) {
  const char* op = "neumf_top_forward";
  check_top(op, urows, ldu, irows, ldi, A, w, n, S, mf, last);
  check_ptr(op, "c", c, n);
  check_ptr(op, "logits", logits, n);
  NCF_DISPATCH_CUDA(ctx, neumf_top_forward, ctx, urows, ldu, irows, ldi, A, w, c, logits, n, S, mf,
                    last, irow_ids);
  top_forward_cpu(ctx, urows, ldu, irows, ldi, A, w, c, logits, n, S, mf, last, irow_ids);
}

void neumf_top_forward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                            const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                            const float* c, float* logits, int64_t n, int S, int mf, int last,
                            const int32_t* irow_ids) {
  const char* op = "neumf_top_forward_bf16";
  check_top(op, urows, ldu, irows, ldi, A, w, n, S, mf, last);
  check_ptr(op, "c", c, n);
  check_ptr(op, "logits", logits, n);
  NCF_DISPATCH_CUDA(ctx, neumf_top_forward_bf16, ctx, urows, ldu, irows, ldi, A, w, c, logits, n, S,
                    mf, last, irow_ids);
  top_forward_cpu(ctx, urows, ldu, irows, ldi, A, w, c, logits, n, S, mf, last, irow_ids);
}

bool score_items_fusable(const ExecContext& ctx, int w0, const ScoreLayerBf16* layers, int L,
                         int mf) {
  if (layers == nullptr || L < 1 || L > kScoreMaxLayers || w0 < 16 || w0 % 16 != 0) return false;
  int in = w0;
  for (int l = 0; l < L; ++l) {
    const ScoreLayerBf16& v = layers[l];
    if (v.w == nullptr || v.in != in || v.out < 16 || v.out % 16 != 0) return false;
    in = v.out;
  }
  if (mf < 1 || mf > kNeumfTopMaxWidth || in > kNeumfTopMaxWidth) return false;
  if (ctx.device != Device::kCuda) return true;
#if defined(NCF_WITH_CUDA) && defined(NCF_CUDA_KERNELS)
  return cuda::score_items_smem_bytes(ctx, w0, layers, L) > 0;
#else
  return false;
#endif
}

void neumf_score_items_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                            const float* U0, const float* b0, int w0, const ScoreLayerBf16* layers,
                            int L, const float* urows, int64_t ldu, const float* irows, int64_t ldi,
                            const float* w, const float* c, float* logits, int64_t n, int S,
                            int mf) {
  const char* op = "neumf_score_items_bf16";
  NCF_CHECK(score_items_fusable(ctx, w0, layers, L, mf), op, ": widths w0=", w0, ", ", L,
            " layers above layer 0, mf=", mf, " do not fit one kernel (score_items_fusable)");
  NCF_CHECK(n >= 0 && S >= 1 && n * S <= INT_MAX, op, ": n=", n, " groups of S=", S);
  const int last = layers[L - 1].out;
  // (the activations are the op's own: P stands in for the checks' output and A)
  check_gather_bias_act(op, P, R, ids, U0, P, n, S, w0);
  check_top(op, urows, ldu, irows, ldi, P, w, n, S, mf, last);
  check_ptr(op, "c", c, n);
  check_ptr(op, "logits", logits, n);
  NCF_DISPATCH_CUDA(ctx, neumf_score_items_bf16, ctx, P, ids, U0, b0, w0, layers, L, urows, ldu,
                    irows, ldi, w, c, logits, n, S, mf);
  // The sequence of ops it fuses, on BF16 tiles of the whole batch.
  const size_t B = static_cast<size_t>(n * S);
  std::vector<uint16_t> x(B * static_cast<size_t>(w0)), y;
  gather_bias_act_bf16(ctx, P, R, ids, U0, b0, x.data(), n, S, w0, true);
  for (int l = 0; l < L; ++l) {
    y.assign(B * static_cast<size_t>(layers[l].out), 0);
    linear_forward_bf16(ctx, x.data(), layers[l].w, layers[l].b, y.data(), int64_t(B), layers[l].in,
                        layers[l].out, true);
    x.swap(y);
  }
  neumf_top_forward_bf16(ctx, urows, ldu, irows, ldi, x.data(), w, c, logits, n, S, mf, last, ids);
}

void neumf_top_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                        int64_t ldi, const float* A, const float* w, const float* dlogits,
                        const float* logits, const float* labels, int64_t global_batch,
                        double* loss, float* dA, float* durows, int64_t lddu, float* dirows,
                        int64_t lddi, float* dw, float* dc, float* db, int64_t n, int S, int mf,
                        int last, bool relu) {
  check_top_backward("neumf_top_backward", urows, ldu, irows, ldi, A, w, dlogits, logits, labels,
                     global_batch, loss, dA, durows, lddu, dirows, lddi, dw, dc, n, S, mf, last);
  NCF_DISPATCH_CUDA(ctx, neumf_top_backward, ctx, urows, ldu, irows, ldi, A, w, dlogits, logits,
                    labels, global_batch, loss, dA, durows, lddu, dirows, lddi, dw, dc, db, n, S,
                    mf, last, relu);
  top_backward_cpu(ctx, urows, ldu, irows, ldi, A, w, dlogits, logits, labels, global_batch, loss,
                   dA, durows, lddu, dirows, lddi, dw, dc, db, n, S, mf, last, relu);
}

void neumf_top_backward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                             const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                             const float* dlogits, const float* logits, const float* labels,
                             int64_t global_batch, double* loss, uint16_t* dA, float* durows,
                             int64_t lddu, float* dirows, int64_t lddi, float* dw, float* dc,
                             float* db, int64_t n, int S, int mf, int last, bool relu) {
  check_top_backward("neumf_top_backward_bf16", urows, ldu, irows, ldi, A, w, dlogits, logits,
                     labels, global_batch, loss, dA, durows, lddu, dirows, lddi, dw, dc, n, S, mf,
                     last);
  NCF_DISPATCH_CUDA(ctx, neumf_top_backward_bf16, ctx, urows, ldu, irows, ldi, A, w, dlogits,
                    logits, labels, global_batch, loss, dA, durows, lddu, dirows, lddi, dw, dc, db,
                    n, S, mf, last, relu);
  top_backward_cpu(ctx, urows, ldu, irows, ldi, A, w, dlogits, logits, labels, global_batch, loss,
                   dA, durows, lddu, dirows, lddi, dw, dc, db, n, S, mf, last, relu);
}

}  // namespace ncf
