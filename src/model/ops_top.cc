// CPU side of ops_top.h: argument checks, the dispatch to the CUDA twins, and the CPU
// kernels (row loops; the fused top four rows at a time with SSE where there is SSE2).
#include "model/ops_top.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/prefetch.h"
#include "common/vector_isa.h"
#include "model/ops_gemm.h"
#include "model/ops_groups.h"
#include "model/ops_internal.h"

namespace ncf {

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
