// The scalar update rules every optimizer applies, dense tower and embedding
// tables alike: the hyperparameters, the per-step Adam scalars, and one inline
// NCF_HD function per rule, so the CPU loops and the CUDA kernels of model/ and
// embedding/ apply literally the same formula.
//
// L2 regularisation: every rule first sets g <- g + l2*p (the gradient of
// (l2/2)*|p|^2). Flags --l2_dense / --l2_embedding set the l2 of the dense and
// the table optimizer.
#pragma once

#include <math.h>

#include <cstdint>

#include "common/philox.h"  // NCF_HD

namespace ncf {

enum class VectorIsa;  // common/vector_isa.h (CPU only; kept out of the CUDA files)

// Adam with the TF / Keras epsilon placement ("epsilon hat" of Kingma & Ba):
//   lr_t = lr · sqrt(1 − β2^t) / (1 − β1^t)
//   m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²;  p ← p − lr_t · m / (sqrt(v) + eps)
// PyTorch adds its eps to sqrt(v)/sqrt(1 − β2^t) instead; the two agree when
// eps_torch = eps / sqrt(1 − β2^t). TF Model Garden's tuned eps (1.45e-7) is
// meant for this placement.
struct AdamHyper {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float l2 = 0.0f;
};

// Adagrad as Keras: acc ← acc + g²; p ← p − lr · g / (sqrt(acc) + eps). The
// accumulator starts at initial_accumulator (EmbeddingCollection fills it).
struct AdagradHyper {
  float lr = 0.01f;
  float initial_accumulator = 0.1f;
  float eps = 1e-7f;
  float l2 = 0.0f;
};

// Plain SGD: p ← p − lr·g.
struct SgdHyper {
  float lr = 0.01f;
  float l2 = 0.0f;
};

// The per-step Adam scalars, computed once on the host in double.
struct AdamStepScalars {
  float lr_t, beta1, beta2, eps, l2;
};
// t >= 1 (the number of updates including this one).
AdamStepScalars adam_step_scalars(const AdamHyper& h, int64_t t);

NCF_HD void adam_update(float* p, float* m, float* v, float g, const AdamStepScalars& s) {
  g += s.l2 * *p;
  *m = s.beta1 * *m + (1.0f - s.beta1) * g;
  *v = s.beta2 * *v + (1.0f - s.beta2) * g * g;
  *p -= s.lr_t * *m / (sqrtf(*v) + s.eps);
}

// CPU: adam_update(&p[i], &m[i], &v[i], g ? g[i] : 0.0f, s) for i in [0, n), the loop
// compiled for vector_isa()'s path (common/vector_isa.h): 16 lanes with AVX-512, 8 with AVX2,
// 4 on the baseline. Every path gives the scalar rule's bits: each vector instruction is one
// of its correctly rounded IEEE operations, on the same operands in the same order, none
// fused.
void adam_update_n(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamStepScalars& s);
// The same on a chosen path (a wider one than the CPU has runs the CPU's best); returns the
// path that ran. For tests: every path against the scalar rule.
VectorIsa adam_update_n_on(VectorIsa isa, float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamStepScalars& s);

NCF_HD void adagrad_update(float* p, float* acc, float g, const AdagradHyper& h) {
  g += h.l2 * *p;
  *acc += g * g;
  *p -= h.lr * g / (sqrtf(*acc) + h.eps);
}

// Row-wise Adagrad (FBGEMM's exact row-wise Adagrad), AdagradHyper's
// hyperparameters and one accumulator per row instead of per element: with
// g_d ← g_d + l2·p_d for every column d of the row,
//   acc ← acc + (Σ_d g_d²) / D;  p_d ← p_d − lr · g_d / (sqrt(acc) + eps).
// The squares are summed over d = 0 … D−1 in that order, in FP32, on both
// devices. This takes the sum and returns the row's multiplier lr / (sqrt(acc) + eps).
NCF_HD float rowwise_adagrad_multiplier(float* acc, float sum_sq, int D, const AdagradHyper& h) {
  *acc += sum_sq / float(D);
  return h.lr / (sqrtf(*acc) + h.eps);
}

NCF_HD void sgd_update(float* p, float g, const SgdHyper& h) {
  g += h.l2 * *p;
  *p -= h.lr * g;
}

}  // namespace ncf
