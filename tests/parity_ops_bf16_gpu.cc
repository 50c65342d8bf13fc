// GPU parity of the dense ops in BF16: MathMode::kBf16's GEMMs and Linear layers, and the
// *_bf16 ops on BF16 storage (layer 0's bit mask, the masked dX, the top on BF16 storage).
#include "parity_gpu.h"

namespace ncf {
namespace {

// ---- MathMode::kBf16 ----------------------------------------------------------------

double rb(float x) { return double(round_to_bf16(x)); }

// |gpu − cpu| ≤ kBf16TermsRtol·S element-wise, S = Σ|products| (+ what else
// enters the element: |beta·C|, |bias|, the accumulated gradient). NaN must
// meet NaN.
void expect_close_to_terms(const Vec& gpu, const Vec& cpu, const std::vector<double>& terms,
                           const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_EQ(terms.size(), cpu.size()) << what;
  int reported = 0;
  size_t bad = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    const double g = gpu[k], c = cpu[k], tol = 1e-30 + kBf16TermsRtol * terms[k];
    const bool ok = std::isnan(c) ? std::isnan(g) : std::fabs(g - c) <= tol;
    if (!ok) {
      ++bad;
      if (reported++ < 5)
        ADD_FAILURE() << what << " [" << k << "]: gpu " << g << ", cpu " << c << " (|diff| "
                      << std::fabs(g - c) << " > " << tol << ")";
    }
  }
  if (bad > 5) ADD_FAILURE() << what << ": " << bad << " elements out of tolerance in all";
}

void gemm_bf16_case(const ExecContext& cpu, const ExecContext& gpu, std::mt19937& gen, bool ta,
                    bool tb, int M, int N, int K, float beta) {
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
  const int a_rows = ta ? K : M, b_rows = tb ? N : K;
  const float alpha = 1.5f;
  Vec A = random_vec(size_t(a_rows) * lda, gen), Bm = random_vec(size_t(b_rows) * ldb, gen);
  Vec C = random_vec(size_t(M) * ldc, gen);
  if (beta == 0.0f) std::fill(C.begin(), C.end(), std::numeric_limits<float>::quiet_NaN());
  std::vector<double> terms(C.size(), 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = beta == 0.0f ? 0.0 : std::fabs(double(beta) * C[size_t(i) * ldc + j]);
      for (int k = 0; k < K; ++k)
        s += std::fabs(alpha * rb(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]) *
                       rb(tb ? Bm[size_t(j) * ldb + k] : Bm[size_t(k) * ldb + j]));
      terms[size_t(i) * ldc + j] = s;
    }
  Buffer<float> gA = up(A), gB = up(Bm), gC = up(C);
  gemm(cpu, ta, tb, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
  gemm(gpu, ta, tb, M, N, K, alpha, gA.data(), lda, gB.data(), ldb, beta, gC.data(), ldc);
  const std::string what = shape({{"ta", ta}, {"tb", tb}, {"M", M}, {"N", N}, {"K", K}}) +
                           "beta=" + std::to_string(beta);
  expect_close_to_terms(down(gC), C, terms, what);
  // FP32 masters: the operands on the device are not rounded in place.
  expect_same(down(gA), A, what + " A after");
  expect_same(down(gB), Bm, what + " B after");
}

TEST_F(Parity, GemmBf16AllTransposes) {
  set_math_mode(MathMode::kBf16);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : kGemmShapes)
        for (float beta : {0.0f, 0.5f})
          gemm_bf16_case(cpu_, gpu_, gen_, ta, tb, s[0], s[1], s[2], beta);
}

// K = 1, alpha = 1, beta = 0: C[i, j] = BF16(a_i)·BF16(b_j), one exact product,
// no sum — so the devices must agree bit for bit, and the columns where b_j is
// ±1 or 2 (BF16 values) read back the GPU's rounding of every a_i. The a_i are
// built on rounding ties and their neighbours, where a conversion that
// truncates, or rounds ties away from zero, would differ.
TEST_F(Parity, GemmBf16RoundsLikeTheCpuBitForBit) {
  set_math_mode(MathMode::kBf16);
  const int M = 4096, N = 8;
  std::uniform_int_distribution<uint32_t> high(0x3C00u, 0x40FFu);  // |a| in [2^-7, 8)
  const uint32_t lows[] = {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x1234u, 0xC000u, 0x4000u};
  Vec A(M);
  for (int i = 0; i < M; ++i) {
    const uint32_t bits = (high(gen_) << 16) | lows[i % 8] | (i % 16 < 8 ? 0u : 0x80000000u);
    std::memcpy(&A[i], &bits, sizeof(float));
  }
  Vec Bm = random_vec(N, gen_, 0.5f, 1.5f);
  Bm[0] = 1.0f;
  Bm[1] = -1.0f;
  Bm[2] = 2.0f;
  Vec C(size_t(M) * N, std::numeric_limits<float>::quiet_NaN());
  Buffer<float> gA = up(A), gB = up(Bm), gC = up(C);
  gemm(cpu_, false, false, M, N, 1, 1.0f, A.data(), 1, Bm.data(), N, 0.0f, C.data(), N);
  gemm(gpu_, false, false, M, N, 1, 1.0f, gA.data(), 1, gB.data(), N, 0.0f, gC.data(), N);
  const Vec g = down(gC);
  expect_same(g, C, "K=1 products");
  for (int i = 0; i < M; ++i)
    ASSERT_EQ(g[size_t(i) * N], round_to_bf16(A[i])) << "row " << i << " (a = " << A[i] << ")";
}

// weights and bias at float offset `offset` of a flat buffer (offset 1: the bias is
// not 16-byte aligned, so the unfused GEMM + epilogue path runs; offset 0 with
// a bias: the cuBLASLt BIAS / RELU_BIAS epilogue on BF16 inputs).
TEST_F(Parity, LinearForwardBf16) {
  set_math_mode(MathMode::kBf16);
  for (const auto& s : kLayerShapes)
    for (int64_t B : kBatches)
      for (int offset : {0, 1})
        for (bool with_bias : {false, true})
          for (bool relu : {false, true}) {
            const int in = s[0], out = s[1];
            Vec X = random_vec(size_t(B) * in, gen_);
            Vec P = random_vec(size_t(offset) + size_t(out) * in + out, gen_);
            Vec Y(size_t(B) * out, 7.0f);
            Buffer<float> gX = up(X), gP = up(P), gY = up(Y);
            const float* weights = P.data() + offset;
            const float* bias = with_bias ? weights + size_t(out) * in : nullptr;
            const float* gweights = gP.data() + offset;
            const float* gbias = with_bias ? gweights + size_t(out) * in : nullptr;
            std::vector<double> terms(Y.size());
            for (int64_t b = 0; b < B; ++b)
              for (int j = 0; j < out; ++j) {
                double sum = bias ? std::fabs(bias[j]) : 0.0;
                for (int k = 0; k < in; ++k)
                  sum += std::fabs(rb(X[size_t(b) * in + k]) * rb(weights[size_t(j) * in + k]));
                terms[size_t(b) * out + j] = sum;
              }
            linear_forward(cpu_, X.data(), weights, bias, Y.data(), B, in, out, relu);
            linear_forward(gpu_, gX.data(), gweights, gbias, gY.data(), B, in, out, relu);
            const std::string what = shape({{"B", B},
                                            {"in", in},
                                            {"out", out},
                                            {"offset", offset},
                                            {"bias", with_bias},
                                            {"relu", relu}});
            expect_close_to_terms(down(gY), Y, terms, what);
            expect_same(down(gX), X, what + " X after");
            expect_same(down(gP), P, what + " weights, bias after");
          }
}

TEST_F(Parity, LinearBackwardBf16) {
  set_math_mode(MathMode::kBf16);
  for (const auto& s : kLayerShapes)
    for (int64_t B : kBatches)
      for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate})
        for (int variant = 0; variant < 4; ++variant) {
          // 0: relu, dX and db; 1: no relu (Y null); 2: relu, no db (mask kernel); 3: relu, no dX.
          const bool relu = variant != 1, with_db = variant != 2, with_dx = variant != 3;
          const bool add = mode == GradMode::kAccumulate;
          const int in = s[0], out = s[1];
          const std::string what = shape(
              {{"B", B}, {"in", in}, {"out", out}, {"variant", variant}, {"accumulate", add}});
          Vec X = random_vec(size_t(B) * in, gen_), weights = random_vec(size_t(out) * in, gen_);
          Vec Y = random_vec(size_t(B) * out, gen_);  // a post-ReLU output: about half zeros
          for (float& y : Y) y = std::max(y, 0.0f);
          Vec dY = random_vec(size_t(B) * out, gen_), dX(size_t(B) * in, 9.0f);
          Vec dweights = random_vec(size_t(out) * in, gen_), db = random_vec(out, gen_);
          // Σ|terms| from the masked dZ that both devices will see.
          Vec dZ = dY;
          if (relu)
            for (size_t k = 0; k < dZ.size(); ++k)
              if (!(Y[k] > 0.0f)) dZ[k] = 0.0f;
          std::vector<double> terms_dx(dX.size(), 0.0), terms_dw(dweights.size(), 0.0);
          for (int64_t b = 0; b < B; ++b)
            for (int c = 0; c < in; ++c)
              for (int j = 0; j < out; ++j)
                terms_dx[size_t(b) * in + c] +=
                    std::fabs(rb(dZ[size_t(b) * out + j]) * rb(weights[size_t(j) * in + c]));
          for (int j = 0; j < out; ++j)
            for (int c = 0; c < in; ++c) {
              double sum = add ? std::fabs(dweights[size_t(j) * in + c]) : 0.0;
              for (int64_t b = 0; b < B; ++b)
                sum += std::fabs(rb(dZ[size_t(b) * out + j]) * rb(X[size_t(b) * in + c]));
              terms_dw[size_t(j) * in + c] = sum;
            }
          Buffer<float> gX = up(X), gweights = up(weights), gY = up(Y), gdY = up(dY), gdX = up(dX),
                        gdweights = up(dweights), gdb = up(db);
          linear_backward(cpu_, X.data(), weights.data(), relu ? Y.data() : nullptr, dY.data(),
                          with_dx ? dX.data() : nullptr, dweights.data(),
                          with_db ? db.data() : nullptr, B, in, out, relu, mode);
          linear_backward(gpu_, gX.data(), gweights.data(), relu ? gY.data() : nullptr, gdY.data(),
                          with_dx ? gdX.data() : nullptr, gdweights.data(),
                          with_db ? gdb.data() : nullptr, B, in, out, relu, mode);
          expect_same(down(gdY), dY, what + "dZ (masked dY, FP32)");
          if (with_dx)
            expect_close_to_terms(down(gdX), dX, terms_dx, what + "dX");
          else
            expect_same(down(gdX), dX, what + "dX untouched");
          expect_close_to_terms(down(gdweights), dweights, terms_dw, what + "dweights");
          // The bias gradient is a column sum of the FP32 dZ, not a GEMM.
          expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol, what + "db");
          expect_same(down(gX), X, what + "X after");
          expect_same(down(gweights), weights, what + "weights after");
        }
}

// ---- BF16 storage (the *_bf16 ops of ops.h) --------------------------------------------
// The ops on BF16 arrays against their CPU twins on the same BF16 inputs. A product
// differs by its FP32 summation order only (kBf16TermsRtol·Σ|terms|, as the BF16
// GEMMs above); a BF16 output is that product rounded once by the same function, so
// the two roundings differ by at most one BF16 ulp (≤ 2^-7·|value|) when the FP32
// values straddle a rounding boundary. Masks and per-group sums read identical
// values in the same order: the same bits. The top on BF16 storage is the FP32 top
// of the same values on the device, dA rounded: the same bits, except db, which sums
// the rounded dA (a double sum of other values).

// BF16 outputs: |gpu − cpu| ≤ kBf16TermsRtol·terms + 2^-7·|cpu|.
void expect_bf16_close(const Bits& gpu, const Bits& cpu, const std::vector<double>& terms,
                       const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_EQ(terms.size(), cpu.size()) << what;
  size_t bad = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    const double g = bf16_bits_to_float(gpu[k]), c = bf16_bits_to_float(cpu[k]);
    const double tol = 1e-30 + kBf16TermsRtol * terms[k] + std::ldexp(std::fabs(c), -7);
    if (!(std::fabs(g - c) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << " [" << k << "]: gpu " << g << ", cpu " << c;
  }
  EXPECT_EQ(bad, 0u) << what;
}

// Σ_k |op(A)[i, k]·op(B)[k, j]| (+ |extra[j]|) of a row-major product of BF16 values.
std::vector<double> product_terms(const Vec& A, int lda, bool ta, const Vec& B, int ldb, bool tb,
                                  int M, int N, int K, int ldc, const Vec* extra = nullptr) {
  std::vector<double> t(size_t(M) * ldc, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = extra ? std::fabs((*extra)[size_t(j)]) : 0.0;
      for (int k = 0; k < K; ++k)
        s += std::fabs(double(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]) *
                       (tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]));
      t[size_t(i) * ldc + j] = s;
    }
  return t;
}

TEST_F(Parity, Bf16StorageOpsTrackTheCpuTwins) {
  set_math_mode(MathMode::kBf16);
  // to_bf16_rows: bits, with strides on both sides (one element per thread, and
  // four: the items' MLP columns of the step's shape).
  for (const auto& [w, ldx, ldy] : {std::tuple<int, int, int>{37, 50, 40}, {128, 192, 132}}) {
    const int64_t B = 1000;
    Vec X = random_vec(size_t(B) * ldx, gen_);
    Bits Y(size_t(B) * ldy, 7), gY0 = Y;
    Buffer<float> gX = up(X);
    Buffer<uint16_t> gY = up(gY0);
    to_bf16_rows(cpu_, X.data(), ldx, w, Y.data(), ldy, B);
    to_bf16_rows(gpu_, gX.data(), ldx, w, gY.data(), ldy, B);
    expect_same(down(gY), Y, "to_bf16_rows w=" + std::to_string(w) + " (padding untouched)");
  }
  // gemm_bf16, every transpose.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int M = 70, N = 45, K = 300, lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2,
                ldc = N + 1;
      const Bits A = bf16_bits_of(random_vec(size_t(ta ? K : M) * lda, gen_));
      const Bits Bm = bf16_bits_of(random_vec(size_t(tb ? N : K) * ldb, gen_));
      Vec C(size_t(M) * ldc, 3.0f);
      Buffer<uint16_t> gA = up(A), gB = up(Bm);
      Buffer<float> gC = up(C);
      gemm_bf16(cpu_, ta, tb, M, N, K, A.data(), lda, Bm.data(), ldb, C.data(), ldc);
      gemm_bf16(gpu_, ta, tb, M, N, K, gA.data(), lda, gB.data(), ldb, gC.data(), ldc);
      auto terms =
          product_terms(widen_bf16(A), lda, ta, widen_bf16(Bm), ldb, tb, M, N, K, ldc, nullptr);
      for (int i = 0; i < M; ++i)  // the padding: 3.0 on both
        for (int j = N; j < ldc; ++j) terms[size_t(i) * ldc + j] = 0.0;
      expect_close_to_terms(down(gC), C, terms, "gemm_bf16 " + shape({{"ta", ta}, {"tb", tb}}));
    }
  // linear_forward_bf16 and linear_backward_bf16.
  const int64_t B = 3000;
  const int in = 64, out = 48;
  const Bits X = bf16_bits_of(random_vec(size_t(B) * in, gen_));
  const Bits W = bf16_bits_of(random_vec(size_t(out) * in, gen_, -0.3f, 0.3f));
  const Bits bias = bf16_bits_of(random_vec(size_t(out), gen_, -0.2f, 0.2f));
  const Vec Xw = widen_bf16(X), Ww = widen_bf16(W), biasw = widen_bf16(bias);
  Buffer<uint16_t> gX = up(X), gW = up(W), gbias = up(bias);
  for (bool relu : {true, false}) {
    const std::string tag = relu ? " (ReLU)" : " (no ReLU)";
    Bits Y(size_t(B) * out);
    Buffer<uint16_t> gY = up(Y);
    // The GPU's is one cuBLASLt matmul with the bias epilogue where the heuristic
    // offers one (bench_lt_probe lists it), else GEMM + epilogue kernel.
    linear_forward_bf16(cpu_, X.data(), W.data(), bias.data(), Y.data(), B, in, out, relu);
    linear_forward_bf16(gpu_, gX.data(), gW.data(), gbias.data(), gY.data(), B, in, out, relu);
    expect_bf16_close(down(gY), Y,
                      product_terms(Xw, in, false, Ww, in, true, int(B), out, in, out, &biasw),
                      "linear_forward_bf16" + tag);
    // Backward from the CPU's Y on both sides.
    const Bits dY0 = bf16_bits_of(random_vec(size_t(B) * out, gen_));
    Bits dY = dY0, dX(size_t(B) * in);
    Vec dW(size_t(out) * in), db(static_cast<size_t>(out));
    Buffer<uint16_t> gYc = up(Y), gdY = up(dY0), gdX = up(dX);
    Buffer<float> gdW = up(dW), gdb = up(db);
    linear_backward_bf16(cpu_, X.data(), W.data(), Y.data(), dY.data(), dX.data(), dW.data(),
                         db.data(), B, in, out, relu);
    linear_backward_bf16(gpu_, gX.data(), gW.data(), gYc.data(), gdY.data(), gdX.data(), gdW.data(),
                         gdb.data(), B, in, out, relu);
    expect_same(down(gdY), dY, "linear_backward_bf16 masked dY" + tag);
    expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol, "linear_backward_bf16 db" + tag);
    const Vec dZw = widen_bf16(dY);
    expect_bf16_close(down(gdX), dX,
                      product_terms(dZw, out, false, Ww, in, false, int(B), in, out, in),
                      "linear_backward_bf16 dX" + tag);
    expect_close_to_terms(down(gdW), dW,
                          product_terms(dZw, out, true, Xw, in, false, out, in, int(B), in),
                          "linear_backward_bf16 dweight" + tag);
  }
  // group_linear_forward_bf16 and group_sum_backward_bf16.
  const int64_t n = 600;
  const int S = 5, gin = 40, ldx = 52, ldw = 90;
  const Bits GX = bf16_bits_of(random_vec(size_t(n * S) * ldx, gen_));
  const Bits GW = bf16_bits_of(random_vec(size_t(out) * ldw, gen_, -0.3f, 0.3f));
  const Vec Yg = random_vec(size_t(n) * out, gen_, -0.5f, 0.5f);
  Bits GY(size_t(n * S) * out);
  Buffer<uint16_t> gGX = up(GX), gGW = up(GW), gGY = up(GY);
  Buffer<float> gYg = up(Yg), gbiasw = up(biasw);  // layer 0's bias stays FP32
  group_linear_forward_bf16(cpu_, GX.data(), ldx, GW.data(), ldw, Yg.data(), biasw.data(),
                            GY.data(), n, S, gin, out, true);
  group_linear_forward_bf16(gpu_, gGX.data(), ldx, gGW.data(), ldw, gYg.data(), gbiasw.data(),
                            gGY.data(), n, S, gin, out, true);
  {
    auto terms = product_terms(widen_bf16(GX), ldx, false, widen_bf16(GW), ldw, true, int(n * S),
                               out, gin, out, &biasw);
    for (int64_t b = 0; b < n * S; ++b)
      for (int j = 0; j < out; ++j)
        terms[size_t(b) * out + j] += std::fabs(Yg[size_t(b / S) * out + j]);
    expect_bf16_close(down(gGY), GY, terms, "group_linear_forward_bf16");
  }
  const Bits GdY0 = bf16_bits_of(random_vec(size_t(n * S) * out, gen_));
  for (bool relu : {true, false}) {
    const std::string tag = relu ? " (ReLU)" : " (no ReLU)";
    Bits GdY = GdY0;
    const int lddyg = out + 5;
    Vec dYg(size_t(n) * lddyg, 2.0f), db(static_cast<size_t>(out));
    Buffer<uint16_t> gGYc = up(GY), gGdY = up(GdY0);
    Buffer<float> gdYg = up(dYg), gdb = up(db);
    group_sum_backward_bf16(cpu_, GY.data(), GdY.data(), n, S, out, dYg.data(), lddyg, db.data(),
                            relu);
    group_sum_backward_bf16(gpu_, gGYc.data(), gGdY.data(), n, S, out, gdYg.data(), lddyg,
                            gdb.data(), relu);
    expect_same(down(gGdY), GdY, "group_sum_backward_bf16 dY" + tag);
    expect_same(down(gdYg), dYg, "group_sum_backward_bf16 dYg" + tag);
    expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol, "group_sum_backward_bf16 db" + tag);
  }
}

// The BF16 ReLU mask (linear_backward_bf16) and group_sum_backward_bf16 take 16-byte
// octets where the width and the arrays allow and single elements elsewhere (and
// for the mask's last B·out % 8): at every width, group size and offset, the CPU
// twin's bits. Y holds zeros, negatives and NaNs, which all mask to 0. With a bias
// gradient the mask runs fused with its column sums, whose db must be the sums'
// bits over the masked dY.
TEST_F(Parity, Bf16MaskAndGroupSumAtEveryWidthAreTheCpuTwinsBitForBit) {
  // Even widths on aligned arrays take the mask and bias sums two columns a thread; n = 300
  // spans several row chunks (kColChunk).
  for (int out : {1, 8, 13, 48, 64})
    for (int S : {1, 5, 9})
      for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{300}})
        for (int offset : {0, 1}) {  // offset 1: no array 16-byte (or 4-byte) aligned
          const std::string what = shape({{"out", out}, {"S", S}, {"n", n}, {"offset", offset}});
          const int64_t B = n * S;
          const size_t len = size_t(B) * out + size_t(offset);
          Bits Y = bf16_bits_of(random_vec(len, gen_, -1.0f, 1.0f));
          for (size_t i = 0; i < len; i += 7) Y[i] = 0;
          for (size_t i = 3; i < len; i += 11) Y[i] = 0x7fc0;  // NaN
          const Bits dY0 = bf16_bits_of(random_vec(len, gen_));
          // The mask through linear_backward_bf16 without dX, alone (no db) and with the
          // bias gradient (the mask and its column sums in one pass). That db is the bits of
          // the column sums alone over the masked dY (relu off), and near the CPU's.
          const int in = 8;
          const Bits X = bf16_bits_of(random_vec(size_t(B) * in, gen_));
          const Bits W = bf16_bits_of(random_vec(size_t(out) * in, gen_));
          Bits dY = dY0;
          Vec dW(size_t(out) * in), db(static_cast<size_t>(out));
          Buffer<uint16_t> gX = up(X), gW = up(W), gY = up(Y), gdY = up(dY0), gdY2 = up(dY0);
          Buffer<float> gdW = up(dW), gdb = up(db), gdb2 = up(db);
          linear_backward_bf16(cpu_, X.data(), W.data(), Y.data() + offset, dY.data() + offset,
                               nullptr, dW.data(), db.data(), B, in, out, true);
          linear_backward_bf16(gpu_, gX.data(), gW.data(), gY.data() + offset, gdY.data() + offset,
                               nullptr, gdW.data(), nullptr, B, in, out, true);
          expect_same(down(gdY), dY, what + " linear_backward_bf16 masked dY");
          linear_backward_bf16(gpu_, gX.data(), gW.data(), gY.data() + offset, gdY2.data() + offset,
                               nullptr, gdW.data(), gdb.data(), B, in, out, true);
          expect_same(down(gdY2), dY, what + " linear_backward_bf16 masked dY, with db");
          expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol,
                       what + " linear_backward_bf16 db");
          linear_backward_bf16(gpu_, gX.data(), gW.data(), nullptr, gdY.data() + offset, nullptr,
                               gdW.data(), gdb2.data(), B, in, out, false);
          expect_same(down(gdb2), down(gdb),
                      what + " linear_backward_bf16 db: fused vs sums alone");
          for (bool relu : {true, false}) {
            const std::string tag = what + (relu ? " (ReLU)" : " (no ReLU)");
            Bits GdY = dY0;
            const int64_t lddyg = out + offset;
            Vec dYg(size_t(n) * lddyg + 1, 2.0f), db(static_cast<size_t>(out));
            Buffer<uint16_t> gGdY = up(dY0);
            Buffer<float> gdYg = up(dYg), gdb = up(db);
            group_sum_backward_bf16(cpu_, Y.data() + offset, GdY.data() + offset, n, S, out,
                                    dYg.data() + offset, lddyg, db.data(), relu);
            group_sum_backward_bf16(gpu_, gY.data() + offset, gGdY.data() + offset, n, S, out,
                                    gdYg.data() + offset, lddyg, gdb.data(), relu);
            expect_same(down(gGdY), GdY, tag + " group_sum_backward_bf16 dY");
            expect_same(down(gdYg), dYg, tag + " group_sum_backward_bf16 dYg");
            expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol,
                         tag + " group_sum_backward_bf16 db");
          }
        }
}

// Layer 0's ReLU bit mask on the device: written in passing by the streaming epilogue
// kernels where the width allows (FP32 out % 128 == 0, BF16 out % 256 == 0) and by a
// kernel of its own elsewhere, each bit the sign of the device's own stored output (its
// product may round differently from the CPU's); and group_sum_backward(_bf16) masking
// by those bits is the bits of masking by that output, on the device and on the CPU twin.
TEST_F(Parity, Layer0BitMaskIsTheGpuOutputsSignAndMasksAsYDoes) {
  const int64_t n = 301;
  const int S = 5, in = 40;
  for (int out : {5, 128, 130, 256}) {
    const std::string what = "out " + std::to_string(out);
    const int64_t B = n * S, words = relu_mask_words(out);
    const Vec X = random_vec(size_t(B) * in, gen_), W = random_vec(size_t(out) * in, gen_),
              Yg = random_vec(size_t(n) * out, gen_), bias = random_vec(size_t(out), gen_),
              dY0 = random_vec(size_t(B) * out, gen_);
    Buffer<float> gX = up(X), gW = up(W), gYg = up(Yg), gb = up(bias);
    auto expect_sign_bits = [&](const std::vector<uint32_t>& mask, auto positive_at,
                                const std::string& tag) {
      size_t bad = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < words * 32; ++j) {
          const bool bit = (mask[size_t(b * words + j / 32)] >> (j % 32)) & 1u;
          if (bit != (j < out && positive_at(b, int(j))) && bad++ < 3)
            ADD_FAILURE() << tag << " row " << b << " bit " << j << ": " << bit;
        }
      EXPECT_EQ(bad, 0u) << tag;
    };
    {  // FP32
      Buffer<float> gY = up(Vec(size_t(B) * out));
      Buffer<uint32_t> gm = up(std::vector<uint32_t>(size_t(B * words), 0xdeadbeefu));
      group_linear_forward(gpu_, gX.data(), in, gW.data(), in, gYg.data(), gb.data(), gY.data(), n,
                           S, in, out, true, gm.data());
      const Vec Y = down(gY);
      const std::vector<uint32_t> mask = down(gm);
      expect_sign_bits(
          mask, [&](int64_t b, int j) { return Y[size_t(b * out + j)] > 0.0f; }, what + " FP32");
      Buffer<float> gdy1 = up(dY0), gdy2 = up(dY0), gg1 = up(Vec(size_t(n) * out)),
                    gg2 = up(Vec(size_t(n) * out)), gdb1 = up(Vec(size_t(out))),
                    gdb2 = up(Vec(size_t(out)));
      group_sum_backward(gpu_, gY.data(), gdy1.data(), n, S, out, gg1.data(), out, gdb1.data(),
                         true);
      group_sum_backward(gpu_, nullptr, gdy2.data(), n, S, out, gg2.data(), out, gdb2.data(), true,
                         gm.data());
      expect_same(down(gdy2), down(gdy1), what + " FP32 dZ by bits vs by Y");
      expect_same(down(gg2), down(gg1), what + " FP32 dYg by bits vs by Y");
      expect_same(down(gdb2), down(gdb1), what + " FP32 db by bits vs by Y");
      Vec dY = dY0, g(size_t(n) * out), db(static_cast<size_t>(out));
      group_sum_backward(cpu_, nullptr, dY.data(), n, S, out, g.data(), out, db.data(), true,
                         mask.data());
      expect_same(down(gdy2), dY, what + " FP32 dZ by bits vs the CPU twin");
      expect_same(down(gg2), g, what + " FP32 dYg by bits vs the CPU twin");
    }
    {  // BF16 storage
      Buffer<uint16_t> gXb = up(bf16_bits_of(X)), gWb = up(bf16_bits_of(W));
      Buffer<uint16_t> gY = up(Bits(size_t(B) * out));
      Buffer<uint32_t> gm = up(std::vector<uint32_t>(size_t(B * words), 0xdeadbeefu));
      group_linear_forward_bf16(gpu_, gXb.data(), in, gWb.data(), in, gYg.data(), gb.data(),
                                gY.data(), n, S, in, out, true, gm.data());
      const Bits Y = down(gY);
      const std::vector<uint32_t> mask = down(gm);
      expect_sign_bits(
          mask, [&](int64_t b, int j) { return bf16_bits_to_float(Y[size_t(b * out + j)]) > 0.0f; },
          what + " BF16");
      const Bits dYb = bf16_bits_of(dY0);
      Buffer<uint16_t> gdy1 = up(dYb), gdy2 = up(dYb);
      Buffer<float> gg1 = up(Vec(size_t(n) * out)), gg2 = up(Vec(size_t(n) * out)),
                    gdb1 = up(Vec(size_t(out))), gdb2 = up(Vec(size_t(out)));
      group_sum_backward_bf16(gpu_, gY.data(), gdy1.data(), n, S, out, gg1.data(), out, gdb1.data(),
                              true);
      group_sum_backward_bf16(gpu_, nullptr, gdy2.data(), n, S, out, gg2.data(), out, gdb2.data(),
                              true, gm.data());
      expect_same(down(gdy2), down(gdy1), what + " BF16 dZ by bits vs by Y");
      expect_same(down(gg2), down(gg1), what + " BF16 dYg by bits vs by Y");
      expect_same(down(gdb2), down(gdb1), what + " BF16 db by bits vs by Y");
      Bits dY = dYb;
      Vec g(size_t(n) * out), db(static_cast<size_t>(out));
      group_sum_backward_bf16(cpu_, nullptr, dY.data(), n, S, out, g.data(), out, db.data(), true,
                              mask.data());
      expect_same(down(gdy2), dY, what + " BF16 dZ by bits vs the CPU twin");
      expect_same(down(gg2), g, what + " BF16 dYg by bits vs the CPU twin");
    }
  }
}

TEST_F(Parity, TopOnBf16StorageIsTheFp32TopOfTheSameValuesOnTheGpu) {
  const int64_t n = 2000;
  const int S = 5, mf = 64, last = 64, F = mf + last;
  const int64_t B = n * S, ld = mf + 17;
  Vec U = random_vec(size_t(n) * ld, gen_), I = random_vec(size_t(B) * ld, gen_);
  Vec A = random_vec(size_t(B) * last, gen_, -0.5f, 1.0f);
  for (float& a : A) a = std::max(a, 0.0f);
  const Bits A16 = bf16_bits_of(A);
  const Vec Aw = widen_bf16(A16);
  Vec wc = random_vec(size_t(F) + 1, gen_), labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  const int64_t global_batch = B + 3;
  Buffer<float> gU = up(U), gI = up(I), gAw = up(Aw), gwc = up(wc), glabels = up(labels);
  Buffer<uint16_t> gA16 = up(A16);
  struct Out {
    Vec logits, dU, dI, dwc, db, dAf;
    Bits dA16;
    double loss = -1.0;
  };
  // The ops on the device's buffers (dev), or the CPU twin on host arrays.
  auto run = [&](const ExecContext& ctx, bool storage, bool dev) {
    Vec logits(size_t(B), 0.0f), dU(size_t(n) * ld, 4.0f), dI(size_t(B) * ld, 5.0f),
        dwc(size_t(F) + 1, 6.0f), db(static_cast<size_t>(last), 7.0f), dAf(size_t(B) * last, 3.0f);
    Bits dA16(size_t(B) * last, 3);
    std::vector<double> loss{-1.0};
    if (!dev) {  // the CPU twin on host arrays
      if (storage) {
        neumf_top_forward_bf16(ctx, U.data(), ld, I.data(), ld, A16.data(), wc.data(),
                               wc.data() + F, logits.data(), n, S, mf, last);
        neumf_top_backward_bf16(ctx, U.data(), ld, I.data(), ld, A16.data(), wc.data(), nullptr,
                                logits.data(), labels.data(), global_batch, loss.data(),
                                dA16.data(), dU.data(), ld, dI.data(), ld, dwc.data(),
                                dwc.data() + F, db.data(), n, S, mf, last, true);
      } else {
        neumf_top_forward(ctx, U.data(), ld, I.data(), ld, Aw.data(), wc.data(), wc.data() + F,
                          logits.data(), n, S, mf, last);
        neumf_top_backward(ctx, U.data(), ld, I.data(), ld, Aw.data(), wc.data(), nullptr,
                           logits.data(), labels.data(), global_batch, loss.data(), dAf.data(),
                           dU.data(), ld, dI.data(), ld, dwc.data(), dwc.data() + F, db.data(), n,
                           S, mf, last, true);
      }
      return Out{logits, dU, dI, dwc, db, dAf, dA16, loss[0]};
    }
    Buffer<float> gl = up(logits), gdU = up(dU), gdI = up(dI), gdwc = up(dwc), gdb = up(db),
                  gdAf = up(dAf);
    Buffer<uint16_t> gdA16 = up(dA16);
    Buffer<double> gloss = up(loss);
    if (storage) {
      neumf_top_forward_bf16(ctx, gU.data(), ld, gI.data(), ld, gA16.data(), gwc.data(),
                             gwc.data() + F, gl.data(), n, S, mf, last);
      neumf_top_backward_bf16(ctx, gU.data(), ld, gI.data(), ld, gA16.data(), gwc.data(), nullptr,
                              gl.data(), glabels.data(), global_batch, gloss.data(), gdA16.data(),
                              gdU.data(), ld, gdI.data(), ld, gdwc.data(), gdwc.data() + F,
                              gdb.data(), n, S, mf, last, true);
    } else {
      neumf_top_forward(ctx, gU.data(), ld, gI.data(), ld, gAw.data(), gwc.data(), gwc.data() + F,
                        gl.data(), n, S, mf, last);
      neumf_top_backward(ctx, gU.data(), ld, gI.data(), ld, gAw.data(), gwc.data(), nullptr,
                         gl.data(), glabels.data(), global_batch, gloss.data(), gdAf.data(),
                         gdU.data(), ld, gdI.data(), ld, gdwc.data(), gdwc.data() + F, gdb.data(),
                         n, S, mf, last, true);
    }
    return Out{down(gl),  down(gdU),  down(gdI),   down(gdwc),
               down(gdb), down(gdAf), down(gdA16), down(gloss)[0]};
  };
  const Out s = run(gpu_, true, true), f = run(gpu_, false, true), c = run(cpu_, true, false);
  expect_same(s.logits, f.logits, "logits, BF16 storage vs FP32 on the device");
  expect_same(s.dA16, bf16_bits_of(f.dAf), "dA = the FP32 top's dA rounded");
  expect_same(s.dU, f.dU, "user GMF gradients");
  expect_same(s.dI, f.dI, "item GMF gradients");
  expect_same(s.dwc, f.dwc, "dw, dc");
  EXPECT_EQ(std::memcmp(&s.loss, &f.loss, sizeof(double)), 0) << s.loss << " vs " << f.loss;
  const Out again = run(gpu_, true, true);
  expect_same(again.dwc, s.dwc, "dw, dc on a second run");
  expect_same(again.db, s.db, "db on a second run");
  // Against the CPU twin, with FusedTopIsTheUnfusedOpsOnTheGpu's tolerances (FMA
  // contraction, CUDA's expf); dA within one BF16 ulp of the CPU's rounding.
  expect_close(s.logits, c.logits, 1e-6 * F, kElemRtol, "logits vs the CPU twin");
  expect_bf16_close(s.dA16, c.dA16, std::vector<double>(c.dA16.size(), 0.0), "dA vs the CPU twin");
  expect_close(s.dU, c.dU, kElemAtol, kElemRtol, "user GMF gradients vs the CPU twin");
  expect_close(s.dI, c.dI, kElemAtol, kElemRtol, "item GMF gradients vs the CPU twin");
  expect_close(s.dwc, c.dwc, kDoubleSumAtol, kDoubleSumRtol, "dw, dc vs the CPU twin");
  expect_close(s.db, c.db, kDoubleSumAtol, kDoubleSumRtol, "db vs the CPU twin");
  expect_loss_close(s.loss, c.loss, s.logits, c.logits, kDoubleAtol, kDoubleRtol,
                    "loss vs the CPU twin");
}

}  // namespace
}  // namespace ncf
