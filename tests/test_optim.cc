// The tower's dense Adam (model/optim.h) against its formula written out
// in double (optim_reference.h), over several steps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/check.h"
#include "model/optim.h"
#include "optim_reference.h"

namespace ncf {
namespace {

using test::cpu;
using test::DVec;
using test::expect_close;
using test::kAtol;
using test::kRtol;
using test::random_vec;
using test::ref_adam;
using test::tf_garden_adam;
using test::Vec;

// ---- dense -------------------------------------------------------------------------

TEST(DenseOptim, AdamFollowsFormulaOverSteps) {
  for (float l2 : {0.0f, 0.05f}) {
    SCOPED_TRACE(::testing::Message() << "l2=" << l2);
    const int n = 37, steps = 5;
    AdamHyper h = tf_garden_adam(l2);
    Vec p = random_vec(n, 1), m(n, 0.0f), v(n, 0.0f);
    DVec pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
    for (int t = 1; t <= steps; ++t) {
      Vec g = random_vec(n, 100 + t, -0.1f, 0.1f);
      g[3] = 0.0f;  // a zero gradient still moves p once m is nonzero
      dense_adam_step(cpu(2), p.data(), g.data(), m.data(), v.data(), n, t, h);
      for (int k = 0; k < n; ++k) ref_adam(pd[k], md[k], vd[k], g[k], t, h);
    }
    expect_close(p, pd, kAtol, kRtol, "p");
    expect_close(m, md, kAtol, kRtol, "m");
    expect_close(v, vd, 1e-9, kRtol, "v");
  }
}

TEST(DenseOptim, AdamFirstStepMovesEachParamByAboutLr) {
  // Hand-worked: at t = 1, m = (1−β1)g, v = (1−β2)g², lr_t = lr·sqrt(1−β2)/(1−β1),
  // so the step is lr·g/|g| up to eps: every parameter moves by lr against its gradient.
  AdamHyper h;
  h.lr = 0.01f;
  Vec p = {1.0f, 1.0f, 1.0f}, g = {0.5f, -2.0f, 1e-3f}, m(3, 0.0f), v(3, 0.0f);
  dense_adam_step(cpu(1), p.data(), g.data(), m.data(), v.data(), 3, 1, h);
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
  EXPECT_NEAR(p[1], 1.01f, 1e-6);
  EXPECT_NEAR(p[2], 0.99f, 1e-5);
}

TEST(DenseOptim, AdamRejectsStepZero) {
  Vec p(2), g(2), m(2), v(2);
  EXPECT_THROW(dense_adam_step(cpu(1), p.data(), g.data(), m.data(), v.data(), 2, 0, AdamHyper{}),
               Error);
}

}  // namespace
}  // namespace ncf
