// The per-step Adam scalars of update_rules.h, computed on the host in double, and the
// CPU's vector Adam over n elements.
#include "common/update_rules.h"

#include <immintrin.h>

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

void adam_scalar(float* p, float* m, float* v, const float* g, int64_t n,
                 const AdamStepScalars& scalars) {
  const AdamStepScalars s = scalars;  // a local copy: stores to p, m, v cannot alias it
  if (g)
    for (int64_t i = 0; i < n; ++i) adam_update(&p[i], &m[i], &v[i], g[i], s);
  else
    for (int64_t i = 0; i < n; ++i) adam_update(&p[i], &m[i], &v[i], 0.0f, s);
}

// sqrt on all 16 lanes. GCC 12 warns that _mm512_sqrt_ps's placeholder source may be used
// uninitialized (it is not: no lane is masked); the masked form names a source.
__attribute__((target("avx512f"))) inline __m512 sqrt16(__m512 x) {
  return _mm512_mask_sqrt_ps(x, __mmask16(0xFFFF), x);
}

// adam_update's operations, one per intrinsic, in its order:
//   g += l2·p;  m = β1·m + (1−β1)·g;  v = β2·v + ((1−β2)·g)·g;  p −= (lr_t·m) / (sqrt(v) + eps).
__attribute__((target("avx512f"))) void adam_avx512(float* p, float* m, float* v, const float* g,
                                                    int64_t n, const AdamStepScalars& s) {
  const __m512 l2 = _mm512_set1_ps(s.l2), b1 = _mm512_set1_ps(s.beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), c1 = _mm512_set1_ps(1.0f - s.beta1);
  const __m512 c2 = _mm512_set1_ps(1.0f - s.beta2), lr = _mm512_set1_ps(s.lr_t);
  const __m512 eps = _mm512_set1_ps(s.eps);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pp = _mm512_loadu_ps(p + i);
    __m512 gg = g ? _mm512_loadu_ps(g + i) : _mm512_setzero_ps();
    gg = _mm512_add_ps(gg, _mm512_mul_ps(l2, pp));
    const __m512 mm =
        _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(c1, gg));
    const __m512 vv = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(c2, gg), gg));
    pp = _mm512_sub_ps(pp, _mm512_div_ps(_mm512_mul_ps(lr, mm), _mm512_add_ps(sqrt16(vv), eps)));
    _mm512_storeu_ps(m + i, mm);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(p + i, pp);
  }
  adam_scalar(p + i, m + i, v + i, g ? g + i : nullptr, n - i, s);
}

__attribute__((target("avx2"))) void adam_avx2(float* p, float* m, float* v, const float* g,
                                               int64_t n, const AdamStepScalars& s) {
  const __m256 l2 = _mm256_set1_ps(s.l2), b1 = _mm256_set1_ps(s.beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2), c1 = _mm256_set1_ps(1.0f - s.beta1);
  const __m256 c2 = _mm256_set1_ps(1.0f - s.beta2), lr = _mm256_set1_ps(s.lr_t);
  const __m256 eps = _mm256_set1_ps(s.eps);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pp = _mm256_loadu_ps(p + i);
    __m256 gg = g ? _mm256_loadu_ps(g + i) : _mm256_setzero_ps();
    gg = _mm256_add_ps(gg, _mm256_mul_ps(l2, pp));
    const __m256 mm =
        _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(c1, gg));
    const __m256 vv = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(_mm256_mul_ps(c2, gg), gg));
    pp = _mm256_sub_ps(
        pp, _mm256_div_ps(_mm256_mul_ps(lr, mm), _mm256_add_ps(_mm256_sqrt_ps(vv), eps)));
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pp);
  }
  adam_scalar(p + i, m + i, v + i, g ? g + i : nullptr, n - i, s);
}

}  // namespace

VectorIsa adam_update_n_on(VectorIsa isa, float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamStepScalars& s) {
  const VectorIsa best = best_vector_isa();
  if (isa < best) isa = best;  // narrower is larger: kAvx512 < kAvx2 < kBaseline
  switch (isa) {
    case VectorIsa::kAvx512:
      adam_avx512(p, m, v, g, n, s);
      break;
    case VectorIsa::kAvx2:
      adam_avx2(p, m, v, g, n, s);
      break;
    case VectorIsa::kBaseline:
      adam_scalar(p, m, v, g, n, s);
      break;
  }
  return isa;
}

void adam_update_n(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamStepScalars& s) {
  adam_update_n_on(vector_isa(), p, m, v, g, n, s);
}

}  // namespace ncf
