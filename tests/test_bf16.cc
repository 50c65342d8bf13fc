// BF16 arithmetic (common/bf16.h, MathMode::kBf16 in model/ops.h): conversions
// against hand-worked bit patterns and against a brute-force nearest-BF16 search
// by bit stepping; the CPU GEMMs of --precision bf16 (gemm, linear_forward,
// linear_backward) against naive double-precision loops over BF16-rounded
// inputs, with a guard that the mode really changes the result; the
// --precision parser. The mode is process-wide: every test that sets it puts
// back the default (kTf32) before it ends.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "model/ops.h"
#include "test_util.h"

namespace ncf {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

uint32_t to_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// ---- scalar conversions ------------------------------------------------------------

struct Case {
  uint32_t in;   // float bits
  uint16_t out;  // expected BF16 bits
  const char* why;
};

// Worked by hand: BF16 keeps the top 16 bits of the float; the low 16 bits
// decide the rounding (above 0x8000 up, below down, exactly 0x8000 to the even
// kept pattern).
const Case kCases[] = {
    {0x3F800000u, 0x3F80, "1.0 is exact"},
    {0xBF800000u, 0xBF80, "-1.0 is exact"},
    {0x3F808000u, 0x3F80, "1 + 2^-8: a tie, 0x3F80 is even, stays 1.0"},
    {0x3F818000u, 0x3F82, "1 + 3*2^-8: a tie, 0x3F81 is odd, up to 1 + 2^-6"},
    {0x3F807FFFu, 0x3F80, "just below the tie rounds down"},
    {0x3F808001u, 0x3F81, "just above the tie rounds up"},
    {0x3F80FFFFu, 0x3F81, "0xFFFF dropped rounds up"},
    {0xBF818000u, 0xBF82, "negative tie: -(1 + 3*2^-8) to -(1 + 2^-6)"},
    {0x3FFF8000u, 0x4000, "2 - 2^-8: a tie on odd 0x3FFF, carries into the exponent: 2.0"},
    {0x40490FDBu, 0x4049, "pi (0x0FDB dropped) to 3.140625"},
    {0x3DCCCCCDu, 0x3DCD, "0.1f (0xCCCD dropped) up to 0.10009765625"},
    {0x7F7F0000u, 0x7F7F, "largest finite BF16 is exact"},
    {0x7F7F7FFFu, 0x7F7F, "below half an ulp past the largest finite BF16 stays finite"},
    {0x7F7F8000u, 0x7F80, "half an ulp past the largest BF16: a tie on odd 0x7F7F, to +Inf"},
    {0x7F7FFFFFu, 0x7F80, "largest finite float overflows to +Inf"},
    {0xFF7FFFFFu, 0xFF80, "most negative finite float overflows to -Inf"},
    {0x7F800000u, 0x7F80, "+Inf stays +Inf"},
    {0xFF800000u, 0xFF80, "-Inf stays -Inf"},
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0 keeps its sign"},
    {0x00000001u, 0x0000, "smallest float subnormal rounds to +0"},
    {0x80000001u, 0x8000, "negative smallest subnormal rounds to -0"},
    {0x00010000u, 0x0001, "smallest BF16 subnormal (2^-133) is exact"},
    {0x00008000u, 0x0000, "half the smallest BF16 subnormal: a tie, to even +0"},
    {0x00008001u, 0x0001, "just above that half rounds up to 2^-133"},
    {0x00018000u, 0x0002, "subnormal tie on odd 0x0001 rounds up to 0x0002"},
    {0x007FFFFFu, 0x0080, "largest float subnormal rounds up to the smallest normal 2^-126"},
};

TEST(Bf16Conversion, HandWorkedCases) {
  for (const Case& c : kCases) {
    EXPECT_EQ(float_to_bf16_bits(from_bits(c.in)), c.out)
        << std::hex << "0x" << c.in << ": " << c.why;
    // round_to_bf16 is that BF16 as a float: its bits are the BF16 bits << 16.
    EXPECT_EQ(to_bits(round_to_bf16(from_bits(c.in))), uint32_t(c.out) << 16)
        << std::hex << "0x" << c.in << ": " << c.why;
  }
}

TEST(Bf16Conversion, Bf16ToFloatValues) {
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0xC000), -2.0f);
  EXPECT_EQ(bf16_bits_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_bits_to_float(0x3DCD), 0.10009765625f);
  EXPECT_EQ(bf16_bits_to_float(0x3F82), 1.0f + 0.015625f);         // 1 + 2^-6
  EXPECT_EQ(bf16_bits_to_float(0x7F7F), std::ldexp(255.0f, 120));  // (2 − 2^-7)·2^127
  EXPECT_EQ(bf16_bits_to_float(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(bf16_bits_to_float(0x0080), std::ldexp(1.0f, -126));
  EXPECT_EQ(bf16_bits_to_float(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_bits_to_float(0xFF80), -std::numeric_limits<float>::infinity());
  const float nz = bf16_bits_to_float(0x8000);
  EXPECT_EQ(nz, 0.0f);
  EXPECT_TRUE(std::signbit(nz));
  // Every BF16 survives the round trip bit for bit, except that a signalling
  // NaN comes back quiet (bit 6 set).
  for (uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const bool nan = (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0;
    ASSERT_EQ(float_to_bf16_bits(bf16_bits_to_float(uint16_t(b))), uint16_t(nan ? b | 0x40u : b))
        << std::hex << b;
  }
}

bool bf16_is_nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

TEST(Bf16Conversion, NaNStaysAQuietNaNWithItsSign) {
  const uint32_t nans[] = {0x7FC00000u,  // the default quiet NaN
                           0x7F800001u,  // signalling, payload only in the dropped bits
                           0x7F80FFFFu,  // same, payload fills the dropped bits
                           0x7FFFFFFFu,  // all ones: rounding up would carry out
                           0x7FBF8000u,  // signalling, payload in the kept bits
                           0xFFC00000u, 0xFF800001u, 0xFFFFFFFFu};
  for (uint32_t u : nans) {
    const uint16_t b = float_to_bf16_bits(from_bits(u));
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << "0x" << u << " -> 0x" << b;
    EXPECT_TRUE(b & 0x0040) << std::hex << "0x" << u << " -> 0x" << b << " is not quiet";
    EXPECT_EQ(b >> 15, u >> 31) << std::hex << "0x" << u << " lost its sign";
    EXPECT_TRUE(std::isnan(round_to_bf16(from_bits(u))));
  }
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x7FBF8000u)), 0x7FFF);  // payload kept, quiet bit set
}

// The nearest BF16 to x by stepping bit patterns: x lies between the BF16 `lo`
// (its bits truncated, toward zero) and the next one away from zero `hi`; pick
// the nearer by exact distance (double holds every float difference here), ties
// to the even pattern. Past the largest finite BF16, `hi` is 2^128 as if the
// exponent were unbounded — IEEE's overflow rule — and stands for Inf.
uint16_t nearest_bf16_by_search(float x) {
  const uint32_t u = to_bits(x);
  const uint16_t lo = uint16_t(u >> 16);
  if ((u & 0xFFFFu) == 0) return lo;  // already a BF16 (covers ±0, ±Inf)
  const uint16_t hi = uint16_t(lo + 1);
  const double vx = std::fabs(double(x));
  const double vlo = std::fabs(double(bf16_bits_to_float(lo)));
  const double vhi =
      (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(double(bf16_bits_to_float(hi)));
  EXPECT_LT(vlo, vx);
  EXPECT_GT(vhi, vx);
  const double dlo = vx - vlo, dhi = vhi - vx;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

void expect_nearest(float x) {
  if (std::isnan(x)) return;
  const uint16_t want = nearest_bf16_by_search(x);
  const uint16_t got = float_to_bf16_bits(x);
  ASSERT_EQ(got, want) << std::hex << "x bits 0x" << to_bits(x) << " (" << std::scientific << x
                       << ")";
  ASSERT_EQ(to_bits(round_to_bf16(x)), uint32_t(want) << 16);
}

TEST(Bf16Conversion, RoundToBf16IsTheNearestBf16OverManyFloats) {
  std::mt19937 gen(1234567);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<uint32_t> any_high(0, 0xFFFFu);
  // Random bit patterns: every exponent (subnormals, huge values) and sign.
  for (int k = 0; k < 2000000; ++k) expect_nearest(from_bits(any_bits(gen)));
  // Exact ties and their neighbours, which random patterns almost never hit.
  for (int k = 0; k < 200000; ++k) {
    const uint32_t high = any_high(gen) << 16;
    for (uint32_t low : {0x7FFFu, 0x8000u, 0x8001u}) expect_nearest(from_bits(high | low));
  }
  // Every low half under a few high halves: around 1, the largest finite, the
  // subnormal/normal border, zero, both signs.
  for (uint32_t high : {0x3F80u, 0x3F81u, 0x7F7Fu, 0x007Fu, 0x0000u, 0x8000u, 0xFF7Fu, 0xBFFFu})
    for (uint32_t low = 0; low <= 0xFFFFu; ++low) expect_nearest(from_bits(high << 16 | low));
  // Typical magnitudes of weights and activations.
  std::uniform_real_distribution<float> val(-4.0f, 4.0f);
  for (int k = 0; k < 200000; ++k) expect_nearest(val(gen));
}

// ---- parse_math_mode / math_mode_name -------------------------------------------------

// Stochastic rounding, hand-worked: 1 + 2^-9 lies a quarter of the way from
// 1 (0x3F80) to 1 + 2^-7 (0x3F81); its dropped bits are 0x4000, so it goes up
// exactly for the quarter of words r >= 0xC000. A BF16 value never moves,
// Inf and NaN round as nearest-even does, and over a fixed set of 2^16 words
// every value's mean is itself (the rounding is unbiased).
TEST(Bf16Stochastic, UpWithTheDroppedFractionAndUnbiased) {
  const float x = 1.0f + 0x1p-9f;
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0x0000), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xBFFF), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xC000), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xFFFF), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits_stochastic(-x, 0xC000), 0xBF81) << "magnitude, sign kept";
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0x1C000), 0x3F81) << "only the low 16 bits count";
  for (uint32_t r : {0u, 0x7FFFu, 0xFFFFu}) {
    EXPECT_EQ(float_to_bf16_bits_stochastic(3.0f, r), 0x4040);
    EXPECT_EQ(float_to_bf16_bits_stochastic(INFINITY, r), 0x7F80);
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits_stochastic(NAN, r))));
  }
  for (float v : {1.0f + 0x1p-9f, 0.01f, -3.14159f, 1e-30f}) {
    double sum = 0;
    for (uint32_t r = 0; r < 0x10000u; ++r)
      sum += bf16_bits_to_float(float_to_bf16_bits_stochastic(v, r));
    EXPECT_NEAR(sum / 65536.0, double(v), std::fabs(double(v)) * 1e-6) << v;
  }
}

TEST(Bf16MathMode, ParseAndNameRoundTripAndBadValueIsNamed) {
  for (MathMode m : {MathMode::kTf32, MathMode::kFp32, MathMode::kBf16})
    EXPECT_EQ(parse_math_mode(math_mode_name(m)), m) << math_mode_name(m);
  EXPECT_STREQ(math_mode_name(MathMode::kBf16), "bf16");
  EXPECT_EQ(parse_math_mode("bf16"), MathMode::kBf16);
  EXPECT_EQ(parse_math_mode("fp32"), MathMode::kFp32);
  EXPECT_EQ(parse_math_mode("tf32"), MathMode::kTf32);
  try {
    parse_math_mode("fp16");
    ADD_FAILURE() << "fp16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_math_mode("BF16"), Error);
  EXPECT_THROW(parse_math_mode(""), Error);
}

// ---- the CPU GEMMs in kBf16 ------------------------------------------------------------

using test::ScopedMathMode;

using test::cpu;

// Values in [-1, 1) that are not BF16 values (random floats keep 24 bits), so
// rounding them changes almost every product.
using test::random_vec;

double rb(float x) { return double(round_to_bf16(x)); }

// Tolerance of an FP32-accumulated sum of K exact products (a product of two
// BF16 values is exact in FP32) against the same sum in double: the FP32
// summation error is at most about K·2^-24 of Σ|terms| (< 6e-6 for the K ≤ 100
// used here), so 1e-5 of Σ|terms| plus a denormal-level atol.
constexpr double kBf16Rtol = 1e-5, kTinyAtol = 1e-30;

// Elementwise |got − want| ≤ kTinyAtol + rtol·scale (scale = Σ|terms| of that element).
void expect_within(const Vec& got, const DVec& want, const DVec& scale, double rtol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const double err = std::fabs(double(got[k]) - want[k]);
    if (!(err <= kTinyAtol + rtol * scale[k]) && reported++ < 5)
      ADD_FAILURE() << what << "[" << k << "]: got " << got[k] << ", want " << want[k] << " (|err| "
                    << err << " > " << rtol * scale[k] << ")";
  }
}

// max_k |a[k] − b[k]| / scale[k]: how far two results are apart, in units of Σ|terms|.
double max_rel_gap(const Vec& a, const Vec& b, const DVec& scale) {
  double m = 0;
  for (size_t k = 0; k < a.size(); ++k)
    if (scale[k] > 0) m = std::max(m, std::fabs(double(a[k]) - double(b[k])) / scale[k]);
  return m;
}

// The mode must matter: with non-BF16 inputs the BF16 result moves by ~2^-9 per
// factor, i.e. far more than the FP32 summation tolerance. Asks for 10×.
void expect_mode_changes_result(const Vec& bf16, const Vec& fp32, const DVec& scale,
                                const std::string& what) {
  EXPECT_GT(max_rel_gap(bf16, fp32, scale), 10 * kBf16Rtol)
      << what << ": kBf16 gives the kFp32 result; the inputs were not rounded";
}

TEST(Bf16Gemm, CpuGemmMatchesDoubleLoopOverRoundedInputsForAllTransposes) {
  const int M = 7, N = 9, K = 64, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string what = std::string("C(") + (ta ? "T" : "N") + (tb ? "T" : "N") + ")";
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const Vec A = random_vec(size_t(ta ? K : M) * lda, 1),
                Bm = random_vec(size_t(tb ? N : K) * ldb, 2);
      const Vec C0 = random_vec(size_t(M) * ldc, 3);
      const float alpha = 0.75f, beta = -0.5f;
      DVec want(C0.begin(), C0.end()), scale(C0.size(), 0.0);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double s = 0, mag = 0;
          for (int k = 0; k < K; ++k) {
            const double t = rb(ta ? A[k * lda + i] : A[i * lda + k]) *
                             rb(tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
            s += t;
            mag += std::fabs(t);
          }
          // beta·C is FP32 arithmetic on an FP32 C: C is not a GEMM input.
          want[i * ldc + j] = alpha * s + beta * double(C0[i * ldc + j]);
          scale[i * ldc + j] = std::fabs(alpha) * mag + std::fabs(beta * C0[i * ldc + j]);
        }
      Vec C = C0, Cf = C0;
      const Vec A_before = A, B_before = Bm;
      {
        ScopedMathMode m(MathMode::kBf16);
        gemm(cpu(2), ta, tb, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
      }
      {
        ScopedMathMode m(MathMode::kFp32);
        gemm(cpu(2), ta, tb, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, Cf.data(), ldc);
      }
      // want and scale keep C0 and 0 in C's padding columns: they must stay untouched.
      expect_within(C, want, scale, kBf16Rtol, what);
      expect_mode_changes_result(C, Cf, scale, what);
      // FP32 masters: the operands themselves are never rounded in place.
      EXPECT_EQ(A, A_before) << what;
      EXPECT_EQ(Bm, B_before) << what;
    }
  EXPECT_EQ(math_mode(), MathMode::kTf32);
}

TEST(Bf16Gemm, CpuKOneProductsAreExactlyTheRoundedProducts) {
  // K = 1, alpha = 1, beta = 0: each C element is one product of two BF16
  // values, exact in FP32 — no summation order at all, so equality is exact.
  const int M = 33, N = 17;
  Vec A = random_vec(M, 4), Bm = random_vec(N, 5), C(size_t(M) * N, 0.0f);
  ScopedMathMode m(MathMode::kBf16);
  gemm(cpu(1), false, false, M, N, 1, 1.0f, A.data(), 1, Bm.data(), N, 0.0f, C.data(), N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      ASSERT_EQ(C[i * N + j], round_to_bf16(A[i]) * round_to_bf16(Bm[j])) << i << "," << j;
}

TEST(Bf16Linear, CpuForwardMatchesDoubleLoopWithFp32Bias) {
  const int B = 11, in = 40, out = 13;
  const Vec X = random_vec(size_t(B) * in, 10), W = random_vec(size_t(out) * in, 11);
  const Vec bias = random_vec(out, 12);
  for (bool relu : {false, true})
    for (bool with_bias : {false, true}) {
      const std::string what =
          std::string("relu=") + (relu ? "1" : "0") + " bias=" + (with_bias ? "1" : "0");
      DVec want(size_t(B) * out), scale(size_t(B) * out);
      for (int r = 0; r < B; ++r)
        for (int j = 0; j < out; ++j) {
          // The bias is added in FP32 after the GEMM: it is not rounded to BF16.
          double z = with_bias ? double(bias[j]) : 0.0, mag = with_bias ? std::fabs(bias[j]) : 0.0;
          for (int k = 0; k < in; ++k) {
            const double t = rb(X[r * in + k]) * rb(W[j * in + k]);
            z += t;
            mag += std::fabs(t);
          }
          want[r * out + j] = relu ? std::max(z, 0.0) : z;
          scale[r * out + j] = mag;
        }
      Vec Y(size_t(B) * out, 7.0f), Y2(Y), Yf(Y);
      {
        ScopedMathMode m(MathMode::kBf16);
        linear_forward(cpu(1), X.data(), W.data(), with_bias ? bias.data() : nullptr, Y.data(), B,
                       in, out, relu);
        linear_forward(cpu(2), X.data(), W.data(), with_bias ? bias.data() : nullptr, Y2.data(), B,
                       in, out, relu);
      }
      {
        ScopedMathMode m(MathMode::kFp32);
        linear_forward(cpu(1), X.data(), W.data(), with_bias ? bias.data() : nullptr, Yf.data(), B,
                       in, out, relu);
      }
      expect_within(Y, want, scale, kBf16Rtol, what);
      EXPECT_EQ(Y, Y2) << what << ": the thread count changed bits";
      expect_mode_changes_result(Y, Yf, scale, what);
    }
  EXPECT_EQ(math_mode(), MathMode::kTf32);
}

TEST(Bf16Linear, CpuBackwardMatchesDoubleLoopsAndKeepsBiasGradientFp32) {
  const int B = 23, in = 19, out = 29;
  const Vec X = random_vec(size_t(B) * in, 20), W = random_vec(size_t(out) * in, 21);
  Vec Y = random_vec(size_t(B) * out, 22);  // a post-ReLU output: about half zeros
  for (float& y : Y) y = std::max(y, 0.0f);
  const Vec G = random_vec(size_t(B) * out, 23);  // dL/dY
  for (bool relu : {false, true})
    for (GradMode gm : {GradMode::kOverwrite, GradMode::kAccumulate}) {
      const bool add = gm == GradMode::kAccumulate;
      const std::string what =
          std::string("relu=") + (relu ? "1" : "0") + " accumulate=" + (add ? "1" : "0");
      const Vec dW0 = random_vec(size_t(out) * in, 24), db0 = random_vec(out, 25);
      // dZ = masked dY (FP32, exact); the GEMMs see BF16(dZ), BF16(W), BF16(X).
      Vec dZ = G;
      if (relu)
        for (size_t k = 0; k < dZ.size(); ++k)
          if (!(Y[k] > 0.0f)) dZ[k] = 0.0f;
      DVec want_dx(size_t(B) * in), scale_dx(size_t(B) * in);
      for (int r = 0; r < B; ++r)
        for (int c = 0; c < in; ++c) {
          double s = 0, mag = 0;
          for (int j = 0; j < out; ++j) {
            const double t = rb(dZ[r * out + j]) * rb(W[j * in + c]);
            s += t;
            mag += std::fabs(t);
          }
          want_dx[r * in + c] = s;
          scale_dx[r * in + c] = mag;
        }
      DVec want_dw(size_t(out) * in), scale_dw(size_t(out) * in);
      for (int j = 0; j < out; ++j)
        for (int c = 0; c < in; ++c) {
          double s = add ? double(dW0[j * in + c]) : 0.0,
                 mag = add ? std::fabs(dW0[j * in + c]) : 0.0;
          for (int r = 0; r < B; ++r) {
            const double t = rb(dZ[r * out + j]) * rb(X[r * in + c]);
            s += t;
            mag += std::fabs(t);
          }
          want_dw[j * in + c] = s;
          scale_dw[j * in + c] = mag;
        }
      DVec want_db(out);
      for (int j = 0; j < out; ++j) {
        double s = add ? double(db0[j]) : 0.0;
        for (int r = 0; r < B; ++r) s += dZ[r * out + j];  // unrounded: not a GEMM
        want_db[j] = s;
      }

      auto run = [&](MathMode mm, int threads, Vec& dY, Vec& dX, Vec& dW, Vec& db) {
        ScopedMathMode m(mm);
        dY = G;
        dX.assign(size_t(B) * in, 9.0f);
        dW = dW0;
        db = db0;
        linear_backward(cpu(threads), X.data(), W.data(), relu ? Y.data() : nullptr, dY.data(),
                        dX.data(), dW.data(), db.data(), B, in, out, relu, gm);
      };
      Vec dY, dX, dW, db, dY2, dX2, dW2, db2, dYf, dXf, dWf, dbf;
      run(MathMode::kBf16, 1, dY, dX, dW, db);
      run(MathMode::kBf16, 2, dY2, dX2, dW2, db2);
      run(MathMode::kFp32, 1, dYf, dXf, dWf, dbf);

      EXPECT_EQ(dY, dZ) << what << ": dY must hold the FP32 masked gradient, not a BF16 copy";
      expect_within(dX, want_dx, scale_dx, kBf16Rtol, what + " dX");
      expect_within(dW, want_dw, scale_dw, kBf16Rtol, what + " dW");
      DVec scale_db(out, 1.0);  // sums in double, rounded once
      expect_within(db, want_db, scale_db, 1e-6, what + " db");
      EXPECT_EQ(db, dbf) << what << ": the bias gradient must not depend on the GEMM mode";
      EXPECT_EQ(dX, dX2) << what << ": the thread count changed dX bits";
      EXPECT_EQ(dW, dW2) << what << ": the thread count changed dW bits";
      EXPECT_EQ(db, db2) << what << ": the thread count changed db bits";
      expect_mode_changes_result(dX, dXf, scale_dx, what + " dX");
      expect_mode_changes_result(dW, dWf, scale_dw, what + " dW");
    }
  EXPECT_EQ(math_mode(), MathMode::kTf32);
}

}  // namespace
}  // namespace ncf
