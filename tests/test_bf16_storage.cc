// --precision bf16 with BF16 storage (model/ops.h "BF16 storage", NeuMF under
// MathMode::kBf16) on the CPU:
//   - on the emulated path (set_cpu_bf16_emulated: BF16 operands widened, FP32
//     products), every BF16-storage op is the FP32 op run on the same values,
//     its BF16 outputs that op's outputs rounded by float_to_bf16_bits: bit for
//     bit, at every block shape of cpu_gemm (rows, columns, K slices);
//   - on the CPU's BF16 instructions, where it has them, each product stays
//     within a bound derived from the roundings against a double loop;
//   - NeuMF on BF16 storage against its per-GEMM BF16 copies of FP32 activations
//     (the unfused top's path, set_fused_top(false)) and the FP32 model, within
//     bounds derived from BF16's unit roundoff, repeating itself bit for bit at any
//     thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "model/cpu_matmul.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "test_util.h"

namespace ncf {
namespace {

using Vec = std::vector<float>;
using Bits = std::vector<uint16_t>;

// BF16's unit roundoff (8 significant bits, nearest-even) and FP32's.
constexpr double kU16 = 1.0 / 256.0;
constexpr double kU32 = 1.0 / 16777216.0;

using test::cpu;

using test::random_vec;

using test::bf16_bits_of;
using test::widen_bf16;

// Sets the math mode and the emulated BF16 path for a scope.
struct Modes {
  Modes(MathMode m, bool emulated) {
    set_math_mode(m);
    set_cpu_bf16_emulated(emulated);
  }
  ~Modes() {
    set_math_mode(MathMode::kTf32);
    set_cpu_bf16_emulated(false);
    set_fused_top(true);
  }
};

void expect_same(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t k = 0; k < got.size(); ++k)
    if (std::memcmp(&got[k], &want[k], sizeof(float)) != 0 && bad++ < 3)
      ADD_FAILURE() << what << " [" << k << "]: " << got[k] << " vs " << want[k];
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ";
}
void expect_same(const Bits& got, const Bits& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != want[k] && bad++ < 3)
      ADD_FAILURE() << what << " [" << k << "]: " << bf16_bits_to_float(got[k]) << " vs "
                    << bf16_bits_to_float(want[k]);
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ";
}

// ---- the ops on the emulated path ---------------------------------------------------

TEST(Bf16Storage, GemmIsTheFp32GemmOfTheSameValuesOnTheEmulatedPath) {
  Modes modes(MathMode::kFp32, true);
  ExecContext ctx = cpu(2);
  // cpu_gemm's block shapes: output rows (M ≥ 2048), output columns (N ≥ 128),
  // K slices (K ≥ 16384), tiles of K slices by 256 columns (both), and one product.
  const int shapes[][3] = {
      {2100, 24, 40}, {30, 200, 50}, {24, 40, 17000}, {6, 270, 16500}, {33, 21, 70}};
  for (const auto& sh : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int M = sh[0], N = sh[1], K = sh[2];
        const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
        const Bits A = bf16_bits_of(random_vec(size_t(ta ? K : M) * lda, 1));
        const Bits B = bf16_bits_of(random_vec(size_t(tb ? N : K) * ldb, 2));
        Vec C(size_t(M) * ldc, 7.0f), want(size_t(M) * ldc, 7.0f);
        gemm_bf16(ctx, ta, tb, M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc);
        const Vec Aw = widen_bf16(A), Bw = widen_bf16(B);
        gemm(ctx, ta, tb, M, N, K, 1.0f, Aw.data(), lda, Bw.data(), ldb, 0.0f, want.data(), ldc);
        expect_same(C, want,
                    "gemm_bf16 M " + std::to_string(M) + " N " + std::to_string(N) + " K " +
                        std::to_string(K) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
      }
}

TEST(Bf16Storage, LayersAreTheFp32LayersOfTheSameValuesRoundedOnTheEmulatedPath) {
  Modes modes(MathMode::kFp32, true);
  ExecContext ctx = cpu(2);
  // B past two kGemmRows blocks (and not a multiple), and past one kReduceBlock.
  const int B = 2600, in = 48, out = 40;
  const Bits X = bf16_bits_of(random_vec(size_t(B) * in, 3));
  const Bits W = bf16_bits_of(random_vec(size_t(out) * in, 4, -0.3f, 0.3f));
  const Bits bias = bf16_bits_of(random_vec(size_t(out), 5, -0.2f, 0.2f));
  const Vec Xw = widen_bf16(X), Ww = widen_bf16(W), biasw = widen_bf16(bias);
  for (bool relu : {true, false}) {
    const std::string tag = relu ? " (ReLU)" : " (no ReLU)";
    Bits Y(size_t(B) * out);
    Vec Yf(size_t(B) * out);
    linear_forward_bf16(ctx, X.data(), W.data(), bias.data(), Y.data(), B, in, out, relu);
    linear_forward(ctx, Xw.data(), Ww.data(), biasw.data(), Yf.data(), B, in, out, relu);
    expect_same(Y, bf16_bits_of(Yf), "linear_forward_bf16" + tag);

    // Backward, from the stored Y (with every kind of special value in its first
    // row: the mask must treat them as the FP32 comparison does) and a BF16
    // upstream gradient.
    const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7F7F, 0x7F80,
                                 0xFF80, 0x7FC0, 0x7F81, 0xFFC0, 0x3F80, 0xBF80};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); ++k) Y[k] = specials[k];
    const Bits dY0 = bf16_bits_of(random_vec(size_t(B) * out, 6));
    Bits dY = dY0, dX(size_t(B) * in);
    Vec dW(size_t(out) * in), db(static_cast<size_t>(out));
    linear_backward_bf16(ctx, X.data(), W.data(), Y.data(), dY.data(), dX.data(), dW.data(),
                         db.data(), B, in, out, relu);
    Vec dYf = widen_bf16(dY0), dXf(size_t(B) * in), dWf(size_t(out) * in),
        dbf(static_cast<size_t>(out));
    const Vec Yw = widen_bf16(Y);
    linear_backward(ctx, Xw.data(), Ww.data(), Yw.data(), dYf.data(), dXf.data(), dWf.data(),
                    dbf.data(), B, in, out, relu, GradMode::kOverwrite);
    expect_same(widen_bf16(dY), dYf, "linear_backward_bf16 masked dY" + tag);
    expect_same(dX, bf16_bits_of(dXf), "linear_backward_bf16 dX" + tag);
    expect_same(dW, dWf, "linear_backward_bf16 dweight" + tag);
    expect_same(db, dbf, "linear_backward_bf16 db" + tag);
  }
  if (HasFailure()) return;
  // The mask really masks: some of dY's elements were zeroed under ReLU.
  Bits Y(size_t(B) * out), dY = bf16_bits_of(random_vec(size_t(B) * out, 6));
  linear_forward_bf16(ctx, X.data(), W.data(), bias.data(), Y.data(), B, in, out, true);
  Bits dX(size_t(B) * in);
  Vec dW(size_t(out) * in);
  linear_backward_bf16(ctx, X.data(), W.data(), Y.data(), dY.data(), dX.data(), dW.data(), nullptr,
                       B, in, out, true);
  size_t zeros = 0, dead = 0;
  for (size_t k = 0; k < Y.size(); ++k) {
    dead += bf16_bits_to_float(Y[k]) <= 0.0f;
    zeros += dY[k] == 0 && bf16_bits_to_float(Y[k]) <= 0.0f;
  }
  EXPECT_GT(dead, Y.size() / 10);
  EXPECT_EQ(zeros, dead);
}

TEST(Bf16Storage, GroupOpsAreTheFp32OpsOfTheSameValuesRoundedOnTheEmulatedPath) {
  Modes modes(MathMode::kFp32, true);
  ExecContext ctx = cpu(2);
  const int n = 530, S = 5, in = 24, out = 36, ldx = 30, ldw = 50, B = n * S;
  const Bits X = bf16_bits_of(random_vec(size_t(B) * ldx, 8));
  const Bits W = bf16_bits_of(random_vec(size_t(out) * ldw, 9, -0.4f, 0.4f));
  const Vec Yg = random_vec(size_t(n) * out, 10, -0.5f, 0.5f);
  const Vec bias = random_vec(size_t(out), 11, -0.2f, 0.2f);
  Bits Y(size_t(B) * out);
  Vec Yf(size_t(B) * out);
  group_linear_forward_bf16(ctx, X.data(), ldx, W.data(), ldw, Yg.data(), bias.data(), Y.data(), n,
                            S, in, out, true);
  const Vec Xw = widen_bf16(X), Ww = widen_bf16(W);
  group_linear_forward(ctx, Xw.data(), ldx, Ww.data(), ldw, Yg.data(), bias.data(), Yf.data(), n, S,
                       in, out, true);
  expect_same(Y, bf16_bits_of(Yf), "group_linear_forward_bf16");

  const Bits dY0 = bf16_bits_of(random_vec(size_t(B) * out, 12));
  for (bool relu : {true, false}) {
    Bits dY = dY0;
    const int lddyg = out + 3;
    Vec dYg(size_t(n) * lddyg, 9.0f), db(static_cast<size_t>(out)), dYgf(size_t(n) * lddyg, 9.0f),
        dbf(static_cast<size_t>(out));
    group_sum_backward_bf16(ctx, Y.data(), dY.data(), n, S, out, dYg.data(), lddyg, db.data(),
                            relu);
    Vec dYf = widen_bf16(dY0);
    const Vec Yw = widen_bf16(Y);
    group_sum_backward(ctx, Yw.data(), dYf.data(), n, S, out, dYgf.data(), lddyg, dbf.data(), relu);
    const std::string tag = relu ? " (ReLU)" : " (no ReLU)";
    expect_same(widen_bf16(dY), dYf, "group_sum_backward_bf16 dY" + tag);
    expect_same(dYg, dYgf, "group_sum_backward_bf16 dYg" + tag);
    expect_same(db, dbf, "group_sum_backward_bf16 db" + tag);
  }
}

// Layer 0's ReLU bit mask: group_linear_forward(_bf16) writes bit j % 32 of word
// b·words + j / 32 for the stored Y[b, j] > 0 (words = 4 per 128 columns: 8 for 130, the
// padding bits 0), checked element by element; group_sum_backward(_bf16) masking by
// those bits (Y null) gives the bits of masking by Y.
TEST(Bf16Storage, Layer0BitMaskIsTheStoredOutputsSignAndMasksAsYDoes) {
  EXPECT_EQ(relu_mask_words(1), 4);
  EXPECT_EQ(relu_mask_words(128), 4);
  EXPECT_EQ(relu_mask_words(130), 8);
  EXPECT_EQ(relu_mask_words(256), 8);
  uint32_t seed = 70;
  const int64_t n = 37;
  const int S = 3, in = 24;
  for (int out : {5, 32, 130, 256})
    for (int threads : {1, 3}) {
      const std::string what =
          "out " + std::to_string(out) + ", threads " + std::to_string(threads);
      const ExecContext ctx = cpu(threads);
      const int64_t B = n * S, words = relu_mask_words(out);
      const Vec X = random_vec(size_t(B) * in, ++seed), W = random_vec(size_t(out) * in, ++seed),
                Yg = random_vec(size_t(n) * out, ++seed), bias = random_vec(size_t(out), ++seed);
      auto check_bits = [&](auto get_positive, const std::vector<uint32_t>& mask,
                            const std::string& tag) {
        size_t bad = 0;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j < words * 32; ++j) {
            const bool bit = (mask[size_t(b * words + j / 32)] >> (j % 32)) & 1u;
            const bool want = j < out && get_positive(b, int(j));
            if (bit != want && bad++ < 3)
              ADD_FAILURE() << tag << " row " << b << " bit " << j << ": " << bit;
          }
        EXPECT_EQ(bad, 0u) << tag;
      };
      const Vec dY0 = random_vec(size_t(B) * out, ++seed);
      {  // FP32
        Vec Y(size_t(B) * out);
        std::vector<uint32_t> mask(size_t(B * words), 0xdeadbeefu);
        group_linear_forward(ctx, X.data(), in, W.data(), in, Yg.data(), bias.data(), Y.data(), n,
                             S, in, out, true, mask.data());
        size_t zeros = 0;
        for (float y : Y) zeros += y == 0.0f;
        EXPECT_GT(zeros, 0u) << what;  // the ReLU cut some, so the mask has both values
        check_bits([&](int64_t b, int j) { return Y[size_t(b * out + j)] > 0.0f; }, mask,
                   what + " FP32");
        Vec by_y = dY0, by_bits = dY0, g1(size_t(n) * out), g2(size_t(n) * out);
        Vec db1(static_cast<size_t>(out)), db2(static_cast<size_t>(out));
        group_sum_backward(ctx, Y.data(), by_y.data(), n, S, out, g1.data(), out, db1.data(), true);
        group_sum_backward(ctx, nullptr, by_bits.data(), n, S, out, g2.data(), out, db2.data(),
                           true, mask.data());
        expect_same(by_bits, by_y, what + " FP32 dZ");
        expect_same(g2, g1, what + " FP32 dYg");
        expect_same(db2, db1, what + " FP32 db");
      }
      {  // BF16 storage
        const Bits Xb = bf16_bits_of(X), Wb = bf16_bits_of(W), dYb = bf16_bits_of(dY0);
        Bits Y(size_t(B) * out);
        std::vector<uint32_t> mask(size_t(B * words), 0xdeadbeefu);
        group_linear_forward_bf16(ctx, Xb.data(), in, Wb.data(), in, Yg.data(), bias.data(),
                                  Y.data(), n, S, in, out, true, mask.data());
        check_bits([&](int64_t b, int j) { return bf16_bits_to_float(Y[size_t(b * out + j)]) > 0; },
                   mask, what + " BF16");
        Bits by_y = dYb, by_bits = dYb;
        Vec g1(size_t(n) * out), g2(size_t(n) * out);
        Vec db1(static_cast<size_t>(out)), db2(static_cast<size_t>(out));
        group_sum_backward_bf16(ctx, Y.data(), by_y.data(), n, S, out, g1.data(), out, db1.data(),
                                true);
        group_sum_backward_bf16(ctx, nullptr, by_bits.data(), n, S, out, g2.data(), out, db2.data(),
                                true, mask.data());
        expect_same(by_bits, by_y, what + " BF16 dZ");
        expect_same(g2, g1, what + " BF16 dYg");
        expect_same(db2, db1, what + " BF16 db");
      }
    }
  // A mask without the ReLU is refused.
  const ExecContext ctx = cpu(1);
  Vec X(8), W(4), Yg(4), Y(8), dY(8), g(4);
  uint32_t mask[8] = {};
  EXPECT_THROW(group_linear_forward(ctx, X.data(), 2, W.data(), 2, Yg.data(), nullptr, Y.data(), 2,
                                    2, 2, 2, false, mask),
               Error);
  EXPECT_THROW(
      group_sum_backward(ctx, nullptr, dY.data(), 2, 2, 2, g.data(), 2, nullptr, false, mask),
      Error);
}

TEST(Bf16Storage, TopIsTheFp32TopOfTheSameValuesWithDaRounded) {
  Modes modes(MathMode::kFp32, true);
  ExecContext ctx = cpu(2);
  const int n = 300, S = 5, mf = 16, last = 24, D = 40, B = n * S;
  const Vec U = random_vec(size_t(n) * D, 13), I = random_vec(size_t(B) * D, 14);
  const Bits A = bf16_bits_of(random_vec(size_t(B) * last, 15, -0.5f, 1.0f));
  const Vec Aw = widen_bf16(A);
  const Vec w = random_vec(size_t(mf + last), 16), c = {0.25f};
  Vec labels = random_vec(size_t(B), 17, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  Vec logits(static_cast<size_t>(B)), logitsf(static_cast<size_t>(B));
  neumf_top_forward_bf16(ctx, U.data(), D, I.data(), D, A.data(), w.data(), c.data(), logits.data(),
                         n, S, mf, last);
  neumf_top_forward(ctx, U.data(), D, I.data(), D, Aw.data(), w.data(), c.data(), logitsf.data(), n,
                    S, mf, last);
  expect_same(logits, logitsf, "neumf_top_forward_bf16 logits");

  const int64_t global_batch = B + 7;
  double loss = 0, lossf = 0;
  Bits dA(size_t(B) * last);
  Vec dAf(size_t(B) * last), dU(size_t(n) * D, 3.0f), dI(size_t(B) * D, 3.0f),
      dUf(size_t(n) * D, 3.0f), dIf(size_t(B) * D, 3.0f), dw(size_t(mf + last)),
      dwf(size_t(mf + last)), dc(1), dcf(1), db(static_cast<size_t>(last)),
      dbf(static_cast<size_t>(last));
  neumf_top_backward_bf16(ctx, U.data(), D, I.data(), D, A.data(), w.data(), nullptr, logits.data(),
                          labels.data(), global_batch, &loss, dA.data(), dU.data(), D, dI.data(), D,
                          dw.data(), dc.data(), db.data(), n, S, mf, last, true);
  neumf_top_backward(ctx, U.data(), D, I.data(), D, Aw.data(), w.data(), nullptr, logitsf.data(),
                     labels.data(), global_batch, &lossf, dAf.data(), dUf.data(), D, dIf.data(), D,
                     dwf.data(), dcf.data(), dbf.data(), n, S, mf, last, true);
  expect_same(dA, bf16_bits_of(dAf), "neumf_top_backward_bf16 dA");
  expect_same(dU, dUf, "neumf_top_backward_bf16 d_user_rows");
  expect_same(dI, dIf, "neumf_top_backward_bf16 d_item_rows");
  expect_same(dw, dwf, "neumf_top_backward_bf16 dw");
  expect_same(dc, dcf, "neumf_top_backward_bf16 dc");
  EXPECT_EQ(std::memcmp(&loss, &lossf, sizeof(double)), 0) << loss << " vs " << lossf;
  // db sums the stored (rounded) dA: against a double loop over it.
  const Vec dAw = widen_bf16(dA);
  for (int k = 0; k < last; ++k) {
    double want = 0, scale = 0;
    for (int b = 0; b < B; ++b) {
      want += dAw[size_t(b) * last + k];
      scale += std::fabs(dAw[size_t(b) * last + k]);
    }
    EXPECT_NEAR(db[size_t(k)], want, 1e-12 * scale + kU32 * std::fabs(want)) << "db[" << k << "]";
  }
}

// ---- the BF16 instructions ------------------------------------------------------------

// On the CPU's own BF16 instructions (AMX, AVX512-BF16) the products accumulate
// in FP32 in another order. Against a double loop over the same BF16 values, a
// product element z = Σ_k a_k·b_k (terms exact in FP32) stored in FP32 is off by
// at most γ_K·Σ|a_k·b_k| (γ_K ≈ K·2^-24, any summation order), and stored in
// BF16 by at most that plus half an ulp of the result, 2^-8·|z|.
TEST(Bf16Storage, NativeProductsStayWithinTheirRoundingOfADoubleLoop) {
  if (!cpu_bf16_native()) GTEST_SKIP() << "no BF16 instructions: " << cpu_matmul_description();
  Modes modes(MathMode::kBf16, false);
  ExecContext ctx = cpu(2);
  const int B = 2100, in = 64, out = 48;
  const Bits X = bf16_bits_of(random_vec(size_t(B) * in, 18));
  const Bits W = bf16_bits_of(random_vec(size_t(out) * in, 19, -0.3f, 0.3f));
  const Bits bias16 = bf16_bits_of(random_vec(size_t(out), 20, -0.2f, 0.2f));
  const Vec Xw = widen_bf16(X), Ww = widen_bf16(W), bias = widen_bf16(bias16);
  Bits Y(size_t(B) * out);
  linear_forward_bf16(ctx, X.data(), W.data(), bias16.data(), Y.data(), B, in, out, false);
  Vec C(size_t(B) * out);
  gemm_bf16(ctx, false, true, B, out, in, X.data(), in, W.data(), in, C.data(), out);
  size_t bad = 0;
  for (int r = 0; r < B; ++r)
    for (int j = 0; j < out; ++j) {
      double z = 0, terms = 0;
      for (int k = 0; k < in; ++k) {
        const double t = double(Xw[size_t(r) * in + k]) * Ww[size_t(j) * in + k];
        z += t;
        terms += std::fabs(t);
      }
      const double gamma = (in + 2) * kU32 * (terms + std::fabs(bias[size_t(j)]));
      const double y = bf16_bits_to_float(Y[size_t(r) * out + j]), c = C[size_t(r) * out + j];
      const double zb = z + bias[size_t(j)];
      if (!(std::fabs(c - z) <= gamma) && bad++ < 3)
        ADD_FAILURE() << "gemm_bf16 [" << r << "," << j << "]: " << c << " vs " << z;
      if (!(std::fabs(y - zb) <= gamma + kU16 * (std::fabs(zb) + gamma)) && bad++ < 3)
        ADD_FAILURE() << "linear_forward_bf16 [" << r << "," << j << "]: " << y << " vs " << zb;
    }
  EXPECT_EQ(bad, 0u);
}

// ---- NeuMF ------------------------------------------------------------------------------

struct StepOut {
  Vec logits, grads, dU, dI;
  double loss = 0;
};

StepOut neumf_step(NeuMF& model, const ExecContext& ctx, const Vec& U, const Vec& I,
                   const Vec& labels, int n, int S) {
  const int B = n * S, D = model.config().embedding_width();
  StepOut o;
  o.logits.assign(size_t(B), 0.0f);
  o.dU.assign(size_t(n) * D, 0.0f);
  o.dI.assign(size_t(B) * D, 0.0f);
  Vec dlogits(static_cast<size_t>(B));
  model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), B, o.logits.data(),
                         dlogits.data(), &o.loss, o.dU.data(), o.dI.data());
  o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
  return o;
}

using test::relative_rms;

// NeuMF on BF16 storage against its per-GEMM copies (FP32 activations and
// gradients, rounded to BF16 per GEMM: the path of the unfused top, which a model
// wider than the fused top takes, forced by set_fused_top(false)) and against the
// FP32 model, from the same parameters, rows and labels. Both BF16 paths feed their
// products the same kind of operands (BF16 roundings of the same quantities); BF16
// storage adds roundings where the per-GEMM path keeps FP32 outside the products: the top's
// input A, its gradient dA, each tower layer's dX before its mask and sums, and
// the bias of each layer above layer 0, added as BF16 (linear_forward_bf16).
// Each adds at most u = 2^-8 relative error per element, so every tensor stays
// within (2L + 1)·u in relative RMS of the per-GEMM path's (L tower layers), and
// its distance from FP32 within the per-GEMM path's plus that. (The distance
// from FP32 itself is no fixed multiple of u: the gradients are sums with
// cancellation, which amplifies the operands' roundings in both BF16 paths.)
TEST(Bf16Storage, NeuMFTracksThePerGemmCopiesAndFp32AndRepeatsItselfAtAnyThreadCount) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int n = 700, S = 5, B = n * S, D = cfg.embedding_width();
  NeuMF model(cfg, Device::kCpu);
  test::init_with_biases(model, 5, 6, 0.1f);
  const Vec U = random_vec(size_t(n) * D, 21, -0.5f, 0.5f);
  const Vec I = random_vec(size_t(B) * D, 22, -0.5f, 0.5f);
  Vec labels = random_vec(size_t(B), 23, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;

  Modes modes(MathMode::kFp32, false);
  const StepOut fp = neumf_step(model, cpu(2), U, I, labels, n, S);
  set_math_mode(MathMode::kBf16);
  const StepOut bf = neumf_step(model, cpu(2), U, I, labels, n, S);
  set_fused_top(false);
  const StepOut copies = neumf_step(model, cpu(2), U, I, labels, n, S);
  set_fused_top(true);
  const double bound = (2.0 * double(model.tower().size()) + 1.0) * kU16;
  auto check = [&](size_t offset, size_t count, const Vec StepOut::*field,
                   const std::string& what) {
    const float* s = (bf.*field).data() + offset;
    const float* l = (copies.*field).data() + offset;
    const float* f = (fp.*field).data() + offset;
    const double sl = relative_rms(s, l, count), sf = relative_rms(s, f, count),
                 lf = relative_rms(l, f, count);
    EXPECT_LE(sl, bound) << what << ": storage vs per-GEMM copies, relative RMS " << sl << " past "
                         << bound;
    EXPECT_LE(sf, lf + bound) << what << ": storage vs FP32 " << sf << ", copies vs FP32 " << lf;
    EXPECT_GT(sf, 0.0) << what << ": the BF16 run gave the FP32 values";
  };
  check(0, size_t(B), &StepOut::logits, "logits");
  for (const DenseLayerView& v : model.tower()) {
    const std::string l = "layer " + std::to_string(v.in) + "->" + std::to_string(v.out);
    check(size_t(v.w_offset), size_t(v.in) * v.out, &StepOut::grads, l + " dW");
    check(size_t(v.b_offset), size_t(v.out), &StepOut::grads, l + " db");
  }
  check(size_t(model.head_w_offset()), size_t(cfg.head_width()), &StepOut::grads, "head dw");
  check(0, bf.dU.size(), &StepOut::dU, "d_user_rows");
  check(0, bf.dI.size(), &StepOut::dI, "d_item_rows");
  EXPECT_NEAR(bf.loss, fp.loss, bound * fp.loss);

  // The same bits again, and at 1 and 3 threads.
  for (int threads : {2, 1, 3}) {
    const StepOut again = neumf_step(model, cpu(threads), U, I, labels, n, S);
    const std::string t = " at " + std::to_string(threads) + " threads";
    expect_same(again.logits, bf.logits, "logits" + t);
    expect_same(again.grads, bf.grads, "dense grads" + t);
    expect_same(again.dU, bf.dU, "d_user_rows" + t);
    expect_same(again.dI, bf.dI, "d_item_rows" + t);
  }
}

// A rank without rows on BF16 storage: zero gradients, the loss left alone.
TEST(Bf16Storage, EmptyBatchGivesZeroGradients) {
  NeuMFConfig cfg;
  cfg.mf_dim = 4;
  cfg.layers = {8, 8, 4};
  NeuMF model(cfg, Device::kCpu);
  model.init(3);
  for (int64_t k = 0; k < model.num_params(); ++k) model.grads().data()[k] = 1.0f;
  Modes modes(MathMode::kBf16, false);
  Vec none;
  StepOut o = neumf_step(model, cpu(2), none, none, none, 0, 5);
  for (float g : o.grads) ASSERT_EQ(g, 0.0f);
}

}  // namespace
}  // namespace ncf
