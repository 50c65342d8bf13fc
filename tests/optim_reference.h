// The optimizer formulas written out in double, and the vector helpers the
// optimizer tests share (test_optim.cc for the tower, test_table_ops.cc for
// the tables).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/device.h"
#include "common/update_rules.h"

namespace ncf {
namespace test {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

inline Vec random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline ExecContext cpu(int threads) {
  ExecContext ctx;
  ctx.threads = threads;
  return ctx;
}

inline void expect_close(const Vec& got, const DVec& want, double atol, double rtol,
                         const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    double err = std::fabs(static_cast<double>(got[k]) - want[k]);
    if (!(err <= atol + rtol * std::fabs(want[k])) && reported++ < 5)
      ADD_FAILURE() << what << "[" << k << "]: got " << got[k] << ", want " << want[k];
  }
}

// Float state vs double reference after a few steps: float rounding of each
// step only (the update sizes are ~lr, so relative error stays ~1e-6).
constexpr double kAtol = 1e-6, kRtol = 1e-5;

// ---- the formulas, in double -------------------------------------------------------

// TF-style Adam: lr_t = lr·sqrt(1−β2^t)/(1−β1^t); eps added to sqrt(v).
inline void ref_adam(double& p, double& m, double& v, double g, int t, const AdamHyper& h) {
  g += h.l2 * p;
  double b1 = h.beta1, b2 = h.beta2;
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  double lr_t = h.lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
  p -= lr_t * m / (std::sqrt(v) + h.eps);
}

inline void ref_adagrad(double& p, double& acc, double g, const AdagradHyper& h) {
  g += h.l2 * p;
  acc += g * g;
  p -= h.lr * g / (std::sqrt(acc) + h.eps);
}

inline void ref_sgd(double& p, double g, const SgdHyper& h) { p -= h.lr * (g + h.l2 * p); }

// FBGEMM's exact row-wise Adagrad on one row p[D] with one accumulator.
inline void ref_rowwise_adagrad(double* p, double& acc, const float* g, int D,
                                const AdagradHyper& h) {
  std::vector<double> x(static_cast<size_t>(D));
  double sq = 0;
  for (int d = 0; d < D; ++d) {
    x[size_t(d)] = g[d] + h.l2 * p[d];
    sq += x[size_t(d)] * x[size_t(d)];
  }
  acc += sq / D;
  for (int d = 0; d < D; ++d) p[d] -= h.lr * x[size_t(d)] / (std::sqrt(acc) + h.eps);
}

inline AdamHyper tf_garden_adam(float l2) {
  AdamHyper h;  // TF Model Garden ml-20m settings (docs/design.md)
  h.lr = 0.00382059f;
  h.beta1 = 0.783529f;
  h.beta2 = 0.909003f;
  h.eps = 1.45439e-7f;
  h.l2 = l2;
  return h;
}

}  // namespace test
}  // namespace ncf
