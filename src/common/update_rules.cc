// The per-step Adam scalars of update_rules.h, computed on the host in double, and the
// CPU's Adam over n elements on each vector path.
#include "common/update_rules.h"

#include <cmath>

#include "common/check.h"
#include "common/vector_isa.h"

namespace ncf {

AdamStepScalars adam_step_scalars(const AdamHyper& h, int64_t t) {
  NCF_CHECK(t >= 1, "Adam step t=", t, " must be >= 1");
  NCF_CHECK(h.beta1 >= 0.0f && h.beta1 < 1.0f, "Adam beta1=", h.beta1, " outside [0, 1)");
  NCF_CHECK(h.beta2 >= 0.0f && h.beta2 < 1.0f, "Adam beta2=", h.beta2, " outside [0, 1)");
  double td = static_cast<double>(t);
  double lr_t = h.lr * std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), td)) /
                (1.0 - std::pow(static_cast<double>(h.beta1), td));
  return AdamStepScalars{static_cast<float>(lr_t), h.beta1, h.beta2, h.eps, h.l2};
}

namespace {

// adam_update on [0, n), a loop the compiler vectorizes (sqrt without errno, no fused
// multiply-adds) for whichever path compiles it: adam_update_n_on runs it inlined into
// vector_isa.h's AVX-512 and AVX2 copies, or as built for the baseline.
void adam_loop(float* p, float* m, float* v, const float* g, int64_t n,
               const AdamStepScalars& scalars) {
  const AdamStepScalars s = scalars;  // a local copy: stores to p, m, v cannot alias it
  if (g)
    for (int64_t i = 0; i < n; ++i) adam_update(&p[i], &m[i], &v[i], g[i], s);
  else
    for (int64_t i = 0; i < n; ++i) adam_update(&p[i], &m[i], &v[i], 0.0f, s);
}

}  // namespace

VectorIsa adam_update_n_on(VectorIsa isa, float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamStepScalars& s) {
  isa = runnable_vector_isa(isa);
  run_on(isa, [&] { adam_loop(p, m, v, g, n, s); });
  return isa;
}

void adam_update_n(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamStepScalars& s) {
  adam_update_n_on(vector_isa(), p, m, v, g, n, s);
}

}  // namespace ncf
