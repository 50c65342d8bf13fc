// What the CUDA halves of the dense ops (ops_*.cu, model/ops.h's families) share: the
// GEMM input type, the host functions one of them defines for the others, and device
// helpers (row arithmetic, vector lanes, BF16 element values, a gradient store).
// Include from those .cu files only.
#pragma once

#include <cstdint>

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "model/ops.h"

namespace ncf::cuda {

// One GEMM input as cuBLAS takes it: the array and its element type (an FP32
// array of the caller, or the BF16 copy of one in the scratch arena).
struct GemmInput {
  const void* data;
  cudaDataType_t type;
};

// Defined in the ops' .cu files and called from more than one of them (their comments
// are at the definitions).
void launch_to_bf16(cudaStream_t stream, const float* src, int64_t lds, int64_t rows, int64_t cols,
                    uint16_t* dst, int64_t ldd);
void gemm_typed(const ExecContext& ctx, MathMode mode, bool trans_a, bool trans_b, int M, int N,
                int K, float alpha, GemmInput A, int lda, GemmInput B, int ldb, float beta, void* C,
                int ldc, const char* op, cudaDataType_t c_type = CUDA_R_32F);
void gemm_on(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc,
             const char* op);
void launch_bias_act_bf16(cudaStream_t stream, const float* Z, const float* Yg, int S,
                          const float* bias, uint16_t* Y, int64_t B, int out, bool relu,
                          const int32_t* ids = nullptr, uint32_t* mask = nullptr);

namespace {  // device helpers: one private copy per .cu file, as cuda_util.cuh's kernels

// The row of item q of rows of per_row items: in 32 bits when the items fit (k32).
template <bool k32>
__device__ __forceinline__ int64_t row_of(int64_t q, int per_row) {
  if (k32) return static_cast<uint32_t>(q) / static_cast<uint32_t>(per_row);
  return q / per_row;
}

struct GradStore {  // out[c] = (add ? out[c] : 0) + total
  float* out;
  bool add;
  __device__ void operator()(int c, double total) const {
    const float v = static_cast<float>(total);
    out[c] = add ? out[c] + v : v;
  }
};

// L consecutive floats of a row: one float4 (L = 4, 16-byte aligned) or one float.
template <int L>
struct Lanes {
  float v[L];
};
template <int L>
__device__ __forceinline__ Lanes<L> load_lanes(const float* __restrict__ p) {
  Lanes<L> r;
  if constexpr (L == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    r.v[0] = t.x, r.v[1] = t.y, r.v[2] = t.z, r.v[3] = t.w;
  } else {
    r.v[0] = *p;
  }
  return r;
}
template <int L>
__device__ __forceinline__ void store_lanes(float* __restrict__ p, const Lanes<L>& r) {
  if constexpr (L == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
    *p = r.v[0];
  }
}
// store_lanes, evict-first (an output far larger than L2, not read again in the kernel).
template <int L>
__device__ __forceinline__ void store_lanes_cs(float* __restrict__ p, const Lanes<L>& r) {
  if constexpr (L == 4) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(r.v[0], r.v[1], r.v[2], r.v[3]));
  } else {
    __stcs(p, r.v[0]);
  }
}

__device__ __forceinline__ float element_value(float x) { return x; }
__device__ __forceinline__ float element_value(uint16_t x) { return bf16_bits_to_float(x); }
// Column l of a word: the element itself, or BF16 l of a pair.
template <typename T>
__device__ __forceinline__ float lane_value(T w, int) {
  return element_value(w);
}
__device__ __forceinline__ float lane_value(uint32_t w, int l) {
  return bf16_bits_to_float(static_cast<uint16_t>(l ? w >> 16 : w));
}
// g where y > 0, else 0 (NaN → 0), per column of the word.
template <typename T>
__device__ __forceinline__ T relu_masked(T y, T g) {
  return element_value(y) > 0.0f ? g : T{0};
}
__device__ __forceinline__ uint32_t relu_masked(uint32_t y, uint32_t g) {
  const uint32_t lo = lane_value(y, 0) > 0.0f ? g & 0xffffu : 0u;
  const uint32_t hi = lane_value(y, 1) > 0.0f ? g >> 16 : 0u;
  return lo | (hi << 16);
}

__device__ __forceinline__ uint4 mask_bf16_octet(const uint4& y, const uint4& g) {
  return make_uint4(relu_masked(y.x, g.x), relu_masked(y.y, g.y), relu_masked(y.z, g.z),
                    relu_masked(y.w, g.w));
}

}  // namespace
}  // namespace ncf::cuda
