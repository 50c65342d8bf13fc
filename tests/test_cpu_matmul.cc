// model/cpu_matmul.h, the oneDNN products under the CPU ops: every epilogue
// (alpha, add to C, bias, ReLU), every transpose and padded strides against a
// double-precision loop, in FP32 and in BF16 on both paths (the CPU's BF16
// instructions and the emulated one), the vectorised BF16 rounding against the
// scalar one of common/bf16.h bit for bit, and the startup description against
// the CPU flags the kernel reports in /proc/cpuinfo; group_linear_forward (the
// fused join of layer 0) against a double loop, at 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "model/cpu_matmul.h"
#include "model/ops.h"

namespace ncf {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

bool cpu_has_bf16_instructions() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w == "avx512_bf16" || w == "amx_bf16") return true;
    return false;
  }
  return false;
}

struct Emulated {
  explicit Emulated(bool on) { set_cpu_bf16_emulated(on); }
  ~Emulated() { set_cpu_bf16_emulated(false); }
};

// C = act(alpha·op(A)·op(B) + beta·C0 + bias) in double over (rounded, for
// BF16) operands, with the scale Σ|terms| each element's error is held to.
void reference(const MatmulShape& s, const std::vector<float>& A, const std::vector<float>& B,
               const std::vector<float>& C0, const MatmulEpilogue& ep, bool bf16,
               std::vector<double>* want, std::vector<double>* scale) {
  auto r = [&](float x) { return bf16 ? double(round_to_bf16(x)) : double(x); };
  want->assign(C0.begin(), C0.end());
  scale->assign(C0.size(), 0.0);
  for (int i = 0; i < s.M; ++i)
    for (int j = 0; j < s.N; ++j) {
      double sum = 0, mag = 0;
      for (int k = 0; k < s.K; ++k) {
        const double t = r(s.trans_a ? A[size_t(k) * s.lda + i] : A[size_t(i) * s.lda + k]) *
                         r(s.trans_b ? B[size_t(j) * s.ldb + k] : B[size_t(k) * s.ldb + j]);
        sum += t;
        mag += std::fabs(t);
      }
      const size_t c = size_t(i) * s.ldc + j;
      double v = ep.alpha * sum + ep.beta * double(C0[c]);
      double m = std::fabs(ep.alpha) * mag + std::fabs(ep.beta * C0[c]);
      if (ep.bias) {
        v += ep.bias[j];
        m += std::fabs(ep.bias[j]);
      }
      if (ep.relu) v = v > 0 ? v : 0;
      (*want)[c] = v;
      (*scale)[c] = m;
    }
}

void check_case(const MatmulShape& s, const MatmulEpilogue& ep, MatmulPrecision prec,
                const std::string& what) {
  const std::vector<float> A = random_vec(size_t(s.trans_a ? s.K : s.M) * s.lda, 1);
  const std::vector<float> B = random_vec(size_t(s.trans_b ? s.N : s.K) * s.ldb, 2);
  const std::vector<float> C0 = random_vec(size_t(s.M) * s.ldc, 3);
  std::vector<double> want, scale;
  const bool bf16 = prec == MatmulPrecision::kBf16;
  reference(s, A, B, C0, ep, bf16, &want, &scale);
  std::vector<float> C = C0;
  cpu_matmul(s, A.data(), B.data(), C.data(), ep, prec);
  // FP32 products: a few ulps of the magnitude. BF16 operands are exact in
  // FP32 and so are their products; what is left is FP32 accumulation.
  const double rtol = 4e-6;
  for (int i = 0; i < s.M; ++i) {
    for (int j = 0; j < s.ldc; ++j) {
      const size_t c = size_t(i) * s.ldc + j;
      if (j >= s.N) {
        ASSERT_EQ(C[c], C0[c]) << what << ": padding column " << j << " of row " << i;
        continue;
      }
      ASSERT_NEAR(C[c], want[c], rtol * scale[c] + 1e-30) << what << " at " << i << "," << j;
    }
  }
}

TEST(CpuMatmul, EveryEpilogueTransposeAndStrideMatchesDoubleLoop) {
  const int M = 37, N = 29, K = 70, pad = 5;
  for (MatmulPrecision prec : {MatmulPrecision::kFp32, MatmulPrecision::kBf16})
    for (bool emulated : {false, true}) {
      if (prec == MatmulPrecision::kFp32 && emulated) continue;
      Emulated e(emulated);
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (int epi = 0; epi < 4; ++epi) {
            MatmulShape s;
            s.M = M;
            s.N = N;
            s.K = K;
            s.trans_a = ta;
            s.trans_b = tb;
            s.lda = (ta ? M : K) + pad;
            s.ldb = (tb ? K : N) + pad;
            s.ldc = N + pad;
            const std::vector<float> bias = random_vec(N, 9);
            MatmulEpilogue ep;
            if (epi & 1) {
              ep.bias = bias.data();
              ep.relu = true;
            }
            if (epi & 2) {
              ep.alpha = ep.bias ? 1.0f : -0.75f;  // alpha ≠ 1 never comes with a bias
              ep.beta = 1.0f;
            }
            const std::string what = std::string(prec == MatmulPrecision::kBf16 ? "bf16" : "fp32") +
                                     (emulated ? " emulated" : "") + (ta ? " A^T" : "") +
                                     (tb ? " B^T" : "") + (ep.relu ? " +bias+relu" : "") +
                                     (ep.beta != 0 ? " alpha,+C" : "");
            check_case(s, ep, prec, what);
          }
    }
}

TEST(CpuMatmul, BlockShapesOfTheTowerMatchDoubleLoop) {
  // The shapes the CPU ops hand over: a 1024-row block of a 256-wide layer with
  // bias and ReLU, its input gradient, and a weight gradient over 8192 rows
  // with A transposed (dZ^T).
  const struct {
    int M, N, K;
    bool ta, tb, epi;
  } shapes[] = {{1024, 256, 128, false, true, true},
                {1024, 128, 256, false, false, false},
                {128, 256, 8192, true, false, false}};
  for (MatmulPrecision prec : {MatmulPrecision::kFp32, MatmulPrecision::kBf16})
    for (const auto& sh : shapes) {
      MatmulShape s;
      s.M = sh.M;
      s.N = sh.N;
      s.K = sh.K;
      s.trans_a = sh.ta;
      s.trans_b = sh.tb;
      s.lda = sh.ta ? sh.M : sh.K;
      s.ldb = sh.tb ? sh.K : sh.N;
      s.ldc = sh.N;
      const std::vector<float> bias = random_vec(sh.N, 11);
      MatmulEpilogue ep;
      if (sh.epi) {
        ep.bias = bias.data();
        ep.relu = true;
      }
      check_case(s, ep, prec,
                 std::to_string(sh.M) + "x" + std::to_string(sh.N) + "x" + std::to_string(sh.K));
    }
}

TEST(CpuMatmul, BothBf16PathsRoundTheOperandsTheSameWay) {
  // K = 1 without an epilogue: each element is one product of two BF16 values,
  // exact in FP32, so both paths must give exactly round(a)·round(b) — also for
  // operands whose rounding carries into the exponent or ties to even.
  const int M = 40, N = 24;
  std::vector<float> A = random_vec(M, 4), B = random_vec(N, 5);
  A[0] = 1.0f + 3.0f / 256.0f;  // a tie on an odd pattern: rounds up
  A[1] = 2.0f - 1.0f / 256.0f;  // a tie carrying into the exponent
  B[0] = 3.14159265f;
  MatmulShape s;
  s.M = M;
  s.N = N;
  s.K = 1;
  s.lda = 1;
  s.ldb = N;
  s.ldc = N;
  for (bool emulated : {false, true}) {
    Emulated e(emulated);
    std::vector<float> C(size_t(M) * N, -1.0f);
    cpu_matmul(s, A.data(), B.data(), C.data(), MatmulEpilogue{}, MatmulPrecision::kBf16);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j)
        ASSERT_EQ(C[size_t(i) * N + j], round_to_bf16(A[i]) * round_to_bf16(B[j]))
            << (emulated ? "emulated" : "native") << " at " << i << "," << j;
  }
}

TEST(CpuMatmul, VectorisedRoundingEqualsScalarBitForBit) {
  // Every float bit pattern in a stride that visits all exponents and low-bit
  // endings (ties, just above and below, NaN payloads, subnormals), plus the
  // special values, through the bulk conversion and one by one.
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) {
    const uint32_t b = static_cast<uint32_t>(u);
    for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, b & 0xFFFFu}) {
      const uint32_t v = (b & 0xFFFF0000u) | low;
      float f;
      std::memcpy(&f, &v, sizeof(f));
      x.push_back(f);
    }
  }
  for (float f : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()})
    x.push_back(f);
  std::vector<uint16_t> got(x.size());
  round_to_bf16_bits(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    ASSERT_EQ(got[i], float_to_bf16_bits(x[i])) << "float bits 0x" << std::hex << bits;
  }
}

TEST(CpuMatmul, GroupLinearForwardMatchesDoubleLoopAtAnyThreadCount) {
  // n·S = 2250 rows: three of the CPU's row blocks, the last one short; X and
  // the weight are column slices of wider arrays, as in layer 0.
  const int64_t n = 450;
  const int S = 5, in = 48, out = 40, ldx = in + 16, ldw = 2 * in;
  const int64_t B = n * S;
  const std::vector<float> X = random_vec(size_t(B) * ldx, 21),
                           W = random_vec(size_t(out) * ldw, 22),
                           U = random_vec(size_t(n) * out, 23), bias = random_vec(out, 24);
  for (MathMode mode : {MathMode::kFp32, MathMode::kBf16}) {
    set_math_mode(mode);
    const bool bf16 = mode == MathMode::kBf16;
    auto r = [&](float x) { return bf16 ? double(round_to_bf16(x)) : double(x); };
    std::vector<float> Y1(size_t(B) * out, 7.0f), Y2 = Y1;
    ExecContext one, two;
    one.threads = 1;
    two.threads = 2;
    group_linear_forward(one, X.data(), ldx, W.data() + in, ldw, U.data(), bias.data(), Y1.data(),
                         n, S, in, out, true);
    group_linear_forward(two, X.data(), ldx, W.data() + in, ldw, U.data(), bias.data(), Y2.data(),
                         n, S, in, out, true);
    ASSERT_EQ(Y1, Y2) << math_mode_name(mode) << ": the thread count changed a bit";
    for (int64_t b = 0; b < B; ++b)
      for (int j = 0; j < out; ++j) {
        double sum = 0, mag = 0;
        for (int k = 0; k < in; ++k) {
          const double t = r(X[size_t(b) * ldx + k]) * r(W[size_t(j) * ldw + in + k]);
          sum += t;
          mag += std::fabs(t);
        }
        const double u = U[size_t(b / S) * out + j];
        const double z = sum + u + bias[j];
        const double want = z > 0 ? z : 0;
        ASSERT_NEAR(Y1[size_t(b) * out + j], want,
                    4e-6 * (mag + std::fabs(u) + std::fabs(bias[j])) + 1e-30)
            << math_mode_name(mode) << " row " << b << " col " << j;
      }
  }
  set_math_mode(MathMode::kTf32);
}

TEST(CpuMatmul, LinearLayerOverManyBlocksAndSlicesMatchesDoubleLoops) {
  // B = 20000 rows: twenty row blocks (the last one short) for the forward
  // product and the fused mask + bias-sum + input-gradient pass, and three K
  // slices for the weight gradient; every output against double loops.
  const int64_t B = 20000;
  const int in = 24, out = 20;
  const std::vector<float> X = random_vec(size_t(B) * in, 31), W = random_vec(size_t(out) * in, 32),
                           bias = random_vec(out, 33), G = random_vec(size_t(B) * out, 34);
  set_math_mode(MathMode::kFp32);
  // The same layer at 1 and 2 threads, twice: two pool threads run blocks of
  // one shape at the same moment, and nothing they share may change a bit.
  std::vector<float> Y, dY, dX, dW, db;
  for (int run = 0; run < 3; ++run) {
    ExecContext ctx;
    ctx.threads = run == 0 ? 1 : 2;
    std::vector<float> y(size_t(B) * out), dy = G, dx(size_t(B) * in), dw(size_t(out) * in, 0.5f),
                                           dbias(out, 0.25f);
    linear_forward(ctx, X.data(), W.data(), bias.data(), y.data(), B, in, out, true);
    linear_backward(ctx, X.data(), W.data(), y.data(), dy.data(), dx.data(), dw.data(),
                    dbias.data(), B, in, out, true, GradMode::kAccumulate);
    if (run == 0) {
      Y = y;
      dY = dy;
      dX = dx;
      dW = dw;
      db = dbias;
      continue;
    }
    ASSERT_EQ(y, Y) << "run " << run;
    ASSERT_EQ(dx, dX) << "run " << run;
    ASSERT_EQ(dw, dW) << "run " << run;
    ASSERT_EQ(dbias, db) << "run " << run;
  }
  std::vector<double> wdW(size_t(out) * in, 0.5), mdW(size_t(out) * in, 0.5), wdb(out, 0.25),
      mdb(out, 0.25);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> dz(out);
    for (int j = 0; j < out; ++j) {
      double z = bias[j], mag = std::fabs(bias[j]);
      for (int k = 0; k < in; ++k) {
        z += double(X[size_t(b) * in + k]) * W[size_t(j) * in + k];
        mag += std::fabs(double(X[size_t(b) * in + k]) * W[size_t(j) * in + k]);
      }
      const double y = z > 0 ? z : 0;
      ASSERT_NEAR(Y[size_t(b) * out + j], y, 4e-6 * mag + 1e-30) << "Y at " << b << "," << j;
      // The mask follows the computed Y, as the op does (a z within rounding of 0 may go either
      // way).
      dz[j] = Y[size_t(b) * out + j] > 0 ? G[size_t(b) * out + j] : 0.0;
      ASSERT_EQ(dY[size_t(b) * out + j], float(dz[j])) << "masked dY at " << b << "," << j;
      wdb[j] += dz[j];
      mdb[j] += std::fabs(dz[j]);
      for (int k = 0; k < in; ++k) {
        wdW[size_t(j) * in + k] += dz[j] * X[size_t(b) * in + k];
        mdW[size_t(j) * in + k] += std::fabs(dz[j] * X[size_t(b) * in + k]);
      }
    }
    for (int k = 0; k < in; ++k) {
      double s = 0, mag = 0;
      for (int j = 0; j < out; ++j) {
        s += dz[j] * W[size_t(j) * in + k];
        mag += std::fabs(dz[j] * W[size_t(j) * in + k]);
      }
      ASSERT_NEAR(dX[size_t(b) * in + k], s, 4e-6 * mag + 1e-30) << "dX at " << b << "," << k;
    }
  }
  for (size_t i = 0; i < dW.size(); ++i)
    ASSERT_NEAR(dW[i], wdW[i], 4e-6 * mdW[i] + 1e-6) << "dW[" << i << "]";
  for (int j = 0; j < out; ++j)
    ASSERT_NEAR(db[j], wdb[j], 4e-6 * mdb[j] + 1e-6) << "db[" << j << "]";
  set_math_mode(MathMode::kTf32);
}

TEST(CpuMatmul, DescriptionSaysWhetherBf16IsNativeAsTheCpuFlagsDo) {
  const std::string d = cpu_matmul_description();
  EXPECT_NE(d.find("oneDNN "), std::string::npos) << d;
  if (cpu_has_bf16_instructions()) {
    EXPECT_TRUE(cpu_bf16_native()) << d;
    EXPECT_NE(d.find("bf16 native"), std::string::npos) << d;
  } else {
    EXPECT_FALSE(cpu_bf16_native()) << d;
    EXPECT_NE(d.find("bf16 emulated (no BF16 instructions"), std::string::npos) << d;
  }
  Emulated e(true);
  EXPECT_FALSE(cpu_bf16_native());
  EXPECT_NE(cpu_matmul_description().find("bf16 emulated"), std::string::npos);
}

}  // namespace
}  // namespace ncf
