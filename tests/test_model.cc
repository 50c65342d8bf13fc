// Dense NeuMF math (model/ops.h, model/neumf.h) against independent double-
// precision references written here: forward values against naive loops,
// gradients against central finite differences of those references (eps 1e-6
// in double, so the FD error is far below the float error of the code under
// test). Also GradMode, thread-count invariance (bit-exact), init, config checks,
// and the parallel_for / block_sums helpers the CPU kernels stand on.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/parallel.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "test_util.h"

namespace ncf {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

using test::random_vec;

DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }

using test::cpu;

// |got − want| <= atol + rtol·|want| element-wise; reports the first misses.
void expect_close(const Vec& got, const DVec& want, double atol, double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    double err = std::fabs(static_cast<double>(got[k]) - want[k]);
    if (!(err <= atol + rtol * std::fabs(want[k])) && reported++ < 5)
      ADD_FAILURE() << what << "[" << k << "]: got " << got[k] << ", want " << want[k];
  }
}

// Central difference of f at x[k], in double.
double finite_diff(DVec& x, size_t k, const std::function<double()>& f, double eps = 1e-6) {
  double keep = x[k];
  x[k] = keep + eps;
  double up = f();
  x[k] = keep - eps;
  double down = f();
  x[k] = keep;
  return (up - down) / (2 * eps);
}

DVec fd_grad(DVec& x, const std::function<double()>& f) {
  DVec g(x.size());
  for (size_t k = 0; k < x.size(); ++k) g[k] = finite_diff(x, k, f);
  return g;
}

// Gradient tolerances for float code against double FD.
constexpr double kAtol = 1e-5, kRtol = 1e-4;

// ---- references in double ----------------------------------------------------

DVec ref_linear(const DVec& X, const DVec& W, const DVec& b, int B, int in, int out, bool relu) {
  DVec Y(static_cast<size_t>(B) * out);
  for (int r = 0; r < B; ++r)
    for (int j = 0; j < out; ++j) {
      double z = b.empty() ? 0.0 : b[j];
      for (int k = 0; k < in; ++k) z += X[r * in + k] * W[j * in + k];
      Y[r * out + j] = relu ? std::max(z, 0.0) : z;
    }
  return Y;
}

double dot(const DVec& a, const DVec& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += a[k] * b[k];
  return s;
}

double ref_bce(double z, double y) {
  // log(1 + e^z) − z·y, written differently from the code under test
  double softplus = z > 0 ? z + std::log(1 + std::exp(-z)) : std::log(1 + std::exp(z));
  return softplus - z * y;
}

// ---- parallel helpers ------------------------------------------------------------

TEST(Parallel, ChunksCoverRangeExactlyOnceInContiguousPieces) {
  for (int threads : {1, 2, 3, 8})
    for (int64_t n : {0, 1, 5, 1000, 4097})
      for (int64_t grain : {1, 7, 5000}) {
        std::vector<int> hits(n, 0);
        std::vector<std::pair<int64_t, int64_t>> chunks;
        std::mutex mu;
        parallel_for(threads, n, grain, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lk(mu);
          chunks.emplace_back(b, e);
          for (int64_t i = b; i < e; ++i) ++hits[i];
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << i;
        int64_t max_chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
        EXPECT_LE(static_cast<int64_t>(chunks.size()), std::max<int64_t>(max_chunks, n ? 1 : 0));
      }
}

TEST(Parallel, ExceptionsReachTheCallerAndNestedCallsRunInline) {
  EXPECT_THROW(parallel_for(3, 100, 1,
                            [](int64_t b, int64_t) {
                              if (b > 0) NCF_FAIL("chunk at ", b);
                            }),
               Error);
  std::atomic<int64_t> total{0};
  parallel_for(2, 4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(2, 10, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(Parallel, BlockSumsMatchBlockwiseLoop) {
  const int64_t n = 3 * kReduceBlock + 17;
  Vec x = random_vec(n, 90);
  double want = 0;  // blocks of kReduceBlock, each summed in order, then added in order
  for (int64_t b0 = 0; b0 < n; b0 += kReduceBlock) {
    double part = 0;
    for (int64_t i = b0; i < std::min(n, b0 + kReduceBlock); ++i) part += x[i];
    want += part;
  }
  for (int threads : {1, 2, 5}) {
    double got[2];
    block_sums(
        threads, n, 2,
        [&](int64_t b, int64_t e, double* acc) {
          for (int64_t i = b; i < e; ++i) {
            acc[0] += x[i];
            acc[1] += 1;
          }
        },
        got);
    EXPECT_EQ(got[0], want) << threads;
    EXPECT_EQ(got[1], static_cast<double>(n));
  }
}

// ---- GEMM ----------------------------------------------------------------------

TEST(Ops, GemmMatchesNaiveLoopForAllTransposes) {
  const int M = 5, N = 7, K = 3, pad = 2;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      Vec A = random_vec(static_cast<size_t>(ta ? K : M) * lda, 1);
      Vec Bm = random_vec(static_cast<size_t>(tb ? N : K) * ldb, 2);
      Vec C = random_vec(static_cast<size_t>(M) * ldc, 3);
      DVec want(C.begin(), C.end());
      const float alpha = 0.7f, beta = -0.3f;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int k = 0; k < K; ++k)
            s += static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]) *
                 (tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
          want[i * ldc + j] = alpha * s + beta * want[i * ldc + j];
        }
      gemm(cpu(1), ta, tb, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
      expect_close(C, want, 1e-6, 1e-5, ta ? (tb ? "C(TT)" : "C(TN)") : (tb ? "C(NT)" : "C(NN)"));
    }
}

// The CPU GEMM runs in fixed blocks on the thread pool (oneDNN itself
// single-threaded): shapes past the row blocks (M large), past the column
// blocks (N large, M small), past the K slices (M and N small, K long: two
// slices exactly, and three with a short last one) and past the tiles (M small,
// N and K long: two tiles across, the second narrow, by three slices), with
// padded strides and every transpose, match a double loop, and give the same
// bits at any thread count.
TEST(Ops, GemmInBlocksMatchesLoopAndIsTheSameAtAnyThreadCount) {
  struct Shape {
    int M, N, K;
  };
  for (Shape sh : {Shape{2049, 9, 17}, Shape{3, 300, 33}, Shape{1, 129, 5}, Shape{700, 1, 4},
                   Shape{7, 5, 16384}, Shape{3, 2, 20001}, Shape{4, 300, 16400}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int M = sh.M, N = sh.N, K = sh.K, pad = 3;
        const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        const Vec A = random_vec(static_cast<size_t>(ta ? K : M) * lda, 4);
        const Vec Bm = random_vec(static_cast<size_t>(tb ? N : K) * ldb, 5);
        const Vec C0 = random_vec(static_cast<size_t>(M) * ldc, 6);
        const float alpha = 1.3f, beta = 0.5f;
        DVec want(C0.begin(), C0.end());
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double acc = 0;
            for (int k = 0; k < K; ++k)
              acc += static_cast<double>(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]) *
                     (tb ? Bm[size_t(j) * ldb + k] : Bm[size_t(k) * ldb + j]);
            want[size_t(i) * ldc + j] = alpha * acc + beta * want[size_t(i) * ldc + j];
          }
        Vec first;
        for (int threads : {1, 2, 3, 5}) {
          Vec C = C0;
          gemm(cpu(threads), ta, tb, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, C.data(),
               ldc);
          const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                   (ta ? " A^T" : "") + (tb ? " B^T" : "") + " threads " +
                                   std::to_string(threads);
          // FP32 sums of K products: the error grows with K.
          const double tol = K > 1000 ? 3e-4 : 1e-5;
          expect_close(C, want, tol, tol, what.c_str());
          if (first.empty()) first = C;
          EXPECT_EQ(std::memcmp(C.data(), first.data(), C.size() * 4), 0) << what;
        }
      }
}

TEST(Ops, GemmWithZeroKScalesCAndBetaZeroOverwritesNaN) {
  Vec C = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  gemm(cpu(1), false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C[0], 0.5f);
  EXPECT_EQ(C[3], 2.0f);
  gemm(cpu(1), false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, C.data(), 2);
  for (float c : C) EXPECT_EQ(c, 0.0f);
  EXPECT_THROW(
      gemm(cpu(1), false, false, 2, 3, 4, 1.0f, C.data(), 3, C.data(), 3, 0.0f, C.data(), 3),
      Error);  // lda 3 < K 4
}

// ---- Linear ------------------------------------------------------------------

void check_linear(bool relu, bool with_bias, int threads) {
  SCOPED_TRACE(::testing::Message()
               << "relu=" << relu << " bias=" << with_bias << " threads=" << threads);
  const int B = 6, in = 5, out = 4;
  Vec X = random_vec(B * in, 10), W = random_vec(out * in, 11), b = random_vec(out, 12);
  if (!with_bias) b.clear();
  Vec R = random_vec(B * out, 13);  // loss L = Σ R ⊙ Y
  DVec x = to_double(X), w = to_double(W), bd = to_double(b), r = to_double(R);

  Vec Y(B * out);
  linear_forward(cpu(threads), X.data(), W.data(), with_bias ? b.data() : nullptr, Y.data(), B, in,
                 out, relu);
  DVec Yref = ref_linear(x, w, bd, B, in, out, relu);
  expect_close(Y, Yref, 1e-6, 1e-5, "Y");

  Vec dY = R, dX(B * in), dW(out * in), db(out);
  linear_backward(cpu(threads), X.data(), W.data(), Y.data(), dY.data(), dX.data(), dW.data(),
                  with_bias ? db.data() : nullptr, B, in, out, relu, GradMode::kOverwrite);
  auto loss = [&] { return dot(r, ref_linear(x, w, bd, B, in, out, relu)); };
  expect_close(dX, fd_grad(x, loss), kAtol, kRtol, "dX");
  expect_close(dW, fd_grad(w, loss), kAtol, kRtol, "dW");
  if (with_bias) expect_close(db, fd_grad(bd, loss), kAtol, kRtol, "db");
  // dY now holds dZ: R where Y > 0 (relu), else 0.
  for (int k = 0; k < B * out; ++k)
    EXPECT_EQ(dY[k], (!relu || Y[k] > 0.0f) ? R[k] : 0.0f) << "dZ[" << k << "]";
}

TEST(Ops, LinearGradientsMatchFiniteDifferences) {
  for (bool relu : {false, true})
    for (bool bias : {true, false})
      for (int threads : {1, 2}) check_linear(relu, bias, threads);
}

TEST(Ops, LinearReluReallyMasks) {
  // Guard for the test above: with these inputs some pre-activations are
  // negative, so the ReLU branch is exercised.
  const int B = 6, in = 5, out = 4;
  Vec X = random_vec(B * in, 10), W = random_vec(out * in, 11), b = random_vec(out, 12), Y(B * out);
  linear_forward(cpu(1), X.data(), W.data(), b.data(), Y.data(), B, in, out, true);
  int zeros = 0;
  for (float y : Y) zeros += y == 0.0f;
  EXPECT_GT(zeros, 2);
  EXPECT_LT(zeros, B * out - 2);
}

TEST(Ops, LinearGradModeAccumulateAddsToExisting) {
  const int B = 9, in = 3, out = 5;
  Vec X = random_vec(B * in, 20), W = random_vec(out * in, 21), R = random_vec(B * out, 22);
  Vec dY = R, dW(out * in), db(out);
  linear_backward(cpu(1), X.data(), W.data(), nullptr, dY.data(), nullptr, dW.data(), db.data(), B,
                  in, out, false, GradMode::kOverwrite);
  Vec dW2 = random_vec(out * in, 23), db2 = random_vec(out, 24);
  DVec want_w(out * in), want_b(out);
  for (int k = 0; k < out * in; ++k) want_w[k] = static_cast<double>(dW2[k]) + dW[k];
  for (int k = 0; k < out; ++k) want_b[k] = static_cast<double>(db2[k]) + db[k];
  dY = R;
  linear_backward(cpu(1), X.data(), W.data(), nullptr, dY.data(), nullptr, dW2.data(), db2.data(),
                  B, in, out, false, GradMode::kAccumulate);
  expect_close(dW2, want_w, 1e-6, 1e-6, "dW accumulated");
  expect_close(db2, want_b, 1e-6, 1e-6, "db accumulated");
  // Overwrite really ignores what was there.
  Vec dW3(out * in, 1e6f), db3(out, 1e6f);
  dY = R;
  linear_backward(cpu(1), X.data(), W.data(), nullptr, dY.data(), nullptr, dW3.data(), db3.data(),
                  B, in, out, false, GradMode::kOverwrite);
  EXPECT_EQ(dW3, dW);
  EXPECT_EQ(db3, db);
}

TEST(Ops, LinearEmptyBatchGivesZeroGradients) {
  Vec W = random_vec(6, 1), dW(6, 3.0f), db(2, 3.0f);
  linear_backward(cpu(2), nullptr, W.data(), nullptr, nullptr, nullptr, dW.data(), db.data(), 0, 3,
                  2, true, GradMode::kOverwrite);
  for (float g : dW) EXPECT_EQ(g, 0.0f);
  for (float g : db) EXPECT_EQ(g, 0.0f);
}

// ---- GMF, concat/split, head ------------------------------------------------------

TEST(Ops, GmfOnStridedRowsMatchesFiniteDifferences) {
  const int B = 5, mf = 3, D = 7;  // rows [mf part | 4 more columns]
  Vec U = random_vec(B * D, 30), I = random_vec(B * D, 31), R = random_vec(B * mf, 32);
  DVec u = to_double(U), it = to_double(I), r = to_double(R);
  const int ldg = mf + 1;
  Vec G(B * ldg, -7.0f);
  gmf_forward(cpu(2), U.data(), D, I.data(), D, G.data(), ldg, B, mf);
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < mf; ++k) EXPECT_NEAR(G[b * ldg + k], u[b * D + k] * it[b * D + k], 1e-7);
    EXPECT_EQ(G[b * ldg + mf], -7.0f) << "padding column written";
  }
  // L = Σ R ⊙ G; dG = R given with stride mf (contiguous).
  auto loss = [&] {
    double s = 0;
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < mf; ++k) s += r[b * mf + k] * u[b * D + k] * it[b * D + k];
    return s;
  };
  Vec dU(B * D, 9.0f), dI(B * D, 9.0f);
  gmf_backward(cpu(2), U.data(), D, I.data(), D, R.data(), mf, dU.data(), D, dI.data(), D, B, mf);
  DVec gu = fd_grad(u, loss), gi = fd_grad(it, loss);
  for (int b = 0; b < B; ++b)
    for (int k = 0; k < D; ++k) {
      if (k < mf) {
        EXPECT_NEAR(dU[b * D + k], gu[b * D + k], kAtol);
        EXPECT_NEAR(dI[b * D + k], gi[b * D + k], kAtol);
      } else {
        EXPECT_EQ(dU[b * D + k], 9.0f) << "column >= mf touched";
        EXPECT_EQ(dI[b * D + k], 9.0f) << "column >= mf touched";
      }
    }
}

TEST(Ops, ConcatAndSplitAreExactInverses) {
  const int B = 4, wa = 3, wc = 2, lda = 6, ldc = 5;
  Vec A = random_vec(B * lda, 40), C = random_vec(B * ldc, 41), Y(B * (wa + wc));
  concat_cols(cpu(2), A.data(), lda, wa, C.data(), ldc, wc, Y.data(), B);
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < wa; ++k) EXPECT_EQ(Y[b * (wa + wc) + k], A[b * lda + k]);
    for (int k = 0; k < wc; ++k) EXPECT_EQ(Y[b * (wa + wc) + wa + k], C[b * ldc + k]);
  }
  Vec A2(B * lda, 0.5f), C2(B * ldc, 0.5f);
  split_cols(cpu(2), Y.data(), wa, wc, A2.data(), lda, C2.data(), ldc, B);
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < lda; ++k) EXPECT_EQ(A2[b * lda + k], k < wa ? A[b * lda + k] : 0.5f);
    for (int k = 0; k < ldc; ++k) EXPECT_EQ(C2[b * ldc + k], k < wc ? C[b * ldc + k] : 0.5f);
  }
}

TEST(Ops, HeadMatchesFiniteDifferencesAndAccumulates) {
  const int B = 6, F = 5;
  Vec H = random_vec(B * F, 50), w = random_vec(F, 51), c = {0.25f}, R = random_vec(B, 52);
  DVec h = to_double(H), wd = to_double(w), cd = to_double(c), r = to_double(R);
  auto logits_ref = [&] {
    DVec z(B);
    for (int b = 0; b < B; ++b) {
      z[b] = cd[0];
      for (int k = 0; k < F; ++k) z[b] += wd[k] * h[b * F + k];
    }
    return z;
  };
  Vec z(B);
  head_forward(cpu(2), H.data(), w.data(), c.data(), z.data(), B, F);
  expect_close(z, logits_ref(), 1e-6, 1e-6, "logits");

  auto loss = [&] { return dot(r, logits_ref()); };
  Vec dH(B * F), dw(F), dc(1);
  head_backward(cpu(2), H.data(), w.data(), R.data(), dH.data(), dw.data(), dc.data(), B, F,
                GradMode::kOverwrite);
  expect_close(dH, fd_grad(h, loss), kAtol, kRtol, "dH");
  expect_close(dw, fd_grad(wd, loss), kAtol, kRtol, "dw");
  expect_close(dc, fd_grad(cd, loss), kAtol, kRtol, "dc");

  Vec dw2(F, 1.0f), dc2(1, -2.0f);
  head_backward(cpu(1), H.data(), w.data(), R.data(), dH.data(), dw2.data(), dc2.data(), B, F,
                GradMode::kAccumulate);
  for (int k = 0; k < F; ++k) EXPECT_FLOAT_EQ(dw2[k], 1.0f + dw[k]);
  EXPECT_FLOAT_EQ(dc2[0], -2.0f + dc[0]);
}

// ---- BCE with logits ------------------------------------------------------------

TEST(Ops, BceLossAndGradientWithPaddingAndWeights) {
  const int B = 8, n_valid = 6, global_batch = 20;
  Vec z = {0.3f, -1.2f, 4.0f, -0.7f, 2.2f, 0.0f, std::numeric_limits<float>::quiet_NaN(),
           1e30f};  // padding rows hold garbage
  Vec y = {1, 0, 1, 1, 0, 1, 1, 0};
  Vec weights = {1, 1, 0, 1, 0.5f, 1, 1, 1};  // row 2 masked too; row 4 half weight
  DVec zd = to_double(z);
  auto loss_ref = [&] {
    double s = 0;
    for (int b = 0; b < n_valid; ++b) s += weights[b] * ref_bce(zd[b], y[b]);
    return s / global_batch;
  };
  double loss = -1;
  bce_with_logits_forward(cpu(2), z.data(), y.data(), weights.data(), &loss, B, n_valid,
                          global_batch);
  EXPECT_NEAR(loss, loss_ref(), 1e-12);

  Vec dz(B, 5.0f);
  bce_with_logits_backward(cpu(2), z.data(), y.data(), weights.data(), dz.data(), B, n_valid,
                           global_batch);
  for (int b = 0; b < n_valid; ++b) {
    double want = weights[b] != 0 ? finite_diff(zd, b, loss_ref) : 0.0;
    EXPECT_NEAR(dz[b], want, 1e-7) << "row " << b;
  }
  EXPECT_EQ(dz[2], 0.0f);
  EXPECT_EQ(dz[6], 0.0f);
  EXPECT_EQ(dz[7], 0.0f);

  // No weights: every row below n_valid counts.
  bce_with_logits_forward(cpu(1), z.data(), y.data(), nullptr, &loss, B, n_valid, global_batch);
  double all = 0;
  for (int b = 0; b < n_valid; ++b) all += ref_bce(zd[b], y[b]);
  EXPECT_NEAR(loss, all / global_batch, 1e-12);
}

TEST(Ops, BceIsStableForExtremeLogits) {
  Vec z = {100.0f, -100.0f, 100.0f, -100.0f, 89.0f};
  Vec y = {1, 0, 0, 1, 1};
  double loss;
  bce_with_logits_forward(cpu(1), z.data(), y.data(), nullptr, &loss, 5, 5, 1);
  EXPECT_NEAR(loss, 200.0, 1e-9);  // the two wrong rows cost |z| each
  Vec dz(5);
  bce_with_logits_backward(cpu(1), z.data(), y.data(), nullptr, dz.data(), 5, 5, 1);
  EXPECT_NEAR(dz[0], 0.0f, 1e-30);
  EXPECT_NEAR(dz[1], 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(dz[2], 1.0f);
  EXPECT_FLOAT_EQ(dz[3], -1.0f);
  for (float g : dz) EXPECT_TRUE(std::isfinite(g));
}

TEST(Ops, BceRejectsBadShapes) {
  Vec z(4), y(4);
  double loss;
  EXPECT_THROW(bce_with_logits_forward(cpu(1), z.data(), y.data(), nullptr, &loss, 4, 5, 4), Error);
  EXPECT_THROW(bce_with_logits_forward(cpu(1), z.data(), y.data(), nullptr, &loss, 4, 4, 0), Error);
}

#ifndef NCF_WITH_CUDA
TEST(Ops, CudaContextFailsClearlyWithoutCudaBackend) {
  ExecContext ctx;
  ctx.device = Device::kCuda;
  Vec x(4);
  try {
    fill(ctx, x.data(), 4, 1.0f);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
}
#endif

// ---- NeuMF -------------------------------------------------------------------

// The model written out per sample in double, from the documented flat layout
// (offsets computed here, not taken from the model).
struct RefNeuMF {
  int mf;
  std::vector<int> layers;

  int D() const { return mf + layers[0] / 2; }
  int64_t num_params() const {
    int64_t n = 0;
    for (size_t l = 0; l + 1 < layers.size(); ++l) n += layers[l] * layers[l + 1] + layers[l + 1];
    return n + mf + layers.back() + 1;
  }
  double logit(const DVec& p, const double* u, const double* it) const {
    const int h = layers[0] / 2;
    DVec x(layers[0]);
    for (int k = 0; k < h; ++k) {
      x[k] = u[mf + k];
      x[h + k] = it[mf + k];
    }
    size_t off = 0;
    for (size_t l = 0; l + 1 < layers.size(); ++l) {
      int in = layers[l], out = layers[l + 1];
      DVec y(out);
      for (int j = 0; j < out; ++j) {
        double s = p[off + in * out + j];
        for (int k = 0; k < in; ++k) s += p[off + j * in + k] * x[k];
        y[j] = s > 0 ? s : 0;
      }
      off += in * out + out;
      x = y;
    }
    double z = p[off + mf + layers.back()];
    for (int k = 0; k < mf; ++k) z += p[off + k] * u[k] * it[k];
    for (int k = 0; k < layers.back(); ++k) z += p[off + mf + k] * x[k];
    return z;
  }
};

TEST(NeuMF, LayoutAndParameterCount) {
  NeuMFConfig cfg;
  cfg.mf_dim = 64;
  cfg.layers = {256, 256, 128, 64};
  NeuMF model(cfg, Device::kCpu);
  RefNeuMF ref{64, cfg.layers};
  EXPECT_EQ(model.num_params(), ref.num_params());
  EXPECT_EQ(model.num_params(), 256 * 256 + 256 + 256 * 128 + 128 + 128 * 64 + 64 + 128 + 1);
  EXPECT_EQ(static_cast<int64_t>(model.params().size()), model.num_params());
  EXPECT_EQ(static_cast<int64_t>(model.grads().size()), model.num_params());
  ASSERT_EQ(model.tower().size(), 3u);
  EXPECT_EQ(model.tower()[1].w_offset, 256 * 256 + 256);
  EXPECT_EQ(model.tower()[1].b_offset, 256 * 256 + 256 + 256 * 128);
  EXPECT_EQ(model.head_c_offset(), model.num_params() - 1);
  EXPECT_EQ(cfg.embedding_width(), 192);
}

TEST(NeuMF, GradientsMatchFiniteDifferences) {
  NeuMFConfig cfg;
  cfg.mf_dim = 4;
  cfg.layers = {8, 6, 4};
  const int B = 7, n_valid = 6, global_batch = 12, D = cfg.embedding_width();
  NeuMF model(cfg, Device::kCpu);
  model.init(123);
  // Non-zero biases so they matter in the forward.
  Vec bias_noise = random_vec(model.num_params(), 60, -0.2f, 0.2f);
  for (const DenseLayerView& v : model.tower())
    for (int j = 0; j < v.out; ++j) model.params().data()[v.b_offset + j] = bias_noise[j];
  model.params().data()[model.head_c_offset()] = 0.1f;

  Vec U = random_vec(B * D, 61), I = random_vec(B * D, 62);
  Vec labels = {1, 0, 0, 1, 0, 1, 1};
  ExecContext ctx = cpu(2);
  Vec logits(B), dlogits(B), dU(B * D), dI(B * D);
  model.forward(ctx, U.data(), I.data(), B, 1, logits.data());
  bce_with_logits_backward(ctx, logits.data(), labels.data(), nullptr, dlogits.data(), B, n_valid,
                           global_batch);
  model.backward(ctx, dlogits.data(), dU.data(), dI.data());
  // A second backward of the same forward must give the same (overwritten) result.
  Vec first(model.grads().data(), model.grads().data() + model.num_params());
  model.backward(ctx, dlogits.data(), dU.data(), dI.data());
  EXPECT_EQ(0, std::memcmp(first.data(), model.grads().data(), model.grads().bytes()));

  RefNeuMF ref{cfg.mf_dim, cfg.layers};
  DVec p(model.params().data(), model.params().data() + model.num_params());
  DVec u = to_double(U), it = to_double(I);
  DVec want_logits(B);
  for (int b = 0; b < B; ++b) want_logits[b] = ref.logit(p, &u[b * D], &it[b * D]);
  expect_close(logits, want_logits, 1e-5, 1e-5, "logits");

  auto loss = [&] {
    double s = 0;
    for (int b = 0; b < n_valid; ++b) s += ref_bce(ref.logit(p, &u[b * D], &it[b * D]), labels[b]);
    return s / global_batch;
  };
  Vec grads(model.grads().data(), model.grads().data() + model.num_params());
  expect_close(grads, fd_grad(p, loss), kAtol, kRtol, "dense grads");
  expect_close(dU, fd_grad(u, loss), kAtol, kRtol, "d_user_rows");
  expect_close(dI, fd_grad(it, loss), kAtol, kRtol, "d_item_rows");
  for (int k = 0; k < D; ++k) {  // the padding row gets nothing
    EXPECT_EQ(dU[(B - 1) * D + k], 0.0f);
    EXPECT_EQ(dI[(B - 1) * D + k], 0.0f);
  }
}

TEST(NeuMF, SingleWidthTowerHasNoLinearLayers) {
  NeuMFConfig cfg;
  cfg.mf_dim = 2;
  cfg.layers = {4};
  const int B = 3, D = cfg.embedding_width();
  NeuMF model(cfg, Device::kCpu);
  model.init(5);
  EXPECT_EQ(model.num_params(), 2 + 4 + 1);
  Vec U = random_vec(B * D, 70), I = random_vec(B * D, 71), R = random_vec(B, 72);
  Vec logits(B), dU(B * D), dI(B * D);
  model.forward(cpu(1), U.data(), I.data(), B, 1, logits.data());
  model.backward(cpu(1), R.data(), dU.data(), dI.data());
  RefNeuMF ref{cfg.mf_dim, cfg.layers};
  DVec p(model.params().data(), model.params().data() + model.num_params());
  DVec u = to_double(U), it = to_double(I), r = to_double(R);
  auto loss = [&] {
    double s = 0;
    for (int b = 0; b < B; ++b) s += r[b] * ref.logit(p, &u[b * D], &it[b * D]);
    return s;
  };
  Vec grads(model.grads().data(), model.grads().data() + model.num_params());
  expect_close(grads, fd_grad(p, loss), kAtol, kRtol, "dense grads");
  expect_close(dU, fd_grad(u, loss), kAtol, kRtol, "d_user_rows");
}

// Users shared by groups of S samples (a positive and its negatives): the
// grouped forward equals the per-sample reference with user row b / S, and
// every gradient matches finite differences, with and without hidden layers.
TEST(NeuMF, GroupedUsersMatchFiniteDifferences) {
  for (const std::vector<int>& layers : {std::vector<int>{8, 6, 4}, std::vector<int>{6}}) {
    NeuMFConfig cfg;
    cfg.mf_dim = 3;
    cfg.layers = layers;
    const int n = 3, S = 4, B = n * S, D = cfg.embedding_width();
    NeuMF model(cfg, Device::kCpu);
    model.init(321);
    Vec bias_noise = random_vec(model.num_params(), 90, -0.2f, 0.2f);
    for (const DenseLayerView& v : model.tower())
      for (int j = 0; j < v.out; ++j) model.params().data()[v.b_offset + j] = bias_noise[j];
    Vec U = random_vec(n * D, 91), I = random_vec(B * D, 92), R = random_vec(B, 93);
    Vec logits(B), dU(n * D), dI(B * D);
    ExecContext ctx = cpu(2);
    model.forward(ctx, U.data(), I.data(), n, S, logits.data());
    model.backward(ctx, R.data(), dU.data(), dI.data());
    RefNeuMF ref{cfg.mf_dim, cfg.layers};
    DVec p(model.params().data(), model.params().data() + model.num_params());
    DVec u = to_double(U), it = to_double(I), r = to_double(R);
    DVec want(B);
    for (int b = 0; b < B; ++b) want[b] = ref.logit(p, &u[(b / S) * D], &it[b * D]);
    expect_close(logits, want, 1e-5, 1e-5, "grouped logits");
    auto loss = [&] {
      double s = 0;
      for (int b = 0; b < B; ++b) s += r[b] * ref.logit(p, &u[(b / S) * D], &it[b * D]);
      return s;
    };
    Vec grads(model.grads().data(), model.grads().data() + model.num_params());
    const std::string what = "layers " + std::to_string(layers.size());
    expect_close(grads, fd_grad(p, loss), kAtol, kRtol, ("dense grads, " + what).c_str());
    expect_close(dU, fd_grad(u, loss), kAtol, kRtol, ("d_user_rows, " + what).c_str());
    expect_close(dI, fd_grad(it, loss), kAtol, kRtol, ("d_item_rows, " + what).c_str());
  }
}

// Runs forward, loss and backward; returns every output concatenated.
Vec run_step(int threads, uint64_t seed) {
  NeuMFConfig cfg;
  cfg.mf_dim = 8;
  cfg.layers = {32, 16, 8};
  // 600 users with 5 samples each, as a training step has them.
  const int n = 600, S = 5, B = n * S, n_valid = 2900, D = cfg.embedding_width();
  NeuMF model(cfg, Device::kCpu);
  model.init(seed);
  Vec U = random_vec(n * D, 80), I = random_vec(B * D, 81);
  Vec labels = random_vec(B, 82, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  ExecContext ctx = cpu(threads);
  Vec logits(B), dlogits(B), dU(n * D), dI(B * D);
  model.forward(ctx, U.data(), I.data(), n, S, logits.data());
  double loss;
  bce_with_logits_forward(ctx, logits.data(), labels.data(), nullptr, &loss, B, n_valid, B);
  bce_with_logits_backward(ctx, logits.data(), labels.data(), nullptr, dlogits.data(), B, n_valid,
                           B);
  model.backward(ctx, dlogits.data(), dU.data(), dI.data());
  Vec out = logits;
  float lossf[2];
  std::memcpy(lossf, &loss, sizeof loss);
  out.insert(out.end(), lossf, lossf + 2);
  out.insert(out.end(), model.grads().data(), model.grads().data() + model.num_params());
  out.insert(out.end(), dU.begin(), dU.end());
  out.insert(out.end(), dI.begin(), dI.end());
  return out;
}

TEST(NeuMF, ThreadCountDoesNotChangeAnyBit) {
  Vec one = run_step(1, 7);
  for (int threads : {2, 3}) {
    Vec many = run_step(threads, 7);
    ASSERT_EQ(one.size(), many.size());
    EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
        << "threads=" << threads;
  }
}

// The fused top (neumf_top_forward/backward) against the unfused ops it replaces
// (set_fused_top(false), the path of models wider than the fused ops take: repeat_rows,
// gmf_*, concat/split_cols, head_*, bce_*, the last layer's mask and bias sums) on the
// CPU: logits, the loss, every parameter gradient and both row gradients the same bits,
// through forward_backward (loss from labels) and through backward (dlogits given); for
// no hidden layer, layer 0 only and three layers, S = 1 and 5, GMF and tower
// widths below, at and past one 32-lane column, n = 0 and a batch past one
// kReduceBlock. The loss is also held to a double loop over the logits.
TEST(NeuMF, FusedTopIsTheUnfusedOpsBitForBit) {
  struct Case {
    int mf;
    std::vector<int> layers;
    int n, S;
  };
  const Case cases[] = {{3, {4}, 37, 5},
                        {5, {6, 7}, 37, 5},
                        {8, {64, 32, 16, 8}, 37, 1},
                        {8, {64, 32, 16, 8}, 300, 5},
                        {40, {20, 36, 33}, 61, 5},
                        {64, {256, 128, 64}, 9, 5},
                        {8, {16, 8}, 0, 5}};
  auto same = [](const float* a, const float* b, size_t count, const std::string& what) {
    size_t bad = 0;
    for (size_t k = 0; k < count; ++k)
      if (std::memcmp(a + k, b + k, sizeof(float)) != 0 && bad++ < 3)
        ADD_FAILURE() << what << " [" << k << "]: fused " << a[k] << ", unfused " << b[k];
    EXPECT_EQ(bad, 0u) << what;
  };
  for (const Case& c : cases) {
    NeuMFConfig cfg;
    cfg.mf_dim = c.mf;
    cfg.layers = c.layers;
    const int n = c.n, S = c.S, B = n * S, D = cfg.embedding_width();
    const std::string what = "mf " + std::to_string(c.mf) + " layers " +
                             std::to_string(c.layers.size()) + " n " + std::to_string(n) + " S " +
                             std::to_string(S) + ": ";
    NeuMF model(cfg, Device::kCpu);
    test::init_with_biases(model, 77, 78, 0.2f);  // non-zero biases: both sides of every kink
    const Vec U = random_vec(size_t(n) * D, 79), I = random_vec(size_t(B) * D, 80);
    Vec labels = random_vec(size_t(B), 81, 0.0f, 1.0f);
    for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
    const Vec R = random_vec(size_t(B), 82, -0.5f, 0.5f);
    const int64_t global_batch = B + 11;  // this rank's share of a larger step
    struct Out {
      Vec logits, grads, dU, dI;
      double loss = -1.0;
    };
    ExecContext ctx = cpu(2);
    auto run = [&](bool fused, bool from_labels) {
      set_fused_top(fused);
      Out o;
      o.logits.assign(size_t(B), 0.0f);
      o.dU.assign(size_t(n) * D, 5.0f);
      o.dI.assign(size_t(B) * D, 5.0f);
      Vec dlogits(size_t(B), 0.0f);
      if (from_labels) {
        model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), global_batch,
                               o.logits.data(), dlogits.data(), &o.loss, o.dU.data(), o.dI.data());
      } else {
        model.forward(ctx, U.data(), I.data(), n, S, o.logits.data());
        model.backward(ctx, R.data(), o.dU.data(), o.dI.data());
      }
      o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
      set_fused_top(true);
      return o;
    };
    for (bool from_labels : {true, false}) {
      const std::string w = what + (from_labels ? "from labels: " : "dlogits given: ");
      const Out fused = run(true, from_labels);
      const Out unfused = run(false, from_labels);
      same(fused.logits.data(), unfused.logits.data(), fused.logits.size(), w + "logits");
      same(fused.grads.data(), unfused.grads.data(), fused.grads.size(), w + "dense grads");
      same(fused.dU.data(), unfused.dU.data(), fused.dU.size(), w + "d_user_rows");
      same(fused.dI.data(), unfused.dI.data(), fused.dI.size(), w + "d_item_rows");
      if (!from_labels) continue;
      if (B == 0) {
        EXPECT_EQ(fused.loss, -1.0) << w << "the loss is left alone without rows";
        continue;
      }
      EXPECT_EQ(std::memcmp(&fused.loss, &unfused.loss, sizeof(double)), 0)
          << w << "loss " << fused.loss << " vs " << unfused.loss;
      double want = 0.0;
      for (int b = 0; b < B; ++b) want += ref_bce(fused.logits[size_t(b)], labels[size_t(b)]);
      EXPECT_NEAR(fused.loss, want / double(global_batch), 1e-12) << w << "loss vs a double loop";
    }
  }
}

TEST(NeuMF, InitBoundsZeroBiasesAndSeedDeterminism) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 32, 16};
  NeuMF a(cfg, Device::kCpu), b(cfg, Device::kCpu), c(cfg, Device::kCpu);
  a.init(42);
  b.init(42);
  c.init(43);
  const float* p = a.params().data();
  for (const DenseLayerView& v : a.tower()) {
    double limit = std::sqrt(6.0 / (v.in + v.out));
    double max_abs = 0, sum = 0;
    for (int64_t k = 0; k < int64_t{v.in} * v.out; ++k) {
      double w = p[v.w_offset + k];
      max_abs = std::max(max_abs, std::fabs(w));
      sum += w;
    }
    EXPECT_LE(max_abs, limit);
    EXPECT_GT(max_abs, 0.9 * limit);  // really uses the range (Glorot, not something narrower)
    EXPECT_LT(std::fabs(sum / (v.in * v.out)), 0.1 * limit);
    for (int j = 0; j < v.out; ++j) EXPECT_EQ(p[v.b_offset + j], 0.0f);
  }
  const int F = cfg.head_width();
  double limit = std::sqrt(3.0 / F), max_abs = 0;
  for (int k = 0; k < F; ++k)
    max_abs = std::max(max_abs, std::fabs(double{p[a.head_w_offset() + k]}));
  EXPECT_LE(max_abs, limit);
  EXPECT_GT(max_abs, 0.5 * limit);
  EXPECT_EQ(p[a.head_c_offset()], 0.0f);
  for (int64_t k = 0; k < a.num_params(); ++k) EXPECT_EQ(a.grads().data()[k], 0.0f);

  EXPECT_EQ(std::memcmp(a.params().data(), b.params().data(), a.params().bytes()), 0);
  EXPECT_NE(std::memcmp(a.params().data(), c.params().data(), a.params().bytes()), 0);
  // Different layers are not copies of each other's draws.
  EXPECT_NE(p[a.tower()[0].w_offset], p[a.tower()[1].w_offset]);
}

TEST(NeuMF, ConfigValidationNamesTheField) {
  NeuMFConfig cfg;
  cfg.layers = {7, 4};
  try {
    NeuMF m(cfg, Device::kCpu);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers[0]=7"), std::string::npos) << e.what();
  }
  cfg.layers = {8, 0};
  EXPECT_THROW(NeuMF(cfg, Device::kCpu), Error);
  cfg.layers = {8, 4};
  cfg.mf_dim = 0;
  EXPECT_THROW(NeuMF(cfg, Device::kCpu), Error);
}

TEST(NeuMF, BackwardWithoutForwardThrows) {
  NeuMFConfig cfg;
  NeuMF m(cfg, Device::kCpu);
  m.init(1);
  EXPECT_THROW(m.backward(cpu(1), nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace ncf
