// The device side of common/update_rules.h: one functor per rule that applies
// it to element i of a parameter array and its state (apply), or to elements
// i..i+3 as float4s (apply4, i a multiple of 4). Include from .cu files only;
// the dense kernels of model/optim.cu and the table kernels of
// embedding/table_ops.cu share them.
#pragma once

#include "common/cuda_util.cuh"
#include "common/update_rules.h"

namespace ncf::cuda {

__device__ __forceinline__ float4& at4(float* base, int64_t i) {
  return *reinterpret_cast<float4*>(base + i);
}

struct AdamRule {
  float* p;
  float* m;
  float* v;
  AdamStepScalars s;
  __device__ void apply(int64_t i, float g) const { adam_update(p + i, m + i, v + i, g, s); }
  __device__ void apply4(int64_t i, float4 g) const {
    float4 P = at4(p, i), M = at4(m, i), V = at4(v, i);
    adam_update(&P.x, &M.x, &V.x, g.x, s);
    adam_update(&P.y, &M.y, &V.y, g.y, s);
    adam_update(&P.z, &M.z, &V.z, g.z, s);
    adam_update(&P.w, &M.w, &V.w, g.w, s);
    at4(p, i) = P;
    at4(m, i) = M;
    at4(v, i) = V;
  }
  bool aligned() const { return aligned16(p) && aligned16(m) && aligned16(v); }
};

struct AdagradRule {
  float* p;
  float* acc;
  AdagradHyper h;
  __device__ void apply(int64_t i, float g) const { adagrad_update(p + i, acc + i, g, h); }
  __device__ void apply4(int64_t i, float4 g) const {
    float4 P = at4(p, i), A = at4(acc, i);
    adagrad_update(&P.x, &A.x, g.x, h);
    adagrad_update(&P.y, &A.y, g.y, h);
    adagrad_update(&P.z, &A.z, g.z, h);
    adagrad_update(&P.w, &A.w, g.w, h);
    at4(p, i) = P;
    at4(acc, i) = A;
  }
  bool aligned() const { return aligned16(p) && aligned16(acc); }
};

struct SgdRule {
  float* p;
  SgdHyper h;
  __device__ void apply(int64_t i, float g) const { sgd_update(p + i, g, h); }
  __device__ void apply4(int64_t i, float4 g) const {
    float4 P = at4(p, i);
    sgd_update(&P.x, g.x, h);
    sgd_update(&P.y, g.y, h);
    sgd_update(&P.z, g.z, h);
    sgd_update(&P.w, g.w, h);
    at4(p, i) = P;
  }
  bool aligned() const { return aligned16(p); }
};

}  // namespace ncf::cuda
