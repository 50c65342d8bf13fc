// Element-wise dense ops and BF16 conversions (model/ops.h): fill, FP32 rows to BF16
// storage, and the hi / lo splits of an FP32 array for BF16 and TF32 products. The CPU
// code is in ops_elementwise.cc, the CUDA twins (same names and arguments) in
// ops_elementwise.cu.
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

// x[0..n) = value.
void fill(const ExecContext& ctx, float* x, int64_t n, float value);

// Y[b, :w] (row stride ldy) = X[b, :w] (row stride ldx) rounded to BF16, b < B.
void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B);

// X [n] FP32 as two BF16 parts: hi[i] = bf16(X[i]), lo[i] = bf16(X[i] − hi[i]) (the difference
// is exact in FP32), so hi + lo keeps about 16 significant bits where one BF16 keeps 8: a BF16
// product over [hi ; lo] rows against the same rows twice takes X to that precision.
void split_bf16(const ExecContext& ctx, const float* X, int64_t n, uint16_t* hi, uint16_t* lo);
// The same for a TF32 product: hi[i] = X[i] rounded to TF32's 10 mantissa bits (nearest,
// ties to even; NaN, infinities and a value that would round past FLT_MAX kept or
// truncated), lo[i] = X[i] − hi[i], exact in FP32, so that hi + lo = X and a TF32 product
// over [hi ; lo] sees X to about 21 bits.
void split_tf32(const ExecContext& ctx, const float* X, int64_t n, float* hi, float* lo);

#ifdef NCF_WITH_CUDA
// The CUDA twins (ops_elementwise.cu); called through the dispatch in ops_elementwise.cc only.
namespace cuda {
void fill(const ExecContext& ctx, float* x, int64_t n, float value);
void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B);
void split_bf16(const ExecContext& ctx, const float* X, int64_t n, uint16_t* hi, uint16_t* lo);
void split_tf32(const ExecContext& ctx, const float* X, int64_t n, float* hi, float* lo);
}  // namespace cuda
#endif

}  // namespace ncf
