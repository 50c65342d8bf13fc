// CPU side of ops_gemm.h: argument checks, the dispatch to the CUDA twins, and the
// GEMMs on cpu_matmul (oneDNN) over fixed blocks, with BF16 operands in MathMode::kBf16.
#include "model/ops_gemm.h"

#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/vector_isa.h"
#include "model/cpu_matmul.h"
#include "model/ops_groups.h"
#include "model/ops_internal.h"

namespace ncf {

namespace {

// cpu_gemm_t's split of K into kGemmDepth slices (tiles of kGemmTileCols columns), each
// slice's partial product into its own buffer, summed per element in slice order in
// double; `product`, `store` and `old` are cpu_gemm_t's.
template <typename T, typename TC, typename Product, typename Store, typename Old>
void gemm_k_slices(int threads, bool trans_a, bool trans_b, int M, int N, int K, const T* A,
                   int lda, const T* B, int ldb, float beta, TC* C, int ldc, Product&& product,
                   Store&& store, Old&& old) {
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
}

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
// gradients in either precision (bench/compare_commits.sh, the
// gemm_tiles record).
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
    gemm_k_slices(threads, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, product, store,
                  old);
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
                         GradMode mode) {
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
                     bool relu, GradMode mode) {
  check_linear_backward("linear_backward", X, weight, Y, dY, dweight, B, in, out, relu);
  NCF_DISPATCH_CUDA(ctx, linear_backward, ctx, X, weight, Y, dY, dX, dweight, db, B, in, out, relu,
                    mode);
  linear_backward_cpu(ctx, X, weight, Y, dY, dX, dweight, db, B, in, out, relu, mode);
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

void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu) {
  check_linear_backward("linear_backward_bf16", X, weight, Y, dY, dweight, B, in, out, relu);
  NCF_DISPATCH_CUDA(ctx, linear_backward_bf16, ctx, X, weight, Y, dY, dX, dweight, db, B, in, out,
                    relu);
  linear_backward_cpu(ctx, X, weight, Y, dY, dX, dweight, db, B, in, out, relu,
                      GradMode::kOverwrite);
}

}  // namespace ncf
