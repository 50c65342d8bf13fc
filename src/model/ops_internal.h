// What the CPU halves of the dense ops (ops_*.cc, model/ops.h's families) share:
// element access on FP32 and BF16 arrays, the ReLU bit mask, the argument checks and
// the fixed GEMM blocks. Include from those .cc files only.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/bf16.h"
#include "common/check.h"
#include "model/cpu_matmul.h"
#include "model/ops.h"

namespace ncf {
namespace {  // one private copy per .cc file, as cuda_util.cuh's kernels per .cu file

// bf16_bits_to_float(y) > 0 on the bits (positive, non-zero, not NaN: 0x0001 ..
// 0x7F80), which the compiler vectorises.
inline bool bf16_positive(uint16_t y) { return static_cast<uint16_t>(y - 1u) < 0x7F80u; }

// An element of an FP32 or BF16 array as a float (BF16 bits widen exactly), and
// whether it passes the ReLU mask (> 0; NaN does not).
inline float ld(float x) { return x; }
inline float ld(uint16_t x) { return bf16_bits_to_float(x); }
inline bool positive(float y) { return y > 0.0f; }
inline bool positive(uint16_t y) { return bf16_positive(y); }

// x[j] = 0 for j < w where the ReLU bit mask m (relu_mask_words' layout: bit j % 32
// of word j / 32) has a 0. A whole word's 32 elements are one loop over the bit
// table, which the compiler vectorises; a shift by j % 32 per element (a variable
// shift in every lane) stays scalar below AVX2.
constexpr uint32_t kBitOf[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};
template <typename T>
inline void apply_relu_mask(const uint32_t* m, T* x, int w) {
  for (int j0 = 0; j0 < w; j0 += 32) {
    const uint32_t word = m[j0 / 32];
    T* xw = x + j0;
    if (w - j0 >= 32) {
      for (int b = 0; b < 32; ++b) xw[b] = word & kBitOf[b] ? xw[b] : T{0};
    } else {
      for (int b = 0; b < w - j0; ++b) xw[b] = word & kBitOf[b] ? xw[b] : T{0};
    }
  }
}

// The fixed GEMM blocks of cpu_gemm: output rows per block when M is large;
// for a small output with a long K (the weight gradients, K = B), tiles of
// kGemmDepth rows of K by up to kGemmTileCols output columns, each a partial
// product; otherwise output columns per block.
constexpr int64_t kGemmRows = 1024;
constexpr int64_t kGemmCols = 64;
constexpr int64_t kGemmDepth = 8192;
constexpr int64_t kGemmTileCols = 256;

// Rows per chunk so that each chunk touches at least ~16K floats: below that a
// thread hand-off costs more than the work.
inline int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

inline void check_rows(const char* op, int64_t B) {
  NCF_CHECK(B >= 0, op, ": negative row count B=", B);
}

inline void check_width(const char* op, const char* name, int64_t w) {
  NCF_CHECK(w > 0 && w <= INT_MAX, op, ": width ", name, "=", w, " must be in [1, INT_MAX]");
}

inline void check_ptr(const char* op, const char* name, const void* p, int64_t B) {
  NCF_CHECK(B == 0 || p != nullptr, op, ": ", name, " is null with B=", B);
}

inline void check_ld(const char* op, const char* name, int64_t ld, int64_t width) {
  NCF_CHECK(ld >= width, op, ": stride ", name, "=", ld, " is smaller than the row width ", width);
}

// The precision of cpu_matmul under the current math mode.
inline MatmulPrecision matmul_precision() {
  return math_mode() == MathMode::kBf16 ? MatmulPrecision::kBf16 : MatmulPrecision::kFp32;
}

inline MatmulShape matmul_shape(int M, int N, int K, bool trans_a, bool trans_b, int lda, int ldb,
                                int ldc) {
  MatmulShape s;
  s.M = M;
  s.N = N;
  s.K = K;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.lda = lda;
  s.ldb = ldb;
  s.ldc = ldc;
  return s;
}

inline void check_ids_cpu(const char* op, const int32_t* ids, int64_t B, int64_t R) {
  for (int64_t b = 0; b < B; ++b)
    NCF_CHECK(ids[b] >= 0 && ids[b] < R, op, ": ids[", b, "] = ", ids[b], " is outside [0, ", R,
              ")");
}

// The argument checks of gather_bias_act (either storage) and of every id.
inline void check_gather_bias_act(const char* op, const float* P, int64_t R, const int32_t* ids,
                                  const float* Yg, const void* Y, int64_t n, int S, int out) {
  check_rows(op, n);
  check_rows(op, R);
  check_width(op, "S", S);
  check_width(op, "out", out);
  check_ptr(op, "P", P, n);
  check_ptr(op, "ids", ids, n);
  check_ptr(op, "Yg", Yg, n);
  check_ptr(op, "Y", Y, n);
}

}  // namespace
}  // namespace ncf
