// The tower's dense Adam (model/optim.h) against its formula written out
// in double (optim_reference.h), over several steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/vector_isa.h"
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

// adam_update_n's vector paths against the scalar rule, element by element: the same bits
// for p, m and v on every path this CPU runs, with and without a gradient, with L2, over
// lengths that leave a tail after the last full vector, and on values where the order or
// fusing of the operations shows (signed zeros, subnormals, magnitudes far apart).
TEST(AdamUpdateN, EveryPathGivesTheScalarRulesBits) {
  const int n = 16 * 5 + 13;
  Vec p0 = random_vec(n, 7, -2.0f, 2.0f), m0 = random_vec(n, 8, -1e-3f, 1e-3f);
  Vec v0 = random_vec(n, 9, 0.0f, 1e-6f), g0 = random_vec(n, 10, -0.1f, 0.1f);
  const float tiny = std::numeric_limits<float>::denorm_min();
  m0[0] = -0.0f;
  m0[1] = -tiny;  // β1·m rounds to −0, and −0 + 0 is +0
  m0[17] = tiny;
  v0[2] = 0.0f;
  g0[3] = 1e30f;  // g² overflows to inf
  g0[4] = -0.0f;
  p0[5] = 1e-30f;
  p0[33] = 3e38f;
  for (float l2 : {0.0f, 0.05f})
    for (bool with_g : {true, false})
      for (VectorIsa isa : {VectorIsa::kAvx512, VectorIsa::kAvx2, VectorIsa::kBaseline}) {
        Vec p = p0, m = m0, v = v0, pr = p0, mr = m0, vr = v0;
        VectorIsa ran = isa;
        for (int t = 1; t <= 4; ++t) {
          const AdamStepScalars s = adam_step_scalars(test::tf_garden_adam(l2), t);
          // A shorter length each step: a different tail after the last full vector.
          const int len = n - (t - 1) * 5;
          ran = adam_update_n_on(isa, p.data(), m.data(), v.data(), with_g ? g0.data() : nullptr,
                                 len, s);
          for (int i = 0; i < len; ++i)
            adam_update(&pr[i], &mr[i], &vr[i], with_g ? g0[i] : 0.0f, s);
        }
        SCOPED_TRACE(::testing::Message()
                     << "l2=" << l2 << " gradient=" << with_g << " path " << vector_isa_name(isa)
                     << " ran " << vector_isa_name(ran));
        for (int i = 0; i < n; ++i) {
          EXPECT_EQ(std::memcmp(&p[i], &pr[i], 4), 0)
              << "p[" << i << "] " << p[i] << " vs " << pr[i];
          EXPECT_EQ(std::memcmp(&m[i], &mr[i], 4), 0)
              << "m[" << i << "] " << m[i] << " vs " << mr[i];
          EXPECT_EQ(std::memcmp(&v[i], &vr[i], 4), 0)
              << "v[" << i << "] " << v[i] << " vs " << vr[i];
        }
      }
}

// The widest path against the kernel's own list of this CPU's flags (/proc/cpuinfo):
// AVX-512 needs F, BW, VL and DQ (vector_isa.h), AVX2 its flag.
TEST(AdamUpdateN, BestPathIsOneThisCpuRuns) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  auto has = [&](const char* f) {
    return flags.find(std::string(" ") + f + " ") != std::string::npos;
  };
  const VectorIsa want = has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq")
                             ? VectorIsa::kAvx512
                         : has("avx2") ? VectorIsa::kAvx2
                                       : VectorIsa::kBaseline;
  const VectorIsa best = best_vector_isa();
  EXPECT_EQ(best, want) << "best " << vector_isa_name(best)
                        << ", /proc/cpuinfo: " << vector_isa_name(want);
  // A wider path than the CPU has runs the best one instead.
  float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
  EXPECT_EQ(
      adam_update_n_on(VectorIsa::kAvx512, &p, &m, &v, &g, 1, adam_step_scalars(AdamHyper{}, 1)),
      best);
}

}  // namespace
}  // namespace ncf
