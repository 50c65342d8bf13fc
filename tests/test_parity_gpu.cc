// Backend parity (shared/DESIGN.md): every CUDA op against its CPU twin on the
// same seeded random inputs, over a sweep of shapes (empty, one row, duplicate-
// heavy ids, widths 1, 3, 5, 8, 64, 192, misaligned rows), then train_step itself
// (lookup, forward, loss, backward, Adam on the dense net and the tables) for a
// few steps on both devices. A value passes when |gpu − cpu| ≤ atol + rtol·|cpu|
// with the tolerances written at each test (the BF16 GEMMs: relative to the sum
// of |products|); ids, counts, copies, the sort-and-reduce sums, sampled
// negatives and single BF16 products must match bit for bit.
//
// Without a usable GPU only the device half is skipped: every test still makes
// its inputs and calls the CPU reference, so an input the reference refuses, or
// a reference that throws, fails in CI on machines without a GPU. The device
// calls then run on a one-thread CPU context standing in for the GPU (the
// reference runs on two threads), so the comparisons check the test's own
// plumbing and the CPU ops' thread-count invariance within the same
// tolerances; the test ends as skipped, with the reason, since nothing ran on
// a GPU. Tests of what only the GPU does (errors recorded by kernels and raised
// by a later check) skip after their CPU half.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "comm/single_communicator.h"
#include "common/bf16.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/device.h"
#include "data/dataset.h"
#include "data/negatives.h"
#include "data/reader.h"
#include "embedding/collection.h"
#include "embedding/embedding_kernels.h"
#include "embedding/plan.h"
#include "embedding/table_ops.h"
#include "model/metrics.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "model/optim.h"
#include "model/topk.h"
#include "test_util.h"
#include "train/step.h"

namespace ncf {
namespace {

using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;
using LVec = std::vector<int64_t>;

// ---- tolerances ----------------------------------------------------------------------
// FP32 GEMMs: cuBLAS and OpenBLAS sum the K products in different orders; the
// difference of two K-term float sums of values in [-1, 1] grows like sqrt(K).
constexpr double kGemmRtol = 1e-5, kGemmAtolPerSqrtK = 1e-5;
// TF32 rounds both factors to 10 mantissa bits (~5e-4 each): about 1e-3 per
// product, again growing like sqrt(K).
constexpr double kTf32Rtol = 2e-3, kTf32AtolPerSqrtK = 4e-3;
// BF16 GEMMs (MathMode::kBf16): both devices round the same FP32 inputs to BF16
// with the same function (common/bf16.h), and a product of two BF16 values is
// exact in FP32, so only the order of the FP32 sums differs. Measured against
// S = Σ_k |product_k| of the element: the worst case of two K-term FP32 sums
// is ~K·2^-24·S each (6e-5 at K = 1000), the typical one far lower.
constexpr double kBf16TermsRtol = 1e-4;
// Element-wise float formulas: nvcc contracts a·b + c into one FMA (one rounding
// fewer) and CUDA's expf is within 2 ulp, so results differ by a few ulp.
constexpr double kElemRtol = 1e-5, kElemAtol = 1e-7;
// Sums in double, rounded to float once at the end (head, bias gradients).
constexpr double kDoubleSumRtol = 1e-6, kDoubleSumAtol = 1e-7;
// Sums in double throughout (loss, NDCG).
constexpr double kDoubleRtol = 1e-12, kDoubleAtol = 1e-15;

// ---- helpers ---------------------------------------------------------------------------

Vec random_vec(size_t n, std::mt19937& gen, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

IVec random_ids(size_t n, int32_t lo, int32_t hi, std::mt19937& gen) {  // [lo, hi)
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  IVec v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// n distinct rows of [0, R), ascending.
IVec random_unique_rows(int64_t R, int64_t n, std::mt19937& gen) {
  IVec all(static_cast<size_t>(R));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

// Where the device half's buffers live: the GPU, or the host when the device
// half runs on the CPU stand-in (set by the fixture before every test).
Device g_dev = Device::kCuda;

template <typename T>
Buffer<T> up(const std::vector<T>& h) {
  Buffer<T> b(g_dev, h.size());
  device_copy(g_dev, b.data(), Device::kCpu, h.data(), h.size() * sizeof(T));
  return b;
}

// The first n elements of a buffer on either device (cudaMemcpy on the legacy
// stream waits for the context's blocking stream).
template <typename T>
std::vector<T> down(const Buffer<T>& b, size_t n) {
  std::vector<T> h(n);
  device_copy(Device::kCpu, h.data(), b.device(), b.data(), n * sizeof(T));
  return h;
}
template <typename T>
std::vector<T> down(const Buffer<T>& b) {
  return down(b, b.size());
}

// |gpu − cpu| ≤ atol + rtol·|cpu| element-wise; NaN must meet NaN.
template <typename T>
void expect_close(const std::vector<T>& gpu, const std::vector<T>& cpu, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int reported = 0;
  size_t bad = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    const double g = gpu[k], c = cpu[k];
    bool ok = std::isnan(c) ? std::isnan(g) : std::fabs(g - c) <= atol + rtol * std::fabs(c);
    if (!ok) {
      ++bad;
      if (reported++ < 5)
        ADD_FAILURE() << what << " [" << k << "]: gpu " << g << ", cpu " << c << " (|diff| "
                      << std::fabs(g - c) << " > " << atol + rtol * std::fabs(c) << ")";
    }
  }
  if (bad > 5) ADD_FAILURE() << what << ": " << bad << " elements out of tolerance in all";
}

// A mean BCE loss computed (in double) from two sets of logits that differ: the loss is a
// weighted mean of per-sample terms whose derivative in their logit, σ(z) − y, is at most
// 1 in size, so the two means differ by at most the largest logit difference (plus the
// double sums' own rounding). The device's logits differ from the CPU's by FMA
// contraction and CUDA's expf, so its loss is held to that, not to the double bound.
void expect_loss_close(double gpu, double cpu, const std::vector<float>& gpu_logits,
                       const std::vector<float>& cpu_logits, double double_atol, double double_rtol,
                       const std::string& what) {
  ASSERT_EQ(gpu_logits.size(), cpu_logits.size()) << what;
  double dz = 0.0;
  for (size_t k = 0; k < gpu_logits.size(); ++k)
    dz = std::max(dz, std::fabs(double(gpu_logits[k]) - double(cpu_logits[k])));
  EXPECT_LE(std::fabs(gpu - cpu), dz + double_atol + double_rtol * std::fabs(cpu))
      << what << ": gpu " << gpu << ", cpu " << cpu << ", largest logit difference " << dz;
}

// Bit-for-bit equality (floats compared as bits, so -0 vs 0 or NaN payloads count).
template <typename T>
void expect_same(const std::vector<T>& gpu, const std::vector<T>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int reported = 0;
  size_t bad = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    if (std::memcmp(&gpu[k], &cpu[k], sizeof(T)) != 0) {
      ++bad;
      if (reported++ < 5)
        ADD_FAILURE() << what << " [" << k << "]: gpu " << +gpu[k] << ", cpu " << +cpu[k];
    }
  }
  if (bad > 5) ADD_FAILURE() << what << ": " << bad << " elements differ in all";
}

std::string shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::ostringstream os;
  for (const auto& [name, v] : dims) os << name << "=" << v << " ";
  return os.str();
}

class Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_.threads = 2;
    set_math_mode(MathMode::kFp32);
    if (cuda_available(&no_gpu_)) {
      gpu_ = make_cuda_context(0);
      g_dev = Device::kCuda;
      return;
    }
    if (test::gpu_required()) FAIL() << "NCF_REQUIRE_GPU=1 but there is no usable GPU: " << no_gpu_;
    gpu_ = ExecContext{};  // the CPU stand-in: one thread
    gpu_.threads = 1;
    g_dev = Device::kCpu;
  }
  void TearDown() override {
    set_math_mode(MathMode::kTf32);
    set_step_kernels(StepKernels::kStreaming);
    set_layer0_by_item(Layer0ByItem::kAuto);
    set_negatives_ahead(true);
    set_run_sums_by_warp(true);
    set_scatter_rows_by_four(true);
    set_narrow_item_lookups(true);
    set_score_items_fused(false);
    set_lt_bf16_out(true);
    if (gpu_.device != Device::kCuda) {
      // Failures of the CPU half stay failures: gtest reports a test as skipped
      // only when nothing failed.
      if (!HasFailure())
        GTEST_SKIP() << "device half skipped (no usable GPU: " << no_gpu_
                     << "); the inputs and the CPU reference ran";
      return;
    }
    EXPECT_NO_THROW(check_device_errors(gpu_)) << "a kernel recorded bad input";
    destroy_cuda_context(gpu_);
  }
  bool on_gpu() const { return gpu_.device == Device::kCuda; }
  // The CPU model's seeded init with non-zero tower biases (drawn from gen_), and the
  // same parameters in the device model.
  void same_parameters(NeuMF& cpu_model, NeuMF& dev_model) {
    cpu_model.init(5);
    Vec params(cpu_model.params().data(), cpu_model.params().data() + cpu_model.num_params());
    const Vec noise = random_vec(params.size(), gen_, -0.1f, 0.1f);
    for (const DenseLayerView& v : cpu_model.tower())
      for (int j = 0; j < v.out; ++j) params[size_t(v.b_offset + j)] = noise[size_t(j)];
    std::copy(params.begin(), params.end(), cpu_model.params().data());
    device_copy(g_dev, dev_model.params().data(), Device::kCpu, params.data(),
                params.size() * sizeof(float));
  }

  ExecContext cpu_;
  ExecContext gpu_;
  std::string no_gpu_;
  std::mt19937 gen_{20240611};
};

// In a test of what only the GPU does: past this point the test needs one.
#define DEVICE_HALF_NEEDS_A_GPU()                                                            \
  do {                                                                                       \
    if (!on_gpu()) GTEST_SKIP() << "device half skipped (no usable GPU: " << no_gpu_ << ")"; \
  } while (0)

const int kWidths[] = {1, 3, 5, 8, 64, 192};
const int64_t kBatches[] = {0, 1, 7, 1000};

// ---- ops.h ------------------------------------------------------------------------------

TEST_F(Parity, Fill) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    Vec c(n, -1.0f);
    Buffer<float> g = up(c);
    fill(cpu_, c.data(), n, 2.5f);
    fill(gpu_, g.data(), n, 2.5f);
    expect_same(down(g), c, shape({{"n", n}}));
  }
}

// C = alpha·op(A)·op(B) + beta·C, both devices, padded leading dimensions.
void gemm_case(const ExecContext& cpu, const ExecContext& gpu, std::mt19937& gen, bool ta, bool tb,
               int M, int N, int K, float beta, double atol_per_sqrt_k, double rtol) {
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
  const int a_rows = ta ? K : M, b_rows = tb ? N : K;
  Vec A = random_vec(size_t(a_rows) * lda, gen), Bm = random_vec(size_t(b_rows) * ldb, gen);
  Vec C = random_vec(size_t(M) * ldc, gen);
  if (beta == 0.0f) std::fill(C.begin(), C.end(), std::numeric_limits<float>::quiet_NaN());
  Buffer<float> gA = up(A), gB = up(Bm), gC = up(C);
  gemm(cpu, ta, tb, M, N, K, 1.5f, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
  gemm(gpu, ta, tb, M, N, K, 1.5f, gA.data(), lda, gB.data(), ldb, beta, gC.data(), ldc);
  const double atol = atol_per_sqrt_k * 1.5 * std::sqrt(std::max(K, 1));
  expect_close(down(gC), C, atol, rtol,
               shape({{"ta", ta}, {"tb", tb}, {"M", M}, {"N", N}, {"K", K}}) +
                   "beta=" + std::to_string(beta));
}

const int kGemmShapes[][3] = {{0, 3, 4}, {3, 0, 4},     {5, 7, 0},       {1, 1, 1},
                              {7, 5, 3}, {1000, 8, 64}, {64, 192, 1000}, {3, 5, 192}};

TEST_F(Parity, GemmFp32AllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : kGemmShapes)
        for (float beta : {0.0f, 0.5f})
          gemm_case(cpu_, gpu_, gen_, ta, tb, s[0], s[1], s[2], beta, kGemmAtolPerSqrtK, kGemmRtol);
}

TEST_F(Parity, GemmTf32AllTransposes) {
  set_math_mode(MathMode::kTf32);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : kGemmShapes)
        gemm_case(cpu_, gpu_, gen_, ta, tb, s[0], s[1], s[2], 0.5f, kTf32AtolPerSqrtK, kTf32Rtol);
}

const int kLayerShapes[][2] = {{1, 1}, {3, 5}, {5, 3}, {8, 64}, {64, 192}, {192, 64}};

// weights and bias sit at float offset `offset` of a flat buffer, as in NeuMF's
// parameter buffer: offset 1 leaves them only 4-byte aligned.
void linear_forward_sweep(const ExecContext& cpu, const ExecContext& gpu, std::mt19937& gen,
                          double atol_per_sqrt_k, double rtol) {
  for (const auto& s : kLayerShapes)
    for (int64_t B : kBatches)
      for (int offset : {0, 1})
        for (bool with_bias : {false, true})
          for (bool relu : {false, true}) {
            const int in = s[0], out = s[1];
            Vec X = random_vec(size_t(B) * in, gen);
            Vec P = random_vec(size_t(offset) + size_t(out) * in + out, gen);
            Vec Y(size_t(B) * out, 7.0f);
            Buffer<float> gX = up(X), gP = up(P), gY = up(Y);
            const float* weights = P.data() + offset;
            const float* bias = with_bias ? weights + size_t(out) * in : nullptr;
            const float* gweights = gP.data() + offset;
            const float* gbias = with_bias ? gweights + size_t(out) * in : nullptr;
            linear_forward(cpu, X.data(), weights, bias, Y.data(), B, in, out, relu);
            linear_forward(gpu, gX.data(), gweights, gbias, gY.data(), B, in, out, relu);
            expect_close(down(gY), Y, atol_per_sqrt_k * std::sqrt(in), rtol,
                         shape({{"B", B},
                                {"in", in},
                                {"out", out},
                                {"offset", offset},
                                {"bias", with_bias},
                                {"relu", relu}}));
          }
}

TEST_F(Parity, LinearForwardFp32) {
  linear_forward_sweep(cpu_, gpu_, gen_, kGemmAtolPerSqrtK, kGemmRtol);
}

TEST_F(Parity, LinearForwardTf32) {
  set_math_mode(MathMode::kTf32);
  linear_forward_sweep(cpu_, gpu_, gen_, kTf32AtolPerSqrtK, kTf32Rtol);
}

TEST_F(Parity, LinearBackwardFp32) {
  for (const auto& s : kLayerShapes)
    for (int64_t B : kBatches)
      for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate})
        for (int variant = 0; variant < 4; ++variant) {
          // 0: relu, dX and db; 1: no relu (Y null); 2: relu, no db (mask kernel); 3: relu, no dX.
          const bool relu = variant != 1, with_db = variant != 2, with_dx = variant != 3;
          const int in = s[0], out = s[1];
          const std::string what = shape({{"B", B},
                                          {"in", in},
                                          {"out", out},
                                          {"variant", variant},
                                          {"accumulate", mode == GradMode::kAccumulate}});
          Vec X = random_vec(size_t(B) * in, gen_), weights = random_vec(size_t(out) * in, gen_);
          Vec Y = random_vec(size_t(B) * out, gen_);  // a post-ReLU output: about half zeros
          for (float& y : Y) y = std::max(y, 0.0f);
          Vec dY = random_vec(size_t(B) * out, gen_), dX(size_t(B) * in, 9.0f);
          Vec dweights = random_vec(size_t(out) * in, gen_), db = random_vec(out, gen_);
          Buffer<float> gX = up(X), gweights = up(weights), gY = up(Y), gdY = up(dY), gdX = up(dX),
                        gdweights = up(dweights), gdb = up(db);
          linear_backward(cpu_, X.data(), weights.data(), relu ? Y.data() : nullptr, dY.data(),
                          with_dx ? dX.data() : nullptr, dweights.data(),
                          with_db ? db.data() : nullptr, B, in, out, relu, mode);
          linear_backward(gpu_, gX.data(), gweights.data(), relu ? gY.data() : nullptr, gdY.data(),
                          with_dx ? gdX.data() : nullptr, gdweights.data(),
                          with_db ? gdb.data() : nullptr, B, in, out, relu, mode);
          expect_same(down(gdY), dY, what + "dZ (masked dY)");
          expect_close(down(gdX), dX, kGemmAtolPerSqrtK * std::sqrt(out), kGemmRtol, what + "dX");
          expect_close(down(gdweights), dweights,
                       kGemmAtolPerSqrtK * std::sqrt(std::max<int64_t>(B, 1)), kGemmRtol,
                       what + "dweights");
          expect_close(down(gdb), db, kDoubleSumAtol, kDoubleSumRtol, what + "db");
        }
}

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

TEST_F(Parity, GmfForwardBackwardOnStridedRows) {
  for (int64_t B : kBatches)
    for (int mf : kWidths) {
      const int64_t ld = mf + 3;  // rows carry more columns than the GMF part
      const std::string what = shape({{"B", B}, {"mf", mf}});
      Vec urows = random_vec(size_t(B) * ld, gen_), irows = random_vec(size_t(B) * ld, gen_);
      Vec G(size_t(B) * mf, 5.0f), dG = random_vec(size_t(B) * mf, gen_);
      Vec durows(size_t(B) * ld, 5.0f), dirows(size_t(B) * ld, 6.0f);
      Buffer<float> gurows = up(urows), girows = up(irows), gG = up(G), gdG = up(dG),
                    gdurows = up(durows), gdirows = up(dirows);
      gmf_forward(cpu_, urows.data(), ld, irows.data(), ld, G.data(), mf, B, mf);
      gmf_forward(gpu_, gurows.data(), ld, girows.data(), ld, gG.data(), mf, B, mf);
      gmf_backward(cpu_, urows.data(), ld, irows.data(), ld, dG.data(), mf, durows.data(), ld,
                   dirows.data(), ld, B, mf);
      gmf_backward(gpu_, gurows.data(), ld, girows.data(), ld, gdG.data(), mf, gdurows.data(), ld,
                   gdirows.data(), ld, B, mf);
      // One product per element: no rounding difference is possible.
      expect_same(down(gG), G, what + "G");
      expect_same(down(gdurows), durows, what + "durows (columns >= mf untouched)");
      expect_same(down(gdirows), dirows, what + "dirows");
    }
}

// Groups of S rows sharing a per-group row: the copy and the forward add are
// exact on both devices, and so are the group sums (double, s order); only the
// bias column sums may differ in summation order.
TEST_F(Parity, GroupOpsForwardAndBackward) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3000}})
    for (int S : {1, 5, 51})
      for (int w : {1, 8, 64}) {
        const std::string what = shape({{"n", n}, {"S", S}, {"w", w}});
        const int64_t B = n * S, ldx = w + 3;
        Vec X = random_vec(size_t(n) * ldx, gen_), R(size_t(B) * w, 9.0f);
        Buffer<float> gX = up(X), gR = up(R);
        repeat_rows(cpu_, X.data(), ldx, w, R.data(), n, S);
        repeat_rows(gpu_, gX.data(), ldx, w, gR.data(), n, S);
        expect_same(down(gR), R, what + " repeat_rows");
        Vec Y = random_vec(size_t(B) * w, gen_), U = random_vec(size_t(n) * w, gen_),
            bias = random_vec(size_t(w), gen_);
        Buffer<float> gY = up(Y), gU = up(U), gb = up(bias);
        group_bias_act(cpu_, Y.data(), U.data(), bias.data(), n, S, w, true);
        group_bias_act(gpu_, gY.data(), gU.data(), gb.data(), n, S, w, true);
        expect_same(down(gY), Y, what + " group_bias_act");
        Vec dY = random_vec(size_t(B) * w, gen_), dU(size_t(n) * (w + 2), 7.0f),
            db(static_cast<size_t>(w));
        Buffer<float> gdY = up(dY), gdU = up(dU), gdb = up(db);
        group_sum_backward(cpu_, Y.data(), dY.data(), n, S, w, dU.data(), w + 2, db.data(), true);
        group_sum_backward(gpu_, gY.data(), gdY.data(), n, S, w, gdU.data(), w + 2, gdb.data(),
                           true);
        expect_same(down(gdY), dY, what + " masked dY");
        expect_same(down(gdU), dU, what + " group sums (padding untouched)");
        const Vec gpu_db = down(gdb);
        for (int j = 0; j < w; ++j)
          EXPECT_NEAR(gpu_db[size_t(j)], db[size_t(j)], 1e-5 + 1e-5 * std::fabs(db[size_t(j)]))
              << what << " db[" << j << "]";
      }
}

// The users'/items' join of layer 0 in one op: the CPU adds the group rows and
// the bias inside each block's product, the GPU after its GEMM; FP32 products
// on both, so they agree to the GEMM tolerance, over strided inputs and a
// weight slice of a wider layer, across several of the CPU's row blocks.
TEST_F(Parity, GroupLinearForwardFp32) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{450}})
    for (int S : {1, 5})
      for (bool relu : {false, true}) {
        const int in = 48, out = 40, ldx = in + 16, ldw = 2 * in;
        const std::string what = shape({{"n", n}, {"S", S}, {"relu", relu}});
        const int64_t B = n * S;
        Vec X = random_vec(size_t(B) * ldx, gen_), W = random_vec(size_t(out) * ldw, gen_),
            U = random_vec(size_t(n) * out, gen_), bias = random_vec(size_t(out), gen_),
            Y(size_t(B) * out, 7.0f);
        Buffer<float> gX = up(X), gW = up(W), gU = up(U), gb = up(bias), gY = up(Y);
        group_linear_forward(cpu_, X.data(), ldx, W.data() + in, ldw, U.data(), bias.data(),
                             Y.data(), n, S, in, out, relu);
        group_linear_forward(gpu_, gX.data(), ldx, gW.data() + in, ldw, gU.data(), gb.data(),
                             gY.data(), n, S, in, out, relu);
        expect_close(down(gY), Y, kGemmAtolPerSqrtK * std::sqrt(in), kGemmRtol, what);
      }
}

TEST_F(Parity, ConcatSplitScalarAndVectorPaths) {
  // (wa, wc, pad): {4, 8, 0} and {64, 192, 4} take the float4 path.
  const int cases[][3] = {{1, 1, 0}, {3, 5, 1}, {4, 8, 0}, {8, 3, 2}, {64, 192, 4}, {5, 64, 3}};
  for (int64_t B : kBatches)
    for (const auto& c : cases) {
      const int wa = c[0], wc = c[1], pad = c[2];
      const int64_t lda = wa + pad, ldc = wc + pad, w = wa + wc;
      const std::string what = shape({{"B", B}, {"wa", wa}, {"wc", wc}, {"pad", pad}});
      Vec A = random_vec(size_t(B) * lda, gen_), C = random_vec(size_t(B) * ldc, gen_);
      Vec Y(size_t(B) * w, 0.0f), dA(size_t(B) * lda, 3.0f), dC(size_t(B) * ldc, 4.0f);
      Buffer<float> gA = up(A), gC = up(C), gY = up(Y), gdA = up(dA), gdC = up(dC);
      concat_cols(cpu_, A.data(), lda, wa, C.data(), ldc, wc, Y.data(), B);
      concat_cols(gpu_, gA.data(), lda, wa, gC.data(), ldc, wc, gY.data(), B);
      expect_same(down(gY), Y, what + "concat");
      split_cols(cpu_, Y.data(), wa, wc, dA.data(), lda, dC.data(), ldc, B);
      split_cols(gpu_, gY.data(), wa, wc, gdA.data(), lda, gdC.data(), ldc, B);
      expect_same(down(gdA), dA, what + "split A");
      expect_same(down(gdC), dC, what + "split C");
    }
}

TEST_F(Parity, HeadForwardBackward) {
  for (int64_t B : kBatches)
    for (int F : kWidths)
      for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate}) {
        const std::string what =
            shape({{"B", B}, {"F", F}, {"accumulate", mode == GradMode::kAccumulate}});
        Vec H = random_vec(size_t(B) * F, gen_), wc = random_vec(size_t(F) + 1, gen_);
        Vec logits(B, 0.0f), dlogits = random_vec(B, gen_), dH(size_t(B) * F, 2.0f);
        Vec dwc = random_vec(size_t(F) + 1, gen_);  // dw [F] then dc, as in NeuMF's layout
        Buffer<float> gH = up(H), gwc = up(wc), glogits = up(logits), gdlogits = up(dlogits),
                      gdH = up(dH), gdwc = up(dwc);
        head_forward(cpu_, H.data(), wc.data(), wc.data() + F, logits.data(), B, F);
        head_forward(gpu_, gH.data(), gwc.data(), gwc.data() + F, glogits.data(), B, F);
        // CPU: one sequential float sum; GPU: 32 lane sums and a butterfly.
        expect_close(down(glogits), logits, 1e-6 * F, kElemRtol, what + "logits");
        head_backward(cpu_, H.data(), wc.data(), dlogits.data(), dH.data(), dwc.data(),
                      dwc.data() + F, B, F, mode);
        head_backward(gpu_, gH.data(), gwc.data(), gdlogits.data(), gdH.data(), gdwc.data(),
                      gdwc.data() + F, B, F, mode);
        expect_same(down(gdH), dH, what + "dH");
        expect_close(down(gdwc), dwc, kDoubleSumAtol, kDoubleSumRtol, what + "dw, dc");
      }
}

// Batches past kColGroup · 256 rows take the column sums' middle pass (group
// sums of 64 chunk partials): B = 64·256 + 1 (65 chunks: a group of one) and the
// ml-20m batch 2^20 (4096 chunks). Same tolerance as above, and the GPU result
// must be the same bits on a second run (fixed order, no atomics).
TEST_F(Parity, ColumnSumsAtLargeBatches) {
  for (int64_t B : {int64_t{64 * 256 + 1}, int64_t{1} << 20}) {
    for (int F : {1, 128}) {  // head: dw [F] and dc
      const std::string what = shape({{"B", B}, {"F", F}});
      Vec H = random_vec(size_t(B) * F, gen_), wc = random_vec(size_t(F) + 1, gen_);
      Vec dlogits = random_vec(B, gen_, -1.0f / 1024, 1.0f / 1024), dH(size_t(B) * F, 0.0f);
      Vec dwc(size_t(F) + 1, 0.0f);
      Buffer<float> gH = up(H), gwc = up(wc), gdlogits = up(dlogits), gdH = up(dH), gdwc = up(dwc);
      head_backward(cpu_, H.data(), wc.data(), dlogits.data(), dH.data(), dwc.data(),
                    dwc.data() + F, B, F, GradMode::kOverwrite);
      head_backward(gpu_, gH.data(), gwc.data(), gdlogits.data(), gdH.data(), gdwc.data(),
                    gdwc.data() + F, B, F, GradMode::kOverwrite);
      const Vec first = down(gdwc);
      expect_close(first, dwc, kDoubleSumAtol, kDoubleSumRtol, what + "head dw, dc");
      head_backward(gpu_, gH.data(), gwc.data(), gdlogits.data(), gdH.data(), gdwc.data(),
                    gdwc.data() + F, B, F, GradMode::kOverwrite);
      expect_same(down(gdwc), first, what + "head dw, dc on a second run");
    }
    // Linear bias gradients: db = column sums of the masked dY (out = 256, the
    // widest MLPerf layer); in = 8 keeps the GEMMs small.
    const int in = 8, out = 256;
    const std::string what = shape({{"B", B}, {"in", in}, {"out", out}});
    Vec X = random_vec(size_t(B) * in, gen_), W = random_vec(size_t(out) * in, gen_);
    Vec Y = random_vec(size_t(B) * out, gen_);
    for (float& y : Y) y = std::max(y, 0.0f);
    Vec dY = random_vec(size_t(B) * out, gen_, -1.0f / 1024, 1.0f / 1024);
    Vec dW(size_t(out) * in, 0.0f), db(out, 0.0f);
    Buffer<float> gX = up(X), gW = up(W), gY = up(Y), gdW = up(dW), gdb = up(db);
    Buffer<float> gdY = up(dY);
    linear_backward(cpu_, X.data(), W.data(), Y.data(), dY.data(), nullptr, dW.data(), db.data(), B,
                    in, out, true, GradMode::kOverwrite);
    linear_backward(gpu_, gX.data(), gW.data(), gY.data(), gdY.data(), nullptr, gdW.data(),
                    gdb.data(), B, in, out, true, GradMode::kOverwrite);
    const Vec first = down(gdb);
    expect_close(first, db, kDoubleSumAtol, kDoubleSumRtol, what + "db");
    // dY is masked in place already; masking again changes nothing.
    linear_backward(gpu_, gX.data(), gW.data(), gY.data(), gdY.data(), nullptr, gdW.data(),
                    gdb.data(), B, in, out, true, GradMode::kOverwrite);
    expect_same(down(gdb), first, what + "db on a second run");
  }
}

// The streaming kernels (StepKernels::kStreaming, the default: the masked
// reductions and group_bias_act) against the legacy kernels they replace, both
// on the GPU, on the same inputs: the same values computed in the same order, so
// every output must be the same bits (the masked dZ, the group sums, db, the
// GEMMs that read dZ, the joined layer-0 rows). Shapes take every path: float4
// rows and scalar ones (a width not a multiple of 4, rows one float off 16-byte
// alignment), dYg rows that take float4 stores or not, groups longer than the
// rows loaded before the first store (S = 51), a bias slice off alignment, and
// the ml-20m MLPerf step's shapes (on a GPU only); Y carries NaN (masked to 0),
// dY -0 (kept where Y > 0), and Y + Yg is exactly 0 here and there. Both are also
// held to the CPU twin: the masks, group sums and joins bit for bit.
// (No NaN in dY: a sum with a NaN gives the CPU's payload on the host and the
// canonical NaN on the GPU, so the twins would differ in bits, not in meaning.)
void set_specials(Vec& Y, Vec& dY) {
  for (size_t k = 0; k < Y.size(); k += 97) Y[k] = std::numeric_limits<float>::quiet_NaN();
  for (size_t k = 5; k < dY.size(); k += 89) dY[k] = -0.0f;
}

TEST_F(Parity, StreamingStepKernelsAreTheLegacyKernelsBitForBit) {
  struct GroupCase {
    int64_t n;
    int S, w;
    int64_t lddyg, out_offset, in_offset;
    bool relu;
  };
  const GroupCase groups[] = {
      {0, 5, 256, 256, 0, 0, true},      {1, 1, 4, 4, 0, 0, true},
      {3000, 5, 256, 256, 0, 0, true},   {3000, 5, 64, 192, 0, 0, false},
      {3000, 5, 128, 192, 64, 0, false}, {777, 51, 128, 130, 0, 0, true},
      {100, 5, 7, 7, 0, 0, true},        {100, 9, 64, 64, 1, 1, true},
      {209715, 5, 256, 256, 0, 0, true}};  // ml-20m-mlperf's layer 0 (GPU only)
  for (const GroupCase& c : groups) {
    const int64_t B = c.n * c.S;
    if (!on_gpu() && B * c.w > (int64_t{1} << 24)) continue;  // the stand-in skips the largest
    const std::string what = shape({{"n", c.n},
                                    {"S", c.S},
                                    {"w", c.w},
                                    {"lddyg", c.lddyg},
                                    {"offset", c.in_offset},
                                    {"relu", c.relu}});
    const size_t rows = size_t(B) * c.w + size_t(c.in_offset);
    Vec Y = random_vec(rows, gen_), dY = random_vec(rows, gen_, -1.0f / 64, 1.0f / 64);
    for (float& y : Y) y = std::max(y, 0.0f);
    set_specials(Y, dY);
    const size_t out_rows = size_t(c.n) * c.lddyg + size_t(c.out_offset);
    Vec dU(out_rows, 7.0f), db(size_t(c.w), 0.0f);
    Buffer<float> gY = up(Y), gdY_s = up(dY), gdY_l = up(dY), gdU_s = up(dU), gdU_l = up(dU),
                  gdb_s = up(db), gdb_l = up(db);
    const int64_t off = c.in_offset;
    float* dbp = c.relu ? db.data() : nullptr;
    group_sum_backward(cpu_, Y.data() + off, dY.data() + off, c.n, c.S, c.w,
                       dU.data() + c.out_offset, c.lddyg, dbp, c.relu);
    set_step_kernels(StepKernels::kLegacy);
    group_sum_backward(gpu_, gY.data() + off, gdY_l.data() + off, c.n, c.S, c.w,
                       gdU_l.data() + c.out_offset, c.lddyg, c.relu ? gdb_l.data() : nullptr,
                       c.relu);
    set_step_kernels(StepKernels::kStreaming);
    group_sum_backward(gpu_, gY.data() + off, gdY_s.data() + off, c.n, c.S, c.w,
                       gdU_s.data() + c.out_offset, c.lddyg, c.relu ? gdb_s.data() : nullptr,
                       c.relu);
    const Vec stream_dy = down(gdY_s), stream_du = down(gdU_s);
    expect_same(stream_dy, dY, what + "streaming masked dY vs the CPU twin");
    expect_same(stream_du, dU, what + "streaming group sums vs the CPU twin (padding untouched)");
    expect_same(stream_dy, down(gdY_l), what + "masked dY, streaming vs legacy");
    expect_same(stream_du, down(gdU_l), what + "group sums, streaming vs legacy");
    expect_same(down(gdb_s), down(gdb_l), what + "db, streaming vs legacy");
  }

  // group_bias_act: the forward join of layer 0 (rows of Y plus their group's row
  // of Yg plus the bias, then the ReLU).
  for (const GroupCase& c : groups)
    for (bool with_bias : {true, false}) {
      const int64_t B = c.n * c.S;
      if (!on_gpu() && B * c.w > (int64_t{1} << 24)) continue;
      const std::string what = shape({{"n", c.n},
                                      {"S", c.S},
                                      {"w", c.w},
                                      {"offset", c.in_offset},
                                      {"relu", c.relu},
                                      {"bias", with_bias}});
      const int64_t off = c.in_offset;
      Vec Y = random_vec(size_t(B) * c.w + size_t(off), gen_);
      Vec U = random_vec(size_t(c.n) * c.w + size_t(off), gen_),
          bias = random_vec(size_t(c.w) + 1, gen_);
      for (int64_t k = 3; k < B * c.w; k += 101) {  // Y + Yg exactly 0 here and there
        const int64_t b = k / c.w, j = k % c.w;
        Y[size_t(off + k)] = -U[size_t(off + (b / c.S) * c.w + j)];
      }
      Buffer<float> gY_s = up(Y), gY_l = up(Y), gU = up(U), gb = up(bias);
      // bias + 1: a bias slice that starts off 16-byte alignment, as a layer's may.
      group_bias_act(cpu_, Y.data() + off, U.data() + off, with_bias ? bias.data() + 1 : nullptr,
                     c.n, c.S, c.w, c.relu);
      set_step_kernels(StepKernels::kLegacy);
      group_bias_act(gpu_, gY_l.data() + off, gU.data() + off, with_bias ? gb.data() + 1 : nullptr,
                     c.n, c.S, c.w, c.relu);
      set_step_kernels(StepKernels::kStreaming);
      group_bias_act(gpu_, gY_s.data() + off, gU.data() + off, with_bias ? gb.data() + 1 : nullptr,
                     c.n, c.S, c.w, c.relu);
      const Vec got = down(gY_s);
      expect_same(got, Y, what + "group_bias_act, streaming vs the CPU twin");
      expect_same(got, down(gY_l), what + "group_bias_act, streaming vs legacy");
    }

  struct LinearCase {
    int64_t B;
    int in, out;
    int64_t offset;
  };
  const LinearCase linears[] = {
      {0, 8, 256, 0},         {1, 5, 3, 0},         {1000, 8, 256, 0},
      {1000, 5, 3, 1},        {1000, 64, 8, 1},     {64 * 256 + 1, 256, 128, 0},
      {1048575, 256, 128, 0}, {1048575, 128, 64, 0}};  // the last two: GPU only
  for (const LinearCase& c : linears)
    for (bool relu : {true, false})
      for (bool with_db : {true, false})
        for (GradMode mode : {GradMode::kOverwrite, GradMode::kAccumulate}) {
          if (!relu && !with_db) continue;  // nothing masked, nothing summed: no kernel of these
          if (!on_gpu() && c.B * std::max(c.in, c.out) > (int64_t{1} << 24)) continue;
          if (c.B > (int64_t{1} << 16) && mode == GradMode::kAccumulate) continue;  // time
          const std::string what = shape({{"B", c.B},
                                          {"in", c.in},
                                          {"out", c.out},
                                          {"offset", c.offset},
                                          {"relu", relu},
                                          {"db", with_db},
                                          {"accumulate", mode == GradMode::kAccumulate}});
          const int64_t off = c.offset;
          Vec X = random_vec(size_t(c.B) * c.in, gen_), W = random_vec(size_t(c.out) * c.in, gen_);
          Vec Y = random_vec(size_t(c.B) * c.out + size_t(off), gen_);
          for (float& y : Y) y = std::max(y, 0.0f);
          Vec dY = random_vec(Y.size(), gen_, -1.0f / 1024, 1.0f / 1024);
          set_specials(Y, dY);
          Vec dX(size_t(c.B) * c.in, 9.0f), dW = random_vec(size_t(c.out) * c.in, gen_),
                                            db = random_vec(size_t(c.out), gen_);
          Buffer<float> gX = up(X), gW = up(W), gY = up(Y);
          Buffer<float> gdY_s = up(dY), gdX_s = up(dX), gdW_s = up(dW), gdb_s = up(db);
          Buffer<float> gdY_l = up(dY), gdX_l = up(dX), gdW_l = up(dW), gdb_l = up(db);
          if (c.B * std::max(c.in, c.out) <=
              (int64_t{1} << 23)) {  // the CPU twin: the mask bit for bit
            linear_backward(cpu_, X.data(), W.data(), relu ? Y.data() + off : nullptr,
                            dY.data() + off, dX.data(), dW.data(), with_db ? db.data() : nullptr,
                            c.B, c.in, c.out, relu, mode);
          }
          set_step_kernels(StepKernels::kLegacy);
          linear_backward(gpu_, gX.data(), gW.data(), relu ? gY.data() + off : nullptr,
                          gdY_l.data() + off, gdX_l.data(), gdW_l.data(),
                          with_db ? gdb_l.data() : nullptr, c.B, c.in, c.out, relu, mode);
          set_step_kernels(StepKernels::kStreaming);
          linear_backward(gpu_, gX.data(), gW.data(), relu ? gY.data() + off : nullptr,
                          gdY_s.data() + off, gdX_s.data(), gdW_s.data(),
                          with_db ? gdb_s.data() : nullptr, c.B, c.in, c.out, relu, mode);
          const Vec stream_dy = down(gdY_s);
          if (c.B * std::max(c.in, c.out) <= (int64_t{1} << 23))
            expect_same(stream_dy, dY, what + "streaming dZ vs the CPU twin");
          expect_same(stream_dy, down(gdY_l), what + "dZ, streaming vs legacy");
          expect_same(down(gdb_s), down(gdb_l), what + "db, streaming vs legacy");
          expect_same(down(gdW_s), down(gdW_l), what + "dweights, streaming vs legacy");
          expect_same(down(gdX_s), down(gdX_l), what + "dX, streaming vs legacy");
        }
}

// MathMode::kBf16's operand copies: the streaming conversion (four elements per
// thread; contiguous arrays as one range, strided rows by a 32-bit division)
// against the legacy one (an element per thread), both feeding the same cuBLAS
// GEMM, so the products must be the same bits; shapes that take the flat path,
// the strided one (a column slice of wider rows, as layer 0's item half), and
// the fallbacks (a width not a multiple of 4, a pointer off 16-byte alignment).
// Then a Linear forward and backward in kBf16, both variants.
TEST_F(Parity, StreamingBf16CopiesAreTheLegacyOnesBitForBit) {
  set_math_mode(MathMode::kBf16);
  struct Case {
    int M, N, K, lda, a_off;
  };
  const Case cases[] = {{1000, 64, 128, 128, 0},        // contiguous: the flat path
                        {1000, 64, 128, 192, 64},       // a slice of 192-wide rows
                        {1000, 64, 6, 6, 0},            // K % 4 != 0: the element kernel
                        {333, 64, 128, 128, 1},         // A off 16-byte alignment
                        {1048575, 256, 128, 192, 64}};  // layer 0's items (GPU only)
  for (const Case& c : cases) {
    if (!on_gpu() && int64_t(c.M) * c.lda > (int64_t{1} << 22)) continue;
    const std::string what =
        shape({{"M", c.M}, {"N", c.N}, {"K", c.K}, {"lda", c.lda}, {"offset", c.a_off}});
    Vec A = random_vec(size_t(c.M) * c.lda + size_t(c.a_off), gen_);
    Vec B = random_vec(size_t(c.N) * c.K, gen_);
    Buffer<float> gA = up(A), gB = up(B), gC_l = up(Vec(size_t(c.M) * c.N, 0.0f)),
                  gC_s = up(Vec(size_t(c.M) * c.N, 0.0f));
    for (StepKernels k : {StepKernels::kLegacy, StepKernels::kStreaming}) {
      set_step_kernels(k);
      gemm(gpu_, false, true, c.M, c.N, c.K, 1.0f, gA.data() + c.a_off, c.lda, gB.data(), c.K, 0.0f,
           (k == StepKernels::kLegacy ? gC_l : gC_s).data(), c.N);
    }
    expect_same(down(gC_s), down(gC_l), what + "bf16 GEMM, streaming copies vs legacy");
  }
  const int64_t B = on_gpu() ? 1048575 : 3000;
  const int in = 128, out = 64;
  Vec X = random_vec(size_t(B) * in, gen_), W = random_vec(size_t(out) * in, gen_),
      bias = random_vec(size_t(out), gen_), dY = random_vec(size_t(B) * out, gen_);
  Buffer<float> gX = up(X), gW = up(W), gb = up(bias);
  std::vector<Vec> got[2];
  for (StepKernels k : {StepKernels::kLegacy, StepKernels::kStreaming}) {
    set_step_kernels(k);
    Buffer<float> gY = up(Vec(size_t(B) * out, 0.0f)), gdY = up(dY),
                  gdX = up(Vec(size_t(B) * in, 0.0f)), gdW = up(Vec(size_t(out) * in, 0.0f)),
                  gdb = up(Vec(size_t(out), 0.0f));
    linear_forward(gpu_, gX.data(), gW.data(), gb.data(), gY.data(), B, in, out, true);
    linear_backward(gpu_, gX.data(), gW.data(), gY.data(), gdY.data(), gdX.data(), gdW.data(),
                    gdb.data(), B, in, out, true, GradMode::kOverwrite);
    got[k == StepKernels::kStreaming] = {down(gY), down(gdX), down(gdW), down(gdb)};
  }
  const char* names[] = {"Y", "dX", "dW", "db"};
  for (int i = 0; i < 4; ++i)
    expect_same(got[1][size_t(i)], got[0][size_t(i)],
                std::string("bf16 Linear ") + names[i] + ", streaming vs legacy");
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

using Bits = std::vector<uint16_t>;

using test::bf16_bits_of;
using test::widen_bf16;

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
      {  // by bits with the kernel at 2 blocks per SM, as before 3 (three_block_kernels)
        const bool three = three_block_kernels();
        set_three_block_kernels(!three);
        Buffer<uint16_t> gdy3 = up(dYb);
        Buffer<float> gg3 = up(Vec(size_t(n) * out)), gdb3 = up(Vec(size_t(out)));
        group_sum_backward_bf16(gpu_, nullptr, gdy3.data(), n, S, out, gg3.data(), out, gdb3.data(),
                                true, gm.data());
        set_three_block_kernels(three);
        expect_same(down(gdy3), down(gdy2), what + " BF16 dZ by bits, 2 vs 3 blocks per SM");
        expect_same(down(gg3), down(gg2), what + " BF16 dYg by bits, 2 vs 3 blocks per SM");
        expect_same(down(gdb3), down(gdb2), what + " BF16 db by bits, 2 vs 3 blocks per SM");
      }
      Bits dY = dYb;
      Vec g(size_t(n) * out), db(static_cast<size_t>(out));
      group_sum_backward_bf16(cpu_, nullptr, dY.data(), n, S, out, g.data(), out, db.data(), true,
                              mask.data());
      expect_same(down(gdy2), dY, what + " BF16 dZ by bits vs the CPU twin");
      expect_same(down(gg2), g, what + " BF16 dYg by bits vs the CPU twin");
    }
  }
}

// linear_backward with the layer below's bit mask (dx_mask): dX masked in the product's
// cuBLASLt DRELU epilogue where cuBLASLt offers one, else after it. Zeros exactly where
// the bits are 0 (the mask from the device's own group_linear_forward); elsewhere the
// unmasked product's values to a GEMM's rounding (the epilogue may take another
// algorithm), and the CPU twin's to the GEMM tolerance; the same bits twice.
TEST_F(Parity, LinearBackwardMasksDxByTheLayerBelowsBitsOnTheGpu) {
  struct Case {
    int64_t n;
    int S, below, out;
  };
  for (const Case& c : {Case{301, 5, 256, 128}, Case{301, 5, 130, 64}, Case{209715, 5, 256, 128}})
    for (MathMode mode : {MathMode::kFp32, MathMode::kTf32}) {
      if (!on_gpu() && c.n > 1000) continue;
      set_math_mode(mode);
      const bool tf32 = mode == MathMode::kTf32;
      const std::string what =
          shape({{"n", c.n}, {"below", c.below}, {"out", c.out}}) + (tf32 ? " tf32" : " fp32");
      const int64_t B = c.n * c.S, words = relu_mask_words(c.below);
      const int in0 = 32;
      const Vec X0 = random_vec(size_t(B) * in0, gen_),
                W0 = random_vec(size_t(c.below) * in0, gen_),
                Yg = random_vec(size_t(c.n) * c.below, gen_);
      Buffer<float> gX0 = up(X0), gW0 = up(W0), gYg = up(Yg), gX = up(Vec(size_t(B) * c.below));
      Buffer<uint32_t> gm = up(std::vector<uint32_t>(size_t(B * words)));
      group_linear_forward(gpu_, gX0.data(), in0, gW0.data(), in0, gYg.data(), nullptr, gX.data(),
                           c.n, c.S, in0, c.below, true, gm.data());
      const Vec X = down(gX);
      const std::vector<uint32_t> mask = down(gm);
      const Vec W = random_vec(size_t(c.out) * c.below, gen_),
                dY0 = random_vec(size_t(B) * c.out, gen_, -0.1f, 0.1f);
      Buffer<float> gW = up(W), gY = up(Vec(size_t(B) * c.out, 1.0f));
      auto run = [&](const uint32_t* m) {
        Buffer<float> gdY = up(dY0), gdX = up(Vec(size_t(B) * c.below, 7.0f)),
                      gdW = up(Vec(size_t(c.out) * c.below)), gdb = up(Vec(size_t(c.out)));
        linear_backward(gpu_, gX.data(), gW.data(), gY.data(), gdY.data(), gdX.data(), gdW.data(),
                        gdb.data(), B, c.below, c.out, true, GradMode::kOverwrite, m);
        return down(gdX);
      };
      const Vec plain = run(nullptr), masked = run(gm.data());
      expect_same(run(gm.data()), masked, what + " dX twice");
      size_t bad = 0;
      Vec plain_masked = plain;
      for (int64_t b = 0; b < B; ++b)
        for (int j = 0; j < c.below; ++j) {
          const size_t i = size_t(b * c.below + j);
          const bool bit = (mask[size_t(b * words + j / 32)] >> (j % 32)) & 1u;
          if (bit != (X[i] > 0.0f) && bad++ < 3) ADD_FAILURE() << what << " mask bit " << i;
          if (!bit) {
            plain_masked[i] = 0.0f;
            if (masked[i] != 0.0f && bad++ < 3)
              ADD_FAILURE() << what << " dX[" << i << "] = " << masked[i] << " where the bit is 0";
          }
        }
      EXPECT_EQ(bad, 0u) << what;
      const double sk = std::sqrt(double(c.out));
      expect_close(masked, plain_masked, (tf32 ? kTf32AtolPerSqrtK : kGemmAtolPerSqrtK) * sk * 0.1,
                   tf32 ? kTf32Rtol : kGemmRtol, what + " dX vs the unmasked product, masked");
      if (c.n <= 1000) {  // the CPU twin
        Vec dY = dY0, dX(size_t(B) * c.below), dW(size_t(c.out) * c.below),
            db(static_cast<size_t>(c.out));
        const Vec Y(size_t(B) * c.out, 1.0f);
        linear_backward(cpu_, X.data(), W.data(), Y.data(), dY.data(), dX.data(), dW.data(),
                        db.data(), B, c.below, c.out, true, GradMode::kOverwrite, mask.data());
        expect_close(masked, dX, (tf32 ? kTf32AtolPerSqrtK : kGemmAtolPerSqrtK) * sk * 0.1,
                     tf32 ? kTf32Rtol : kGemmRtol, what + " dX vs the CPU twin");
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
  {  // BF16's backward kernel at 2 blocks per SM (8 rows in flight), as before 3 blocks
    const bool three = three_block_kernels();
    set_three_block_kernels(false);
    const Out two = run(gpu_, true, true);
    set_three_block_kernels(three);
    expect_same(two.dA16, s.dA16, "dA, 2 blocks vs 3 blocks per SM");
    expect_same(two.dU, s.dU, "user GMF gradients, 2 vs 3 blocks per SM");
    expect_same(two.dI, s.dI, "item GMF gradients, 2 vs 3 blocks per SM");
    expect_same(two.dwc, s.dwc, "dw, dc, 2 vs 3 blocks per SM");
    expect_same(two.db, s.db, "db, 2 vs 3 blocks per SM");
    EXPECT_EQ(std::memcmp(&two.loss, &s.loss, sizeof(double)), 0) << two.loss << " vs " << s.loss;
  }
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

// NeuMF's step on BF16 storage, on the device and on the CPU, from the same
// parameters, rows and labels. The two differ by the FP32 summation order of the
// products (about 1e-6 relative), which flips the BF16 rounding of some stored
// values by one ulp: at most 2^-8 relative per rounding of the top's input, its
// gradient and each layer's dX (the BF16 biases above layer 0 are the same values on
// both), so every tensor stays within (L + 2)·2^-8 in relative RMS.
// The device repeats itself bit for bit, and its legacy kernels (per-GEMM copies)
// give other values: BF16 storage ran there.
TEST_F(Parity, NeuMFOnBf16StorageTracksTheCpuAndRepeatsItself) {
  set_math_mode(MathMode::kBf16);
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int64_t n = 700;
  const int S = 5, D = cfg.embedding_width();
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec I = random_vec(size_t(B) * D, gen_, -0.5f, 0.5f);
  Vec labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  struct Out {
    Vec logits, grads, dU, dI;
    double loss = 0;
  };
  Buffer<float> gU = up(U), gI = up(I), glabels = up(labels);
  auto run = [&](NeuMF& model, const ExecContext& ctx, bool dev) {
    Buffer<float> logits = up(Vec(size_t(B), 0.0f)), dlogits = up(Vec(size_t(B), 0.0f)),
                  dU = up(Vec(size_t(n) * D, 0.0f)), dI = up(Vec(size_t(B) * D, 0.0f));
    Buffer<double> loss = up(std::vector<double>{0.0});
    if (dev) {
      model.forward_backward(ctx, gU.data(), gI.data(), n, S, glabels.data(), B, logits.data(),
                             dlogits.data(), loss.data(), dU.data(), dI.data());
      return Out{down(logits), down(model.grads()), down(dU), down(dI), down(loss)[0]};
    }
    Out o{Vec(size_t(B)), Vec(), Vec(size_t(n) * D), Vec(size_t(B) * D), 0.0};
    Vec dl(static_cast<size_t>(B));
    model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), B, o.logits.data(),
                           dl.data(), &o.loss, o.dU.data(), o.dI.data());
    o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
    return o;
  };
  const Out c = run(cpu_model, cpu_, false), g = run(dev_model, gpu_, true);
  const Out again = run(dev_model, gpu_, true);
  set_step_kernels(StepKernels::kLegacy);
  const Out legacy = run(dev_model, gpu_, true);
  set_step_kernels(StepKernels::kStreaming);
  const double bound = (double(cpu_model.tower().size()) + 2.0) / 256.0;
  auto check = [&](const Vec& dev, const Vec& cpu, const Vec& leg, size_t off, size_t count,
                   const std::string& what) {
    const double e = test::relative_rms(dev.data() + off, cpu.data() + off, count);
    EXPECT_LE(e, bound) << what << ": device vs CPU, relative RMS " << e;
    EXPECT_GT(test::relative_rms(leg.data() + off, dev.data() + off, count), 0.0)
        << what << ": the legacy kernels gave BF16 storage's values";
  };
  check(g.logits, c.logits, legacy.logits, 0, size_t(B), "logits");
  for (const DenseLayerView& v : cpu_model.tower()) {
    const std::string l = "layer " + std::to_string(v.in) + "->" + std::to_string(v.out);
    check(g.grads, c.grads, legacy.grads, size_t(v.w_offset), size_t(v.in) * v.out, l + " dW");
    check(g.grads, c.grads, legacy.grads, size_t(v.b_offset), size_t(v.out), l + " db");
  }
  check(g.grads, c.grads, legacy.grads, size_t(cpu_model.head_w_offset()), size_t(cfg.head_width()),
        "head dw");
  check(g.dU, c.dU, legacy.dU, 0, c.dU.size(), "d_user_rows");
  check(g.dI, c.dI, legacy.dI, 0, c.dI.size(), "d_item_rows");
  EXPECT_NEAR(g.loss, c.loss, bound * c.loss);
  expect_same(again.logits, g.logits, "logits on a second run");
  expect_same(again.grads, g.grads, "dense gradients on a second run");
  expect_same(again.dU, g.dU, "d_user_rows on a second run");
  expect_same(again.dI, g.dI, "d_item_rows on a second run");
}

// Layer 0 against a table of per-item products (evaluation by items, and layer 0 by item
// in training): the same adds in the same order on both devices, so the same bits, on the
// vector paths (out % 4 for FP32, out % 8 for the BF16 octets) and the scalar ones; with
// ReLU the layer-0 bit mask too, written in passing (out % 128 FP32, % 256 BF16) or after;
// a bias that is 16-byte aligned (vector loads) and one that is not (n = 7).
TEST_F(Parity, GatherBiasActIsTheCpuTwinBitForBit) {
  const int64_t R = 97;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3000}})
    for (int S : {1, 5, 51})
      for (int out : {1, 8, 13, 64, 128, 256})
        for (bool relu : {false, true}) {
          const std::string what = shape({{"n", n}, {"S", S}, {"out", out}, {"relu", relu}});
          const int64_t B = n * S;
          if (out >= 128 && B > 20000) continue;  // the mask widths at the smaller batches
          // At n = 7 the bias starts one float into its buffer: the kernels' scalar loads
          // of a bias that is not 16-byte aligned.
          const size_t shift = n == 7 ? 1 : 0;
          const Vec P = random_vec(size_t(R) * out, gen_), Yg = random_vec(size_t(n) * out, gen_),
                    bias_buf = random_vec(size_t(out) + shift, gen_);
          const Vec bias(bias_buf.begin() + std::ptrdiff_t(shift), bias_buf.end());
          const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
          Buffer<float> gP = up(P), gYg = up(Yg), gb_buf = up(bias_buf),
                        gY = up(Vec(size_t(B) * out));
          Buffer<int32_t> gids = up(ids);
          Buffer<uint16_t> gY16 = up(Bits(size_t(B) * out));
          Vec Y(size_t(B) * out);
          Bits Y16(size_t(B) * out);
          const float* b = relu ? bias.data() : nullptr;  // with and without a bias
          const float* gbp = relu ? gb_buf.data() + shift : nullptr;
          const std::vector<uint32_t> junk(size_t(B * relu_mask_words(out)), 0xDEADBEEFu);
          std::vector<uint32_t> m = junk, m16 = junk;
          Buffer<uint32_t> gm = up(junk), gm16 = up(junk);
          uint32_t* mp = relu ? m.data() : nullptr;  // a mask with ReLU only
          uint32_t* gmp = relu ? gm.data() : nullptr;
          gather_bias_act(cpu_, P.data(), R, ids.data(), Yg.data(), b, Y.data(), n, S, out, relu,
                          mp);
          gather_bias_act(gpu_, gP.data(), R, gids.data(), gYg.data(), gbp, gY.data(), n, S, out,
                          relu, gmp);
          expect_same(down(gY), Y, what + " gather_bias_act");
          gather_bias_act_bf16(cpu_, P.data(), R, ids.data(), Yg.data(), b, Y16.data(), n, S, out,
                               relu, relu ? m16.data() : nullptr);
          gather_bias_act_bf16(gpu_, gP.data(), R, gids.data(), gYg.data(), gbp, gY16.data(), n, S,
                               out, relu, relu ? gm16.data() : nullptr);
          expect_same(down(gY16), Y16, what + " gather_bias_act_bf16");
          EXPECT_EQ(down(gm), m) << what << " gather_bias_act's mask";
          EXPECT_EQ(down(gm16), m16) << what << " gather_bias_act_bf16's mask";
        }
}

// Layer 0 by item's ops on the device (the batch's runs of items from CUB's radix sort,
// the runs' rows, the per-run sums in double, the runs' rows put back on their first
// samples, the BF16 and TF32 splits): the same arrays and the same bits as the CPU twins,
// on the vector paths (out % 4) and the scalar ones, with hot ids (long runs) and bounds
// that leave runs empty. (gather_bias_act's masks: GatherBiasActIsTheCpuTwinBitForBit.)
TEST_F(Parity, Layer0ByItemOpsAreTheCpuTwinsBitForBit) {
  for (int64_t B : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3000}, int64_t{200003}})
    for (int64_t bound : {int64_t{1}, int64_t{50}, int64_t{30011}}) {
      IVec ids = random_ids(size_t(B), 0, int32_t(bound), gen_);
      for (size_t b = 0; b < ids.size(); b += 3) ids[b] = int32_t(b % 4) % int32_t(bound);
      const int64_t R = std::min(B, bound) + 1;
      const std::string what = shape({{"B", B}, {"bound", bound}});
      IVec order(static_cast<size_t>(B)), starts(static_cast<size_t>(R) + 1),
          inv(static_cast<size_t>(B)), first(static_cast<size_t>(R));
      item_runs(cpu_, ids.data(), B, bound, R, order.data(), starts.data(), inv.data(),
                first.data());
      Buffer<int32_t> gids = up(ids), gorder = up(IVec(size_t(B), -9)),
                      gstarts = up(IVec(size_t(R) + 1, -9)), ginv = up(IVec(size_t(B), -9)),
                      gfirst = up(IVec(size_t(R), -9));
      item_runs(gpu_, gids.data(), B, bound, R, gorder.data(), gstarts.data(), ginv.data(),
                gfirst.data());
      EXPECT_EQ(down(gorder), order) << what << " order";
      EXPECT_EQ(down(gstarts), starts) << what << " starts";
      EXPECT_EQ(down(ginv), inv) << what << " inv";
      EXPECT_EQ(down(gfirst), first) << what << " first";
      const int w = 13, ldx = 17;
      const Vec X = random_vec(size_t(B) * ldx, gen_);
      Buffer<float> gX = up(X), gXr = up(Vec(size_t(R) * w, -1.0f));
      Vec Xr(size_t(R) * w);
      gather_run_rows(cpu_, X.data(), ldx, w, first.data(), R, Xr.data());
      gather_run_rows(gpu_, gX.data(), ldx, w, gfirst.data(), R, gXr.data());
      expect_same(down(gXr), Xr, what + " gather_run_rows");
      // The runs' rows by item id (put_run_rows), two parts.
      if (B > 0) {
        const int pw = 6;
        const Vec Yr = random_vec(size_t(2 * R) * pw, gen_);
        Vec Y(size_t(bound) * pw, 3.0f);
        Buffer<float> gYr = up(Yr), gY = up(Y);
        put_run_rows(cpu_, Yr.data(), R, 2, pw, ids.data(), first.data(), bound, Y.data(), pw);
        put_run_rows(gpu_, gYr.data(), R, 2, pw, gids.data(), gfirst.data(), bound, gY.data(), pw);
        expect_same(down(gY), Y, what + " put_run_rows");
      }
      // The same rows from a table by the samples' ids.
      if (B > 0) {
        const Vec T = random_vec(size_t(bound) * ldx, gen_);
        Buffer<float> gT = up(T), gTr = up(Vec(size_t(R) * w, -1.0f));
        Vec Tr(size_t(R) * w);
        gather_run_rows(cpu_, T.data(), ldx, w, first.data(), R, Tr.data(), ids.data());
        gather_run_rows(gpu_, gT.data(), ldx, w, gfirst.data(), R, gTr.data(), gids.data());
        expect_same(down(gTr), Tr, what + " gather_run_rows by id");
      }
      for (int out : {1, 8, 13, 64, 128, 256}) {
        if (B > 3000 && out < 64) continue;  // the large batch on the vector paths only
        Vec dZ = random_vec(size_t(B) * out, gen_);
        for (size_t i = 0; i < dZ.size(); i += 7) dZ[i] *= 4096.0f;
        const Bits dZ16 = bf16_bits_of(dZ);
        Buffer<float> gdZ = up(dZ), gdP = up(Vec(size_t(R) * out, -1.0f)),
                      gdP16 = up(Vec(size_t(R) * out, -1.0f));
        Buffer<uint16_t> gdZ16 = up(dZ16);
        Vec dP(size_t(R) * out), dP16(size_t(R) * out);
        run_sums(cpu_, dZ.data(), order.data(), starts.data(), R, out, dP.data());
        run_sums_bf16(cpu_, dZ16.data(), order.data(), starts.data(), R, out, dP16.data());
        const std::string o = what + "out=" + std::to_string(out);
        // Every kernel: by warp (out = 256), FP32 rows at 3 blocks per SM and 12 rows in
        // flight or at 2 and 16, and BF16 rows.
        const bool three = three_block_kernels(), by_warp = run_sums_by_warp();
        for (bool wk : {true, false})
          for (bool t : {true, false}) {
            set_run_sums_by_warp(wk);
            set_three_block_kernels(t);
            const std::string k =
                std::string(wk ? " by warp," : "") + (t ? " 3 blocks" : " 2 blocks");
            gdP = up(Vec(size_t(R) * out, -1.0f));
            run_sums(gpu_, gdZ.data(), gorder.data(), gstarts.data(), R, out, gdP.data());
            expect_same(down(gdP), dP, o + " run_sums," + k);
            gdP16 = up(Vec(size_t(R) * out, -1.0f));
            run_sums_bf16(gpu_, gdZ16.data(), gorder.data(), gstarts.data(), R, out, gdP16.data());
            expect_same(down(gdP16), dP16, o + " run_sums_bf16," + k);
          }
        set_three_block_kernels(three);
        set_run_sums_by_warp(by_warp);
      }
    }
  // scatter_run_rows: each run's parts (2) on its first sample, the row stride of d_item_rows,
  // four samples per thread (B not a multiple of four) and one.
  const bool by_four = scatter_rows_by_four();
  for (bool four : {true, false}) {
    set_scatter_rows_by_four(four);
    const int64_t B = 20011, bound = 3001, R = bound, ld = 192;
    const int w = 128;
    const IVec ids = random_ids(size_t(B), 0, int32_t(bound), gen_);
    IVec order(static_cast<size_t>(B)), starts(static_cast<size_t>(R) + 1),
        inv(static_cast<size_t>(B)), first(static_cast<size_t>(R));
    item_runs(cpu_, ids.data(), B, bound, R, order.data(), starts.data(), inv.data(), first.data());
    const Vec Yr = random_vec(size_t(2 * R) * w, gen_);
    for (int64_t offset : {int64_t{64}, int64_t{1}}) {  // 1: the scalar path
      Vec Y(size_t(B) * ld, 5.0f);
      scatter_run_rows(cpu_, Yr.data(), R, 2, w, inv.data(), first.data(), B, Y.data() + offset,
                       ld);
      Buffer<float> gYr = up(Yr), gY = up(Vec(size_t(B) * ld, 5.0f));
      Buffer<int32_t> ginv = up(inv), gfirst = up(first);
      scatter_run_rows(gpu_, gYr.data(), R, 2, w, ginv.data(), gfirst.data(), B, gY.data() + offset,
                       ld);
      expect_same(down(gY), Y,
                  "scatter_run_rows, offset " + std::to_string(offset) + (four ? ", by four" : ""));
    }
  }
  set_scatter_rows_by_four(by_four);
  // split_bf16's and split_tf32's two parts.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{100003}}) {
    {
      const Vec X = random_vec(size_t(n), gen_, -3.0f, 3.0f);
      Vec hi(static_cast<size_t>(n)), lo(static_cast<size_t>(n));
      split_tf32(cpu_, X.data(), n, hi.data(), lo.data());
      Buffer<float> gX = up(X), ghi = up(Vec(size_t(n))), glo = up(Vec(size_t(n)));
      split_tf32(gpu_, gX.data(), n, ghi.data(), glo.data());
      expect_same(down(ghi), hi, "split_tf32 hi, n=" + std::to_string(n));
      expect_same(down(glo), lo, "split_tf32 lo, n=" + std::to_string(n));
    }
    const Vec X = random_vec(size_t(n), gen_, -3.0f, 3.0f);
    Bits hi(static_cast<size_t>(n)), lo(static_cast<size_t>(n));
    split_bf16(cpu_, X.data(), n, hi.data(), lo.data());
    Buffer<float> gX = up(X);
    Buffer<uint16_t> ghi = up(Bits(size_t(n))), glo = up(Bits(size_t(n)));
    split_bf16(gpu_, gX.data(), n, ghi.data(), glo.data());
    EXPECT_EQ(down(ghi), hi) << "split_bf16 hi, n=" << n;
    EXPECT_EQ(down(glo), lo) << "split_bf16 lo, n=" << n;
  }
}

// NeuMF's step with layer 0 by item on the device against the CPU twin by item (FP32:
// within the GEMMs' summation order; BF16 storage: within the bound of
// NeuMFOnBf16StorageTracksTheCpuAndRepeatsItself plus the per-item sums' rounding), against
// the device's own per-sample step within test_layer0_items.cc's bounds, and the same bits
// twice.
TEST_F(Parity, NeuMFLayer0ByItemTracksTheCpuAndRepeatsItself) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 256, 32, 16};
  const int64_t n = 700, items = 301;
  const int S = 5, D = cfg.embedding_width();
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  set_layer0_by_item(Layer0ByItem::kOn);  // the CPU twin by item too
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec table = random_vec(size_t(items) * D, gen_, -0.5f, 0.5f);
  const IVec ids = random_ids(size_t(B), 0, int32_t(items), gen_);
  const Vec I = test::rows_by_id(table, ids, D);
  Vec labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  struct Out {
    Vec logits, grads, dU, dI;
    double loss = 0;
    bool by_item = false;
  };
  Buffer<float> gU = up(U), gI = up(I), glabels = up(labels);
  Buffer<int32_t> gids = up(ids);
  auto run = [&](NeuMF& model, const ExecContext& ctx, bool dev, bool by_item) {
    Buffer<float> logits = up(Vec(size_t(B), 0.0f)), dlogits = up(Vec(size_t(B), 0.0f)),
                  dU = up(Vec(size_t(n) * D, 0.0f)), dI = up(Vec(size_t(B) * D, 0.0f));
    Buffer<double> loss = up(std::vector<double>{0.0});
    if (dev) {
      model.forward_backward(ctx, gU.data(), gI.data(), n, S, glabels.data(), B, logits.data(),
                             dlogits.data(), loss.data(), dU.data(), dI.data(),
                             by_item ? ItemKeys{gids.data(), items} : ItemKeys{});
      return Out{down(logits), down(model.grads()), down(dU),
                 down(dI),     down(loss)[0],       model.layer0_by_item()};
    }
    Out o{Vec(size_t(B)), Vec(), Vec(size_t(n) * D), Vec(size_t(B) * D), 0.0, false};
    Vec dl(static_cast<size_t>(B));
    model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), B, o.logits.data(),
                           dl.data(), &o.loss, o.dU.data(), o.dI.data(),
                           by_item ? ItemKeys{ids.data(), items} : ItemKeys{});
    o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
    o.by_item = model.layer0_by_item();
    return o;
  };
  for (MathMode mode : {MathMode::kFp32, MathMode::kBf16}) {
    set_math_mode(mode);
    const bool bf16 = mode == MathMode::kBf16;
    const std::string m = bf16 ? "BF16 storage" : "FP32";
    const Out c = run(cpu_model, cpu_, false, true), g = run(dev_model, gpu_, true, true);
    const Out again = run(dev_model, gpu_, true, true);
    const Out per_sample = run(dev_model, gpu_, true, false);
    ASSERT_TRUE(c.by_item && g.by_item) << m;
    ASSERT_FALSE(per_sample.by_item) << m;
    const double L = double(cpu_model.tower().size());
    const double vs_cpu = bf16 ? (2.0 * L + 1.0) / 256.0 : 1e-5;
    const double vs_sample = bf16 ? (2.0 * L + 1.0) / 256.0 : 1e-5;
    auto check = [&](const Vec& dev, const Vec& cpu, const Vec& ps, size_t off, size_t count,
                     const std::string& what) {
      const double e = test::relative_rms(dev.data() + off, cpu.data() + off, count);
      EXPECT_LE(e, vs_cpu) << m << ", " << what << ": device vs CPU, relative RMS";
      const double p = test::relative_rms(dev.data() + off, ps.data() + off, count);
      EXPECT_LE(p, vs_sample) << m << ", " << what << ": by item vs per sample, relative RMS";
    };
    check(g.logits, c.logits, per_sample.logits, 0, size_t(B), "logits");
    for (const DenseLayerView& v : cpu_model.tower()) {
      const std::string l = "layer " + std::to_string(v.in) + "->" + std::to_string(v.out);
      check(g.grads, c.grads, per_sample.grads, size_t(v.w_offset), size_t(v.in) * v.out,
            l + " dW");
      check(g.grads, c.grads, per_sample.grads, size_t(v.b_offset), size_t(v.out), l + " db");
    }
    check(g.dU, c.dU, per_sample.dU, 0, c.dU.size(), "d_user_rows");
    {  // d_item_rows: the device against the CPU per sample (both by item); against the
       // per-sample step as each item's sum over its samples
      const double e = test::relative_rms(g.dI.data(), c.dI.data(), c.dI.size());
      EXPECT_LE(e, vs_cpu) << m << ", d_item_rows: device vs CPU, relative RMS";
      const Vec gi = test::sum_rows_by_id(g.dI, ids, items, D),
                pi = test::sum_rows_by_id(per_sample.dI, ids, items, D);
      const double p = test::relative_rms(gi.data(), pi.data(), gi.size());
      EXPECT_LE(p, vs_sample) << m << ", d_item_rows summed per item: by item vs per sample";
    }
    EXPECT_NEAR(g.loss, c.loss, vs_cpu * c.loss) << m;
    expect_same(again.logits, g.logits, m + " logits on a second run");
    expect_same(again.grads, g.grads, m + " dense gradients on a second run");
    expect_same(again.dI, g.dI, m + " d_item_rows on a second run");
  }
}

// NeuMF scoring against the item table on the device: FP32 products, so the logits
// of the CPU twin to the GEMM tolerance and the device's own forward() on the
// gathered rows to the rounding of layer 0's product rows; under BF16 storage
// within the bound of BF16 storage's other parity tests; the same bits twice.
TEST_F(Parity, ScoreItemsTracksTheCpuTwinAndForward) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int64_t n = 300, R = 211;
  const int S = 21, D = cfg.embedding_width(), mf = cfg.mf_dim;
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec T = random_vec(size_t(R) * D, gen_, -0.5f, 0.5f);
  const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
  const Vec rows = test::rows_by_id(T, ids, D);
  Buffer<float> gU = up(U), gT = up(T), grows = up(rows);
  Buffer<int32_t> gids = up(ids);
  // The candidates' GMF columns are read from the table's rows (stride D) by id.
  auto score = [&](NeuMF& model, const ExecContext& ctx, bool dev) {
    Vec out(static_cast<size_t>(B));
    if (!dev) {
      model.prepare_items(ctx, T.data() + mf, D, R);
      model.score_items(ctx, U.data(), T.data(), D, ids.data(), n, S, out.data());
      return out;
    }
    Buffer<float> logits = up(out);
    model.prepare_items(ctx, gT.data() + mf, D, R);
    model.score_items(ctx, gU.data(), gT.data(), D, gids.data(), n, S, logits.data());
    return down(logits);
  };
  auto forward = [&](NeuMF& model, const ExecContext& ctx) {
    Buffer<float> logits = up(Vec(static_cast<size_t>(B)));
    model.forward(ctx, gU.data(), grows.data(), n, S, logits.data());
    return down(logits);
  };
  set_math_mode(MathMode::kFp32);
  const Vec c = score(cpu_model, cpu_, false), g = score(dev_model, gpu_, true);
  expect_close(g, c, kGemmAtolPerSqrtK * std::sqrt(double(D)), kGemmRtol, "FP32 logits vs CPU");
  const Vec f = forward(dev_model, gpu_);
  double scale = 0.0;
  for (float x : f) scale = std::max(scale, double(std::fabs(x)));
  expect_close(g, f, 1e-5 * scale, 0.0, "FP32 logits vs the device's forward()");
  expect_same(score(dev_model, gpu_, true), g, "FP32 logits on a second run");
  set_math_mode(MathMode::kBf16);
  const Vec c16 = score(cpu_model, cpu_, false), g16 = score(dev_model, gpu_, true);
  const double bound = (double(cpu_model.tower().size()) + 2.0) / 256.0;
  const double e = test::relative_rms(g16.data(), c16.data(), c16.size());
  EXPECT_LE(e, bound) << "BF16 storage: device vs CPU, relative RMS " << e;
  expect_same(score(dev_model, gpu_, true), g16, "BF16 logits on a second run");
}

// The share of equal bits in two sets of logits (1 for two empty sets).
double same_share(const Vec& a, const Vec& b) {
  if (a.empty()) return 1.0;
  size_t same = 0;
  for (size_t k = 0; k < a.size(); ++k) same += std::memcmp(&a[k], &b[k], sizeof(float)) == 0;
  return double(same) / double(a.size());
}

// The fused op's logits against the same ops run one by one on the device and against the
// CPU twin. ops: the layers above layer 0 as the FP32 product and the epilogue kernel
// (NCF_LT_BF16_OUT=0), the fused kernel's expressions: a product's FP32 sum in the tensor
// cores' order moves a BF16 activation by one step only where that sum lies within its
// rounding error of a step's midpoint, a small share of them, so at least half of the logits
// must keep every bit (a misread tile, weight or row keeps almost none), the rest within the
// BF16 storage bound. ops_lt: as ncf_dist runs them, cuBLASLt's epilogue writing BF16, whose
// rounding cuBLASLt does not document: its share is printed, the logits held to the bound.
void expect_fused_logits(const Vec& fused, const Vec& ops, const Vec& ops_lt, const Vec& cpu, int L,
                         const std::string& what) {
  ASSERT_EQ(fused.size(), ops.size()) << what;
  ASSERT_EQ(fused.size(), ops_lt.size()) << what;
  const double share = same_share(fused, ops), share_lt = same_share(fused, ops_lt);
  std::printf(
      "[   info   ] %s: %.4f of %zu logits the bits of the ops one by one, %.4f of them with "
      "cuBLASLt's BF16 epilogue\n",
      what.c_str(), share, fused.size(), share_lt);
  EXPECT_GE(share, 0.5) << what << ": logits equal to the ops' one by one";
  const double bound = (double(L) + 2.0) / 256.0;
  if (!fused.empty()) {
    EXPECT_LE(test::relative_rms(fused.data(), ops.data(), ops.size()), bound)
        << what << ": against the ops one by one, relative RMS";
    EXPECT_LE(test::relative_rms(fused.data(), ops_lt.data(), ops_lt.size()), bound)
        << what << ": against the ops with cuBLASLt's BF16 epilogue, relative RMS";
    EXPECT_LE(test::relative_rms(fused.data(), cpu.data(), cpu.size()), bound)
        << what << ": against the CPU twin, relative RMS";
  }
}

// neumf_score_items_bf16 (evaluation's scoring in one kernel) on the device against the
// ops it fuses run one by one there (gather_bias_act_bf16, linear_forward_bf16 per layer,
// neumf_top_forward_bf16 by id) and against its CPU twin, on the same inputs; the same bits
// on a second run. Shapes: ml-20m's MLPerf tower (w0 256, layers of 128 and 64: 2 x 2
// fragments a warp, F = 128) with users whose 1,000 candidates span tiles and a batch ending
// inside a tile, and with groups of 21; a narrow tower (64, 32, 16; F = 32); three layers
// above layer 0, one 48 wide (single-fragment units; F = 72), rows of stride past mf; n = 0.
TEST_F(Parity, FusedScoreItemsTracksTheOpsItFuses) {
  struct Shape {
    int w0;
    std::vector<int> outs;
    int mf;
    int64_t n;
    int S;
    int64_t R;
  };
  const Shape shapes[] = {{256, {128, 64}, 64, 7, 1000, 977},
                          {256, {128, 64}, 64, 300, 21, 501},
                          {64, {32, 16}, 16, 300, 21, 211},
                          {128, {64, 48, 32}, 40, 5, 999, 300},
                          {64, {32, 16}, 16, 0, 21, 10}};
  set_math_mode(MathMode::kBf16);
  for (const Shape& sh : shapes) {
    const int L = static_cast<int>(sh.outs.size()), mf = sh.mf, D = mf + 7, w0 = sh.w0;
    const int last = sh.outs.back();
    const int64_t n = sh.n, R = sh.R, B = n * sh.S;
    const std::string what = shape({{"w0", w0}, {"L", L}, {"mf", mf}, {"n", n}, {"S", sh.S}});
    const Vec P = random_vec(size_t(R) * w0, gen_, -0.5f, 0.5f);
    const Vec U0 = random_vec(size_t(n) * w0, gen_, -0.5f, 0.5f);
    const Vec b0 = random_vec(size_t(w0), gen_, -0.1f, 0.1f);
    const Vec urows = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
    const Vec irows = random_vec(size_t(R) * D, gen_, -0.5f, 0.5f);
    const Vec head = random_vec(size_t(mf + last), gen_, -0.3f, 0.3f);
    const Vec c = random_vec(1, gen_, -0.1f, 0.1f);
    const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
    std::vector<std::vector<uint16_t>> W(static_cast<size_t>(L)), Bias(static_cast<size_t>(L));
    ScoreLayerBf16 host[kScoreMaxLayers];
    for (int l = 0, in = w0; l < L; in = sh.outs[size_t(l)], ++l) {
      const int out = sh.outs[size_t(l)];
      const float a = std::sqrt(6.0f / float(in + out));  // Glorot, as NeuMF::init
      for (float x : random_vec(size_t(out) * in, gen_, -a, a))
        W[size_t(l)].push_back(float_to_bf16_bits(x));
      for (float x : random_vec(size_t(out), gen_, -0.1f, 0.1f))
        Bias[size_t(l)].push_back(float_to_bf16_bits(x));
      host[l] = {W[size_t(l)].data(), Bias[size_t(l)].data(), in, out};
    }
    Vec cpu(static_cast<size_t>(B));
    ASSERT_TRUE(score_items_fusable(cpu_, w0, host, L, mf)) << what;
    neumf_score_items_bf16(cpu_, P.data(), R, ids.data(), U0.data(), b0.data(), w0, host, L,
                           urows.data(), D, irows.data(), D, head.data(), c.data(), cpu.data(), n,
                           sh.S, mf);
    Buffer<float> gP = up(P), gU0 = up(U0), gb0 = up(b0), gu = up(urows), gi = up(irows),
                  gh = up(head), gc = up(c);
    Buffer<int32_t> gids = up(ids);
    std::vector<Buffer<uint16_t>> gW, gB;
    ScoreLayerBf16 dev[kScoreMaxLayers];
    for (int l = 0; l < L; ++l) {
      gW.push_back(up(W[size_t(l)]));
      gB.push_back(up(Bias[size_t(l)]));
      dev[l] = {gW.back().data(), gB.back().data(), host[l].in, host[l].out};
    }
    ASSERT_TRUE(score_items_fusable(gpu_, w0, dev, L, mf)) << what;
    auto fused = [&] {
      Buffer<float> logits = up(Vec(size_t(B), -7.0f));
      neumf_score_items_bf16(gpu_, gP.data(), R, gids.data(), gU0.data(), gb0.data(), w0, dev, L,
                             gu.data(), D, gi.data(), D, gh.data(), gc.data(), logits.data(), n,
                             sh.S, mf);
      return down(logits);
    };
    // The ops one by one on the device, the layers above layer 0 with and without
    // cuBLASLt's BF16 epilogue.
    auto one_by_one = [&](bool lt_out) {
      set_lt_bf16_out(lt_out);
      Buffer<uint16_t> x(g_dev, size_t(B) * w0);
      gather_bias_act_bf16(gpu_, gP.data(), R, gids.data(), gU0.data(), gb0.data(), x.data(), n,
                           sh.S, w0, true);
      for (int l = 0; l < L; ++l) {
        Buffer<uint16_t> y(g_dev, size_t(B) * dev[l].out);
        linear_forward_bf16(gpu_, x.data(), dev[l].w, dev[l].b, y.data(), B, dev[l].in, dev[l].out,
                            true);
        x = std::move(y);
      }
      Buffer<float> logits = up(Vec(static_cast<size_t>(B)));
      neumf_top_forward_bf16(gpu_, gu.data(), D, gi.data(), D, x.data(), gh.data(), gc.data(),
                             logits.data(), n, sh.S, mf, last, gids.data());
      set_lt_bf16_out(true);
      return down(logits);
    };
    const Vec ops = one_by_one(false), ops_lt = one_by_one(true);
    const Vec g = fused();
    expect_fused_logits(g, ops, ops_lt, cpu, L, what);
    expect_same(fused(), g, what + "logits on a second run");
  }
  // Widths it does not take: the ops stay on their own.
  const std::vector<uint16_t> w(64 * 64);
  auto fits = [&](int w0, std::vector<std::pair<int, int>> io, int mf) {
    std::vector<ScoreLayerBf16> v;
    for (auto [in, out] : io) v.push_back({w.data(), nullptr, in, out});
    return score_items_fusable(cpu_, w0, v.data(), int(v.size()), mf);
  };
  EXPECT_TRUE(fits(64, {{64, 32}, {32, 16}}, 16));
  EXPECT_FALSE(fits(64, {{64, 32}, {32, 8}}, 16)) << "a width of 8";
  EXPECT_FALSE(fits(64, {{64, 32}, {16, 16}}, 16)) << "layers not chained";
  EXPECT_FALSE(fits(40, {{40, 32}}, 16)) << "w0 of 40";
  EXPECT_FALSE(fits(64, {{64, 32}}, 129)) << "mf past kNeumfTopMaxWidth";
  EXPECT_FALSE(fits(64, {}, 16)) << "no layer above layer 0";
  EXPECT_FALSE(fits(64, {{64, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}}, 16))
      << "five layers above layer 0";
}

// NeuMF::score_items with NCF_EVAL_FUSED (set_score_items_fused): on a GPU under BF16
// storage the one kernel runs (last_score_fused) and its logits follow the ops one by one,
// held as above; elsewhere (FP32, or the CPU stand-in) nothing changes, to the bit.
TEST_F(Parity, NeuMFScoresItemsInOneKernelWhereAsked) {
  NeuMFConfig cfg;
  cfg.mf_dim = 64;
  cfg.layers = {256, 256, 128, 64};  // ml-20m-mlperf
  const int64_t n = 6, R = 777;
  const int S = 1000, D = cfg.embedding_width(), mf = cfg.mf_dim;
  const int64_t B = n * S;
  NeuMF cpu_model(cfg, Device::kCpu), dev_model(cfg, g_dev);
  same_parameters(cpu_model, dev_model);
  const Vec U = random_vec(size_t(n) * D, gen_, -0.5f, 0.5f);
  const Vec T = random_vec(size_t(R) * D, gen_, -0.5f, 0.5f);
  const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
  Buffer<float> gU = up(U), gT = up(T);
  Buffer<int32_t> gids = up(ids);
  auto score = [&](bool fused, bool lt_out = true) {
    set_score_items_fused(fused);
    set_lt_bf16_out(lt_out);
    Buffer<float> logits = up(Vec(size_t(B)));
    dev_model.prepare_items(gpu_, gT.data() + mf, D, R);
    dev_model.score_items(gpu_, gU.data(), gT.data(), D, gids.data(), n, S, logits.data());
    return down(logits);
  };
  for (MathMode mode : {MathMode::kBf16, MathMode::kFp32}) {
    set_math_mode(mode);
    const bool bf16 = mode == MathMode::kBf16;
    const std::string what = bf16 ? "BF16 storage" : "FP32";
    Vec cpu(static_cast<size_t>(B));
    cpu_model.prepare_items(cpu_, T.data() + mf, D, R);
    cpu_model.score_items(cpu_, U.data(), T.data(), D, ids.data(), n, S, cpu.data());
    const Vec ops = score(false, false), ops_lt = score(false);
    EXPECT_FALSE(dev_model.last_score_fused()) << what;
    const Vec fused = score(true);
    EXPECT_EQ(dev_model.last_score_fused(), bf16 && g_dev == Device::kCuda) << what;
    if (dev_model.last_score_fused()) {
      expect_fused_logits(fused, ops, ops_lt, cpu, int(dev_model.tower().size()) - 1, what);
      expect_same(score(true), fused, what + " fused logits on a second run");
    } else {
      expect_same(fused, ops, what + ": NCF_EVAL_FUSED changes nothing here");
    }
  }
  set_score_items_fused(false);
}

// The fused top of NeuMF (neumf_top_forward / neumf_top_backward, NeuMF's path
// under StepKernels::kStreaming) against the unfused ops it replaces, run on the
// GPU on the same inputs (repeat_rows, gmf_forward, concat_cols, head_forward,
// bce_with_logits_*, head_backward, split_cols, the last Linear's mask and bias
// sums in linear_backward, gmf_backward, group_sum_backward), and against its CPU
// twin. Every element it writes (logits, the masked dA, the items' and users' GMF
// gradients) is the same bits as the unfused GPU ops'; its sums (dw, dc, db, the
// loss) take another fixed order: within a double sum's rounding of theirs, and
// the same bits on a second run. Against the CPU: with dlogits given, the
// elements bit for bit; from labels, the logits' gradient goes through each
// device's expf, so within the element tolerance. Shapes: GMF and tower widths
// below, at and past 32 lanes, groups longer than the rows in flight and than a
// warp (S = 51: the forward's two pieces of a group), rows with a stride past mf, n = 0,
// the ml-20m MLPerf step's shapes and evaluation's groups of 1 + 999 (GPU only).
// The fused top's forward reading item rows by id (evaluation's candidates) on the
// device: the bits of its forward on the same rows gathered per sample, and the CPU
// twin's by id to a dot product's rounding; FP32 and BF16 A, a GMF width below one
// warp and one of two warps, groups of one piece (S = 11) and of many (S = 1001, the
// last piece shorter).
TEST_F(Parity, TopForwardReadsItemRowsByIdAsGatheredOnTheGpu) {
  const int64_t R = 97;
  const int last = 64, ldt = 192;
  struct Shape {
    int64_t n;
    int S;
  };
  for (const Shape& shape : {Shape{301, 11}, Shape{4, 1001}})
    for (int mf : {20, 64}) {
      const int64_t n = shape.n;
      const int S = shape.S;
      const int64_t B = n * S;
      const std::string what =
          "n " + std::to_string(n) + " S " + std::to_string(S) + " mf " + std::to_string(mf);
      const Vec U = random_vec(size_t(n) * ldt, gen_, -0.5f, 0.5f);
      const Vec T = random_vec(size_t(R) * ldt, gen_, -0.5f, 0.5f);
      const Vec A = random_vec(size_t(B) * last, gen_, 0.0f, 0.5f);
      const Vec w = random_vec(size_t(mf + last), gen_, -0.3f, 0.3f), c = {0.125f};
      const IVec ids = random_ids(size_t(B), 0, int32_t(R), gen_);
      const Vec rows = test::rows_by_id(T, ids, ldt);
      const Bits A16 = bf16_bits_of(A);
      Buffer<float> gU = up(U), gT = up(T), grows = up(rows), gA = up(A), gw = up(w), gc = up(c),
                    gby = up(Vec(size_t(B))), ggat = up(Vec(size_t(B)));
      Buffer<uint16_t> gA16 = up(A16);
      Buffer<int32_t> gids = up(ids);
      for (bool bf16 : {false, true}) {
        const std::string tag = what + (bf16 ? " BF16 A" : " FP32 A");
        Vec cpu_by_id(static_cast<size_t>(B));
        if (bf16) {
          neumf_top_forward_bf16(gpu_, gU.data(), ldt, gT.data(), ldt, gA16.data(), gw.data(),
                                 gc.data(), gby.data(), n, S, mf, last, gids.data());
          neumf_top_forward_bf16(gpu_, gU.data(), ldt, grows.data(), ldt, gA16.data(), gw.data(),
                                 gc.data(), ggat.data(), n, S, mf, last);
          neumf_top_forward_bf16(cpu_, U.data(), ldt, T.data(), ldt, A16.data(), w.data(), c.data(),
                                 cpu_by_id.data(), n, S, mf, last, ids.data());
        } else {
          neumf_top_forward(gpu_, gU.data(), ldt, gT.data(), ldt, gA.data(), gw.data(), gc.data(),
                            gby.data(), n, S, mf, last, gids.data());
          neumf_top_forward(gpu_, gU.data(), ldt, grows.data(), ldt, gA.data(), gw.data(),
                            gc.data(), ggat.data(), n, S, mf, last);
          neumf_top_forward(cpu_, U.data(), ldt, T.data(), ldt, A.data(), w.data(), c.data(),
                            cpu_by_id.data(), n, S, mf, last, ids.data());
        }
        expect_same(down(gby), down(ggat), tag + ": by id vs gathered");
        // The CPU twin sums the dot product in column order, the device in lane order.
        expect_close(down(gby), cpu_by_id, 1e-6 * (mf + last), kElemRtol,
                     tag + ": vs the CPU twin");
      }
    }
}

TEST_F(Parity, FusedTopIsTheUnfusedOpsOnTheGpu) {
  struct TopCase {
    int64_t n;
    int S, mf, last;
  };
  const TopCase cases[] = {{0, 5, 8, 8},      {1, 1, 3, 5},        {37, 5, 8, 8},
                           {3000, 5, 64, 64}, {777, 51, 40, 33},   {100, 9, 128, 128},
                           {2000, 5, 8, 100}, {209715, 5, 64, 64}, {3, 1000, 64, 64}};
  for (const TopCase& c : cases)
    for (bool from_labels : {true, false}) {
      const int64_t B = c.n * c.S;
      const int mf = c.mf, last = c.last, F = mf + last;
      const int64_t ld = mf + 17;  // the gathered rows: GMF columns, then others
      if (!on_gpu() && B * (ld + last) > (int64_t{1} << 24)) continue;
      const std::string what =
          shape({{"n", c.n}, {"S", c.S}, {"mf", mf}, {"last", last}, {"from_labels", from_labels}});
      Vec U = random_vec(size_t(c.n) * ld, gen_), I = random_vec(size_t(B) * ld, gen_);
      Vec A = random_vec(size_t(B) * last, gen_, -0.5f, 1.0f);
      for (float& a : A) a = std::max(a, 0.0f);  // a ReLU output: a third exactly 0
      Vec wc = random_vec(size_t(F) + 1, gen_), labels = random_vec(size_t(B), gen_, 0.0f, 1.0f);
      for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
      Vec dlogits = random_vec(size_t(B), gen_, -1.0f / 64, 1.0f / 64);
      const int64_t global_batch = B + 3;
      const float* dl = from_labels ? nullptr : dlogits.data();
      // CPU twin.
      Vec logits(size_t(B), 0.0f), dA(size_t(B) * last, 3.0f), dU(size_t(c.n) * ld, 4.0f),
          dI(size_t(B) * ld, 5.0f), dwc(size_t(F) + 1, 6.0f), db(size_t(last), 7.0f);
      double loss = -1.0;
      neumf_top_forward(cpu_, U.data(), ld, I.data(), ld, A.data(), wc.data(), wc.data() + F,
                        logits.data(), c.n, c.S, mf, last);
      neumf_top_backward(cpu_, U.data(), ld, I.data(), ld, A.data(), wc.data(), dl,
                         from_labels ? logits.data() : nullptr,
                         from_labels ? labels.data() : nullptr, global_batch,
                         from_labels ? &loss : nullptr, dA.data(), dU.data(), ld, dI.data(), ld,
                         dwc.data(), dwc.data() + F, db.data(), c.n, c.S, mf, last, true);
      // The fused ops on the device, twice.
      Buffer<float> gU = up(U), gI = up(I), gA = up(A), gwc = up(wc), glabels = up(labels),
                    gdl = up(dlogits);
      struct Fused {
        Vec logits, dA, dU, dI, dwc, db;
        double loss = -1.0;
      };
      auto fused = [&] {
        Buffer<float> glogits = up(Vec(size_t(B), 0.0f)), gdA = up(Vec(dA.size(), 3.0f)),
                      gdU = up(Vec(dU.size(), 4.0f)), gdI = up(Vec(dI.size(), 5.0f)),
                      gdwc = up(Vec(dwc.size(), 6.0f)), gdb = up(Vec(db.size(), 7.0f));
        Buffer<double> gloss = up(std::vector<double>{-1.0});
        neumf_top_forward(gpu_, gU.data(), ld, gI.data(), ld, gA.data(), gwc.data(), gwc.data() + F,
                          glogits.data(), c.n, c.S, mf, last);
        neumf_top_backward(
            gpu_, gU.data(), ld, gI.data(), ld, gA.data(), gwc.data(),
            from_labels ? nullptr : gdl.data(), from_labels ? glogits.data() : nullptr,
            from_labels ? glabels.data() : nullptr, global_batch,
            from_labels ? gloss.data() : nullptr, gdA.data(), gdU.data(), ld, gdI.data(), ld,
            gdwc.data(), gdwc.data() + F, gdb.data(), c.n, c.S, mf, last, true);
        return Fused{down(glogits), down(gdA), down(gdU),     down(gdI),
                     down(gdwc),    down(gdb), down(gloss)[0]};
      };
      const Fused f = fused();
      // The unfused ops on the device.
      Buffer<float> gug = up(Vec(size_t(B) * mf, 0.0f)), gG = up(Vec(size_t(B) * mf, 0.0f)),
                    gH = up(Vec(size_t(B) * F, 0.0f)), gdH = up(Vec(size_t(B) * F, 0.0f)),
                    gdG = up(Vec(size_t(B) * mf, 0.0f)), gdug = up(Vec(size_t(B) * mf, 0.0f));
      Buffer<float> glogits = up(Vec(size_t(B), 0.0f)), ggrad = up(Vec(size_t(B), 0.0f)),
                    gdA = up(Vec(dA.size(), 3.0f)), gdU = up(Vec(dU.size(), 4.0f)),
                    gdI = up(Vec(dI.size(), 5.0f)), gdwc = up(Vec(dwc.size(), 6.0f)),
                    gdb = up(Vec(db.size(), 7.0f));
      Buffer<float> gX = up(Vec(size_t(B), 1.0f)), gW = up(Vec(size_t(last), 1.0f)),
                    gdW = up(Vec(size_t(last), 0.0f));
      Buffer<double> gloss = up(std::vector<double>{-1.0});
      repeat_rows(gpu_, gU.data(), ld, mf, gug.data(), c.n, c.S);
      gmf_forward(gpu_, gug.data(), mf, gI.data(), ld, gG.data(), mf, B, mf);
      concat_cols(gpu_, gG.data(), mf, mf, gA.data(), last, last, gH.data(), B);
      head_forward(gpu_, gH.data(), gwc.data(), gwc.data() + F, glogits.data(), B, F);
      const float* grad = gdl.data();
      if (from_labels) {
        bce_with_logits_forward(gpu_, glogits.data(), glabels.data(), nullptr, gloss.data(), B, B,
                                global_batch);
        bce_with_logits_backward(gpu_, glogits.data(), glabels.data(), nullptr, ggrad.data(), B, B,
                                 global_batch);
        grad = ggrad.data();
      }
      head_backward(gpu_, gH.data(), gwc.data(), grad, gdH.data(), gdwc.data(), gdwc.data() + F, B,
                    F, GradMode::kOverwrite);
      split_cols(gpu_, gdH.data(), mf, last, gdG.data(), mf, gdA.data(), last, B);
      // The last Linear's backward masks dA and sums db (its product: in = 1).
      linear_backward(gpu_, gX.data(), gW.data(), gA.data(), gdA.data(), nullptr, gdW.data(),
                      gdb.data(), B, 1, last, true, GradMode::kOverwrite);
      gmf_backward(gpu_, gug.data(), mf, gI.data(), ld, gdG.data(), mf, gdug.data(), mf, gdI.data(),
                   ld, B, mf);
      group_sum_backward(gpu_, nullptr, gdug.data(), c.n, c.S, mf, gdU.data(), ld, nullptr, false);
      expect_same(f.logits, down(glogits), what + "logits, fused vs unfused");
      expect_same(f.dA, down(gdA), what + "masked dA, fused vs unfused");
      expect_same(f.dI, down(gdI), what + "item GMF gradients (other columns untouched)");
      expect_same(f.dU, down(gdU), what + "user GMF gradients (other columns untouched)");
      expect_close(f.dwc, down(gdwc), kDoubleSumAtol, kDoubleSumRtol, what + "dw, dc");
      expect_close(f.db, down(gdb), kDoubleSumAtol, kDoubleSumRtol, what + "db");
      if (from_labels)
        expect_close(std::vector<double>{f.loss}, down(gloss), kDoubleAtol, kDoubleRtol,
                     what + "loss");
      else
        EXPECT_EQ(f.loss, -1.0) << what << "no loss with dlogits given";
      const Fused again = fused();
      expect_same(again.logits, f.logits, what + "logits on a second run");
      expect_same(again.dwc, f.dwc, what + "dw, dc on a second run");
      expect_same(again.db, f.db, what + "db on a second run");
      expect_same(std::vector<double>{again.loss}, std::vector<double>{f.loss},
                  what + "loss on a second run");
      // Against the CPU twin.
      expect_close(f.logits, logits, 1e-6 * F, kElemRtol, what + "logits vs the CPU twin");
      if (!from_labels) {
        expect_same(f.dA, dA, what + "dA vs the CPU twin");
        expect_same(f.dI, dI, what + "dI vs the CPU twin");
        expect_same(f.dU, dU, what + "dU vs the CPU twin");
      } else {
        expect_close(f.dA, dA, kElemAtol, kElemRtol, what + "dA vs the CPU twin");
        expect_close(f.dI, dI, kElemAtol, kElemRtol, what + "dI vs the CPU twin");
        expect_close(f.dU, dU, kElemAtol, kElemRtol, what + "dU vs the CPU twin");
        expect_loss_close(f.loss, loss, f.logits, logits, kDoubleAtol, kDoubleRtol,
                          what + "loss vs the CPU twin");
      }
      expect_close(f.dwc, dwc, kDoubleSumAtol, kDoubleSumRtol, what + "dw, dc vs the CPU twin");
      expect_close(f.db, db, kDoubleSumAtol, kDoubleSumRtol, what + "db vs the CPU twin");
    }
}

TEST_F(Parity, BceWithLogitsPaddingWeightsAndExtremes) {
  for (int64_t B : kBatches)
    for (bool with_weights : {false, true})
      for (int64_t n_valid : {B, B / 2}) {
        const std::string what = shape({{"B", B}, {"n_valid", n_valid}, {"weights", with_weights}});
        Vec z = random_vec(B, gen_, -8.0f, 8.0f), y(B), wts(B);
        std::bernoulli_distribution coin(0.5), keep(0.8);
        for (int64_t b = 0; b < B; ++b) {
          y[b] = coin(gen_) ? 1.0f : 0.0f;
          wts[b] = keep(gen_) ? 1.0f : 0.0f;
          if (b % 97 == 3) z[b] = (b % 2 ? 1.0f : -1.0f) * (b % 3 ? 100.0f : 1e4f);
          if (with_weights && wts[b] == 0.0f && b % 5 == 0)
            z[b] = std::numeric_limits<float>::quiet_NaN();  // masked rows may hold garbage
          if (b >= n_valid && b % 7 == 0) z[b] = std::numeric_limits<float>::infinity();
        }
        const int64_t global = B + 5;
        Buffer<float> gz = up(z), gy = up(y), gw = up(wts);
        Buffer<double> gloss(g_dev, 1);
        double loss = -1.0;
        const float* cw = with_weights ? wts.data() : nullptr;
        const float* gwp = with_weights ? gw.data() : nullptr;
        bce_with_logits_forward(cpu_, z.data(), y.data(), cw, &loss, B, n_valid, global);
        bce_with_logits_forward(gpu_, gz.data(), gy.data(), gwp, gloss.data(), B, n_valid, global);
        expect_close(down(gloss), std::vector<double>{loss}, kDoubleAtol, kDoubleRtol,
                     what + "loss");
        Vec dz(B, 3.0f);
        Buffer<float> gdz = up(dz);
        bce_with_logits_backward(cpu_, z.data(), y.data(), cw, dz.data(), B, n_valid, global);
        bce_with_logits_backward(gpu_, gz.data(), gy.data(), gwp, gdz.data(), B, n_valid, global);
        // sigmoid(z) − y in float: where sigmoid(z) ≈ y the difference keeps only the
        // last bits of sigmoid, so a few ulp of 1 (1.2e-7 each), scaled by 1/global.
        expect_close(down(gdz), dz, 4 * 1.2e-7 / double(global), kElemRtol, what + "dlogits");
      }
}

// ---- optim.h ------------------------------------------------------------------------------

TEST_F(Parity, DenseAdamOverSteps) {
  AdamHyper adam;
  adam.l2 = 1e-3f;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    Vec p = random_vec(n, gen_), m(n, 0.0f), v(n, 0.0f);
    Buffer<float> gp = up(p), gm = up(m), gv = up(v);
    for (int64_t t = 1; t <= 3; ++t) {
      Vec g = random_vec(n, gen_, -0.1f, 0.1f);
      Buffer<float> gg = up(g);
      dense_adam_step(cpu_, p.data(), g.data(), m.data(), v.data(), n, t, adam);
      dense_adam_step(gpu_, gp.data(), gg.data(), gm.data(), gv.data(), n, t, adam);
    }
    const std::string what = shape({{"n", n}});
    expect_close(down(gp), p, kElemAtol, kElemRtol, what + "adam p");
    expect_close(down(gm), m, kElemAtol, kElemRtol, what + "adam m");
    expect_close(down(gv), v, kElemAtol, kElemRtol, what + "adam v");
  }
}

// All four table optimizers over two steps; offset 1 shifts every array by one
// float, so D % 4 == 0 widths take the scalar path too.
TEST_F(Parity, EmbeddingOptimizersOverSteps) {
  AdamHyper adam;
  adam.l2 = 1e-3f;
  AdagradHyper adagrad;
  SgdHyper sgd;
  sgd.l2 = 1e-3f;
  for (int64_t R : {int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int D : kWidths)
      for (int64_t n : {int64_t{0}, int64_t{1}, R / 3, R})
        for (int offset : {0, 1}) {
          if (R == 1000 && D == 192 && offset == 1 && n != R) continue;  // keep the test fast
          const std::string what = shape({{"R", R}, {"D", D}, {"n", n}, {"offset", offset}});
          const size_t sz = size_t(R) * D + offset;
          // [0] dense Adam, [1] lazy Adam, [2] SGD, [3] Adagrad, [4] row-wise Adagrad
          // (its accumulators: the first R of state 1): table and two states each.
          std::vector<Vec> tab(5), s1(5), s2(5);
          std::vector<Buffer<float>> gtab, gs1, gs2;
          for (int o = 0; o < 5; ++o) {
            tab[o] = random_vec(sz, gen_);
            s1[o] = Vec(sz, o >= 3 ? adagrad.initial_accumulator : 0.0f);
            s2[o] = Vec(sz, 0.0f);
            gtab.push_back(up(tab[o]));
            gs1.push_back(up(s1[o]));
            gs2.push_back(up(s2[o]));
          }
          auto cp = [&](std::vector<Vec>& v, int o) { return v[o].data() + offset; };
          auto gp = [&](std::vector<Buffer<float>>& v, int o) { return v[o].data() + offset; };
          for (int64_t t = 1; t <= 2; ++t) {
            IVec rows = random_unique_rows(R, n, gen_);
            Vec grads = random_vec(size_t(n) * D + offset, gen_, -0.1f, 0.1f);
            Buffer<RowId> grows = up(rows);
            Buffer<float> ggrads = up(grads);
            const float* cg = grads.data() + offset;
            const float* gg = ggrads.data() + offset;
            embedding_dense_adam(cpu_, cp(tab, 0), cp(s1, 0), cp(s2, 0), rows.data(), cg, R, n, D,
                                 t, adam);
            embedding_dense_adam(gpu_, gp(gtab, 0), gp(gs1, 0), gp(gs2, 0), grows.data(), gg, R, n,
                                 D, t, adam);
            embedding_lazy_adam(cpu_, cp(tab, 1), cp(s1, 1), cp(s2, 1), rows.data(), cg, R, n, D, t,
                                adam);
            embedding_lazy_adam(gpu_, gp(gtab, 1), gp(gs1, 1), gp(gs2, 1), grows.data(), gg, R, n,
                                D, t, adam);
            embedding_sgd(cpu_, cp(tab, 2), rows.data(), cg, R, n, D, sgd);
            embedding_sgd(gpu_, gp(gtab, 2), grows.data(), gg, R, n, D, sgd);
            embedding_adagrad(cpu_, cp(tab, 3), cp(s1, 3), rows.data(), cg, R, n, D, adagrad);
            embedding_adagrad(gpu_, gp(gtab, 3), gp(gs1, 3), grows.data(), gg, R, n, D, adagrad);
            embedding_rowwise_adagrad(cpu_, cp(tab, 4), cp(s1, 4), rows.data(), cg, R, n, D,
                                      adagrad);
            embedding_rowwise_adagrad(gpu_, gp(gtab, 4), gp(gs1, 4), grows.data(), gg, R, n, D,
                                      adagrad);
          }
          const char* names[] = {"dense_adam", "lazy_adam", "sgd", "adagrad", "rowwise_adagrad"};
          for (int o = 0; o < 5; ++o) {
            expect_close(down(gtab[o]), tab[o], kElemAtol, kElemRtol, what + names[o] + " table");
            expect_close(down(gs1[o]), s1[o], kElemAtol, kElemRtol, what + names[o] + " state 1");
            expect_close(down(gs2[o]), s2[o], kElemAtol, kElemRtol, what + names[o] + " state 2");
          }
        }
}

TEST_F(Parity, GatherRowsExactWithDuplicates) {
  for (int64_t R : {int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int D : kWidths)
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}})
        for (int offset : {0, 1}) {
          Vec table = random_vec(size_t(R) * D, gen_);
          IVec ids = random_ids(n, 0, int32_t(std::min<int64_t>(R, 5)), gen_);  // many repeats
          if (n > 10) ids[n / 2] = int32_t(R - 1);
          Vec out(size_t(n) * D + offset, 1.0f);
          Buffer<float> gtable = up(table), gout = up(out);
          Buffer<RowId> gids = up(ids);
          gather_rows(cpu_, table.data(), ids.data(), out.data() + offset, R, n, D);
          gather_rows(gpu_, gtable.data(), gids.data(), gout.data() + offset, R, n, D);
          expect_same(down(gout), out, shape({{"R", R}, {"D", D}, {"n", n}, {"offset", offset}}));
          // The first columns only (a narrow lookup), the others left as they were.
          for (int width : {1, D / 2, D - 1}) {
            if (width < 1) continue;
            Vec part(size_t(n) * D + offset, 2.0f);
            Buffer<float> gpart = up(part);
            gather_rows(cpu_, table.data(), ids.data(), part.data() + offset, R, n, D, width);
            gather_rows(gpu_, gtable.data(), gids.data(), gpart.data() + offset, R, n, D, width);
            expect_same(
                down(gpart), part,
                shape({{"R", R}, {"D", D}, {"n", n}, {"offset", offset}, {"width", width}}));
          }
        }
}

// Sums of equal ids are taken in optim.h's order (input order within sub-runs of
// kSubRun rows, then the sub-run sums in order) on both devices: bit-identical.
TEST_F(Parity, SortReduceRowsBitExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20000}})
    for (int D : kWidths)
      for (int32_t range : {1, 5, 1000000})
        for (int offset : {0, 1}) {
          if (n == 20000 && D == 192) continue;  // keep the test fast
          const std::string what =
              shape({{"n", n}, {"D", D}, {"id range", range}, {"offset", offset}});
          // Rows of a table: [0, range). The reference refuses negative rows.
          IVec ids = random_ids(n, 0, range, gen_);
          Vec grads = random_vec(size_t(n) * D + offset, gen_);
          IVec urows(n, -7);
          Vec rgrads(size_t(n) * D + offset, 0.0f);
          Buffer<RowId> gids = up(ids), gurows = up(urows);
          Buffer<float> ggrads = up(grads), grgrads = up(rgrads);
          for (int64_t bound : {int64_t{0}, int64_t{range}}) {  // 0: no bound, all 32 bits
            const std::string w = what + "bound=" + std::to_string(bound) + " ";
            int64_t nu_cpu = -1, nu_gpu = -1;
            sort_reduce_rows(cpu_, ids.data(), grads.data() + offset, n, D, urows.data(),
                             rgrads.data() + offset, &nu_cpu, bound);
            sort_reduce_rows(gpu_, gids.data(), ggrads.data() + offset, n, D, gurows.data(),
                             grgrads.data() + offset, &nu_gpu, bound);
            ASSERT_EQ(nu_gpu, nu_cpu) << w;
            IVec gu = down(gurows, nu_cpu);
            expect_same(gu, IVec(urows.begin(), urows.begin() + nu_cpu), w + "unique rows");
            Vec gr = down(grgrads, size_t(nu_cpu) * D + offset);
            expect_same(gr, Vec(rgrads.begin(), rgrads.begin() + nu_cpu * D + offset),
                        w + "row sums");
          }
        }
}

// Hot ids, as under the ml-20m batch's item popularity: n = 2^20 ids, one fifth
// Zipf(1) over 26,744 items (the hottest ~1.9·10^4 times), the rest uniform.
// Runs longer than kSubRun take the GPU's sub-run path (partials, then their
// sum in sub-run order); the CPU sums in that same order: bit-identical.
TEST_F(Parity, SortReduceRowsHotIdsBitExact) {
  const int64_t n = int64_t{1} << 20;
  const int32_t items = 26744;
  std::vector<double> cdf(items);
  double acc = 0;
  for (int32_t r = 0; r < items; ++r) cdf[r] = acc += 1.0 / double(r + 1);
  std::vector<int32_t> order(items);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen_);  // the hot items are not the low ids
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int32_t> any(0, items - 1);
  IVec ids(n);
  for (int64_t k = 0; k < n; ++k) {
    if (k % 5 == 0) {
      const auto it = std::upper_bound(cdf.begin(), cdf.end(), unit(gen_) * cdf.back());
      ids[k] = order[std::min<ptrdiff_t>(it - cdf.begin(), items - 1)];
    } else {
      ids[k] = any(gen_);
    }
  }
  std::vector<int64_t> count(items, 0);
  for (int32_t id : ids) ++count[id];
  const int64_t hottest = *std::max_element(count.begin(), count.end());
  EXPECT_GT(hottest, 10000) << "the case needs a hot id";

  for (int D : {192, 7}) {
    const std::string what = shape({{"n", n}, {"D", D}, {"hottest", hottest}});
    Vec grads = random_vec(size_t(n) * D, gen_);
    IVec urows(n, -7);
    Vec rgrads(size_t(n) * D, 0.0f);
    Buffer<RowId> gids = up(ids), gurows = up(urows);
    Buffer<float> ggrads = up(grads), grgrads = up(rgrads);
    int64_t nu_cpu = -1, nu_gpu = -1;
    sort_reduce_rows(cpu_, ids.data(), grads.data(), n, D, urows.data(), rgrads.data(), &nu_cpu);
    sort_reduce_rows(gpu_, gids.data(), ggrads.data(), n, D, gurows.data(), grgrads.data(),
                     &nu_gpu);
    ASSERT_EQ(nu_gpu, nu_cpu) << what;
    expect_same(down(gurows, nu_cpu), IVec(urows.begin(), urows.begin() + nu_cpu),
                what + "unique rows");
    expect_same(down(grgrads, size_t(nu_cpu) * D), Vec(rgrads.begin(), rgrads.begin() + nu_cpu * D),
                what + "row sums");
  }
}

// ---- metrics.h ------------------------------------------------------------------------------

TEST_F(Parity, HitNdcgWithTiesNaNsAndMasks) {
  for (int64_t U : kBatches)
    for (int L : {1, 2, 33, 101})
      for (int K : {1, 10})
        for (bool with_mask : {false, true}) {
          const std::string what = shape({{"U", U}, {"L", L}, {"K", K}, {"mask", with_mask}});
          // Small integer scores: many ties with the positive.
          std::uniform_int_distribution<int> score(0, 4);
          std::bernoulli_distribution keep(0.8);
          Vec s(size_t(U) * L);
          std::vector<uint8_t> mask(size_t(U) * L);
          for (size_t i = 0; i < s.size(); ++i) {
            s[i] = float(score(gen_));
            if (i % 53 == 7) s[i] = std::numeric_limits<float>::quiet_NaN();
            mask[i] = keep(gen_) ? 1 : 0;
          }
          Buffer<float> gs = up(s);
          Buffer<uint8_t> gm = up(mask);
          double hr_c = -1, nd_c = -1, hr_g = -1, nd_g = -1;
          hit_ndcg(cpu_, s.data(), with_mask ? mask.data() : nullptr, U, L, K, &hr_c, &nd_c);
          hit_ndcg(gpu_, gs.data(), with_mask ? gm.data() : nullptr, U, L, K, &hr_g, &nd_g);
          EXPECT_EQ(hr_g, hr_c) << what << "hits";  // a count: exact
          expect_close(std::vector<double>{nd_g}, std::vector<double>{nd_c}, kDoubleAtol,
                       kDoubleRtol, what + "ndcg");
        }
}

// hit_ndcg_accumulate on the device: after each batch the running sums (starting
// from non-zero values) are those sums plus the batch's device hit_ndcg sums, added
// on the host in the same order: the same bits. No wait per batch.
TEST_F(Parity, HitNdcgAccumulateAddsEachBatchsSumsOnTheDevice) {
  std::uniform_int_distribution<int> score(0, 4);
  const int L = 101, K = 10;
  std::vector<double> want = {0.5, 0.25};
  Buffer<double> gsums = up(want);
  for (int64_t U : kBatches) {
    Vec s(size_t(U) * L);
    std::vector<uint8_t> mask(size_t(U) * L);
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = float(score(gen_));
      mask[i] = i % 7 != 2;
    }
    Buffer<float> gs = up(s);
    Buffer<uint8_t> gm = up(mask);
    double hr = -1, nd = -1;
    hit_ndcg(gpu_, gs.data(), gm.data(), U, L, K, &hr, &nd);
    want[0] += hr;
    want[1] += nd;
    hit_ndcg_accumulate(gpu_, gs.data(), gm.data(), U, L, K, gsums.data());
    const std::vector<double> got = down(gsums);
    EXPECT_EQ(got[0], want[0]) << "U " << U;
    EXPECT_EQ(got[1], want[1]) << "U " << U;
  }
}

// ---- negatives.h ---------------------------------------------------------------------------

// A small dataset whose users hold from one item to all items but one, so the
// rejection loop sometimes runs long; the CPU samples from the memory-mapped
// lists, the GPU from their device copy.
TEST_F(Parity, NegativesBitIdenticalToCpu) {
  const uint64_t U = 40, I = 30;
  test::TempDir dir;
  DatasetPlan plan;
  plan.source = "test";
  plan.num_users = U;
  plan.num_items = I;
  plan.eval_negatives = 1;
  plan.record_rows = 7;
  plan.num_shards = 1;
  std::vector<IVec> pos(U);
  for (uint64_t u = 0; u < U; ++u) {
    IVec all(I);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen_);
    const size_t count = u == 0 ? I - 1 : 2 + (u * 7) % (I - 3);  // user 0: one free item
    pos[u].assign(all.begin(), all.begin() + count);
    plan.num_positives += count;
    plan.num_train += count - 1;
  }
  {
    DatasetWriter w(dir.path(), plan);
    for (uint64_t u = 0; u < U; ++u) {
      IVec sorted = pos[u];
      std::sort(sorted.begin(), sorted.end());
      IVec train(pos[u].begin(), pos[u].end() - 1);
      IVec eval = {pos[u].back(), -1};
      for (int32_t i = 0; i < int32_t(I); ++i)
        if (!std::binary_search(sorted.begin(), sorted.end(), i)) eval[1] = i;
      w.add_user(u, sorted.data(), sorted.size(), train.data(), train.size(), eval.data(),
                 eval.size());
    }
    w.finish();
  }
  DatasetMeta meta = DatasetMeta::load(dir.path());
  PositiveLists lists(dir.path(), meta);
  DevicePositiveLists dlists(lists, g_dev);
  // Both kernels' draws (lock-step rounds of up to 8, and one at a time); 9 negatives take
  // two rounds, and user 0's one free item many.
  for (bool ahead : {true, false})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
      for (int num_neg : {0, 1, 4, 9}) {
        set_negatives_ahead(ahead);
        const std::string what =
            shape({{"n", n}, {"num_neg", num_neg}}) + (ahead ? "ahead " : "one at a time ");
        IVec users = random_ids(n, 0, int32_t(U), gen_), items = random_ids(n, 0, int32_t(I), gen_);
        const size_t S = size_t(n) * (1 + num_neg);
        IVec ou(S, -5), oi(S, -5);
        Vec ol(S, -5.0f);
        Buffer<int32_t> gusers = up(users), gitems = up(items), gou = up(ou), goi = up(oi);
        Buffer<float> gol = up(ol);
        sample_negatives(cpu_, lists, I, users.data(), items.data(), 12345, n, num_neg, 99, 3,
                         ou.data(), oi.data(), ol.data());
        sample_negatives(gpu_, dlists, I, gusers.data(), gitems.data(), 12345, n, num_neg, 99, 3,
                         gou.data(), goi.data(), gol.data());
        expect_same(down(gou), ou, what + "users");
        expect_same(down(goi), oi, what + "items");
        expect_same(down(gol), ol, what + "labels");
      }
  set_negatives_ahead(true);
}

// ---- embedding_kernels.h ---------------------------------------------------------------------

// Two routed tables (row-wise, table-wise) and a replicated one whose keys are
// never routed.
KeyLayout parity_layout(int W, int64_t rows0) {
  KeyLayout l;
  l.W = W;
  l.T = 3;
  const int64_t rows[3] = {rows0, 17, 5};
  const Placement place[3] = {Placement::kRowWise, Placement::kTableWise, Placement::kReplicated};
  for (int t = 0; t < 3; ++t) {
    l.key_begin[t + 1] = l.key_begin[t] + rows[t];
    l.placement[t] = place[t];
    l.owner[t] = t == 1 ? W - 1 : 0;
  }
  return l;
}

TEST_F(Parity, BucketizeByOwnerExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int W : {1, 2, 3, 5, 8})
      for (int32_t range : {3, 1000000}) {
        const std::string what = shape({{"n", n}, {"W", W}, {"rows of table 0", range}});
        const KeyLayout layout = parity_layout(W, range);
        IVec keys = random_ids(n, 0, int32_t(layout.key_begin[2]), gen_);  // routed tables
        LVec perm(n, -1);
        IVec rows(n, -1);
        std::vector<int64_t> counts(W, -1), gcounts(W, -1);
        Buffer<int32_t> gkeys = up(keys), grows = up(rows);
        Buffer<int64_t> gperm = up(perm);
        bucketize_by_owner(cpu_, keys.data(), n, layout, perm.data(), rows.data(), counts.data());
        bucketize_by_owner(gpu_, gkeys.data(), n, layout, gperm.data(), grows.data(),
                           gcounts.data());
        expect_same(gcounts, counts, what + "counts");
        expect_same(down(gperm), perm, what + "perm");
        expect_same(down(grows), rows, what + "flat rows");
      }
}

TEST_F(Parity, IdsToKeysExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}})
    for (int64_t offset : {int64_t{0}, int64_t{138493}}) {
      const std::string what = shape({{"n", n}, {"offset", offset}});
      IVec ids = random_ids(n, 0, 26744, gen_), keys(n, -1);
      Buffer<int32_t> gids = up(ids), gkeys = up(keys);
      ids_to_keys(cpu_, ids.data(), n, offset, 26744, keys.data());
      ids_to_keys(gpu_, gids.data(), n, offset, 26744, gkeys.data());
      expect_same(down(gkeys), keys, what + "keys");
    }
}

TEST_F(Parity, UniqueIdsExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20000}})
    for (int32_t range : {1, 5, 1000000}) {
      const std::string what = shape({{"n", n}, {"id range", range}});
      IVec ids = random_ids(n, 0, range, gen_);
      IVec uniq(n, -1);
      LVec inv(n, -1);
      Buffer<int32_t> gids = up(ids), guniq = up(uniq);
      Buffer<int64_t> ginv = up(inv);
      int64_t nu = -1, gnu = -1;
      unique_ids(cpu_, ids.data(), n, uniq.data(), inv.data(), &nu);
      unique_ids(gpu_, gids.data(), n, guniq.data(), ginv.data(), &gnu);
      ASSERT_EQ(gnu, nu) << what;
      expect_same(down(guniq, nu), IVec(uniq.begin(), uniq.begin() + nu), what + "unique");
      expect_same(down(ginv), inv, what + "inverse");
      // With the ids' bound the GPU sorts fewer bits: the same result.
      Buffer<int32_t> guniq_b = up(IVec(n, -1));
      Buffer<int64_t> ginv_b = up(LVec(n, -1));
      int64_t gnu_b = -1;
      unique_ids(gpu_, gids.data(), n, guniq_b.data(), ginv_b.data(), &gnu_b, range);
      ASSERT_EQ(gnu_b, nu) << what << "bounded";
      expect_same(down(guniq_b, nu), IVec(uniq.begin(), uniq.begin() + nu),
                  what + "bounded unique");
      expect_same(down(ginv_b), inv, what + "bounded inverse");
    }
}

TEST_F(Parity, PermuteAndUnpermuteRowsExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
    for (int D : kWidths)
      for (int offset : {0, 1}) {
        const std::string what = shape({{"n", n}, {"D", D}, {"offset", offset}});
        const int64_t n_src = std::max<int64_t>(1, n / 3);
        Vec src = random_vec(size_t(std::max(n, n_src)) * D + offset, gen_);
        LVec idx(n), perm(n);
        std::uniform_int_distribution<int64_t> pick(0, n_src - 1);
        for (int64_t k = 0; k < n; ++k) idx[k] = pick(gen_);  // repeats: a gather
        std::iota(perm.begin(), perm.end(), int64_t{0});
        std::shuffle(perm.begin(), perm.end(), gen_);
        Vec out(size_t(n) * D + offset, 2.0f), back(size_t(n) * D + offset, 3.0f);
        Buffer<float> gsrc = up(src), gout = up(out), gback = up(back);
        Buffer<int64_t> gidx = up(idx), gperm = up(perm);
        permute_rows(cpu_, src.data() + offset, n_src, idx.data(), out.data() + offset, n, D);
        permute_rows(gpu_, gsrc.data() + offset, n_src, gidx.data(), gout.data() + offset, n, D);
        expect_same(down(gout), out, what + "permute");
        unpermute_rows(cpu_, src.data() + offset, perm.data(), back.data() + offset, n, D);
        unpermute_rows(gpu_, gsrc.data() + offset, gperm.data(), gback.data() + offset, n, D);
        expect_same(down(gback), back, what + "unpermute");
      }
}

// BF16 payloads (--exchange_dtype bf16): pack, unpack and round in place give
// the same bits on both devices, ties, Inf, NaN and subnormals included.
TEST_F(Parity, Bf16PayloadConversionsExact) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
    Vec x = random_vec(size_t(n), gen_);
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f,
                             -0.0f,          0x1p-140f,
                             3.4e38f,        INFINITY,
                             -INFINITY,      NAN};
    for (size_t k = 0; k < x.size() && k < 8; ++k) x[k] = special[k];
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    Buffer<float> gx = up(x);
    Buffer<uint16_t> gbits(g_dev, size_t(n));
    pack_bf16(cpu_, x.data(), bits.data(), n);
    pack_bf16(gpu_, gx.data(), gbits.data(), n);
    expect_same(down(gbits), bits, shape({{"pack n", n}}));
    Vec wide(static_cast<size_t>(n));
    Buffer<float> gwide(g_dev, size_t(n));
    unpack_bf16(cpu_, bits.data(), wide.data(), n);
    unpack_bf16(gpu_, gbits.data(), gwide.data(), n);
    expect_same(down(gwide), wide, shape({{"unpack n", n}}));
    round_bf16(cpu_, x.data(), n);
    round_bf16(gpu_, gx.data(), n);
    expect_same(down(gx), x, shape({{"round n", n}}));
  }
}

// BF16 rows (--table_dtype bf16): the widening gather, the scatter, the row
// offsets and the stochastic store keyed by global row give the same bits on
// both devices.
TEST_F(Parity, Bf16RowOpsExact) {
  for (int D : {1, 5, 8, 192})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{300}}) {
      const int64_t R = 1000;
      const std::string what = shape({{"D", D}, {"n", n}});
      IVec rows = random_unique_rows(R, n, gen_);
      const Vec src = random_vec(size_t(n) * D, gen_);
      std::vector<uint16_t> table(size_t(R) * D);
      for (size_t k = 0; k < table.size(); ++k) table[k] = uint16_t(0x3C00 + k % 0x800);
      RowRounding key;
      key.seed = 99;
      key.step = 17;
      key.first = 5;
      key.rank = 2;
      key.layout.W = 4;
      key.layout.T = 2;
      key.layout.key_begin[1] = 4 * 700;
      key.layout.key_begin[2] = 4 * 700 + 4 * 400;
      key.tag[0] = 1;
      key.tag[1] = 2;
      Buffer<uint16_t> gtable = up(table);
      Buffer<RowId> grows = up(rows);
      Buffer<float> gsrc = up(src);
      store_rows_bf16(cpu_, src.data(), rows.data(), table.data(), R, n, D, key);
      store_rows_bf16(gpu_, gsrc.data(), grows.data(), gtable.data(), R, n, D, key);
      expect_same(down(gtable), table, what + "store by rows");
      store_rows_bf16(cpu_, src.data(), nullptr, table.data(), R, n, D, key);
      store_rows_bf16(gpu_, gsrc.data(), nullptr, gtable.data(), R, n, D, key);
      expect_same(down(gtable), table, what + "store in order");
      Vec out(size_t(n) * D);
      Buffer<float> gout(g_dev, size_t(n) * D);
      gather_rows_bf16(cpu_, table.data(), rows.data(), out.data(), R, n, D);
      gather_rows_bf16(gpu_, gtable.data(), grows.data(), gout.data(), R, n, D);
      expect_same(down(gout), out, what + "gather");
      Vec dense = random_vec(size_t(R) * D, gen_);
      Buffer<float> gdense = up(dense);
      scatter_rows(cpu_, src.data(), rows.data(), dense.data(), R, n, D);
      scatter_rows(gpu_, gsrc.data(), grows.data(), gdense.data(), R, n, D);
      expect_same(down(gdense), dense, what + "scatter");
      IVec shifted(static_cast<size_t>(n)), iota(static_cast<size_t>(n));
      Buffer<RowId> gshifted(g_dev, size_t(n)), giota(g_dev, size_t(n));
      offset_rows(cpu_, rows.data(), n, -3, shifted.data());
      offset_rows(gpu_, grows.data(), n, -3, gshifted.data());
      offset_rows(cpu_, nullptr, n, 0, iota.data());
      offset_rows(gpu_, nullptr, n, 0, giota.data());
      expect_same(down(gshifted), shifted, what + "offset");
      expect_same(down(giota), iota, what + "iota");
    }
}

// ---- bad input found by kernels -----------------------------------------------------------

TEST_F(Parity, ReplicatedDenseGradientExact) {
  for (int64_t N : {int64_t{1}, int64_t{7}, int64_t{26744}})
    for (int D : kWidths)
      for (int every : {1, 3, 1000000}) {  // all rows touched, a third, (almost) none
        const std::string what = shape({{"N", N}, {"D", D}, {"every", every}});
        IVec rows;
        for (int32_t r = 0; r < N; r += every) rows.push_back(r);
        const int64_t n = int64_t(rows.size());
        Vec grads = random_vec(size_t(n) * D, gen_);
        Vec dense(size_t(N) * (D + 1), 9.0f);
        Buffer<int32_t> grows = up(rows);
        Buffer<float> ggrads = up(grads), gdense = up(dense);
        scatter_rows_dense(cpu_, rows.data(), grads.data(), n, D, N, dense.data());
        scatter_rows_dense(gpu_, grows.data(), ggrads.data(), n, D, N, gdense.data());
        expect_same(down(gdense), dense, what + "dense");
        IVec out_rows(size_t(N), -1);
        Vec out_grads(size_t(N) * D, -1.0f);
        Buffer<int32_t> gout_rows = up(out_rows);
        Buffer<float> gout_grads = up(out_grads);
        int64_t m = -1, gm = -1;
        compact_touched_rows(cpu_, dense.data(), N, D, out_rows.data(), out_grads.data(), &m);
        compact_touched_rows(gpu_, gdense.data(), N, D, gout_rows.data(), gout_grads.data(), &gm);
        ASSERT_EQ(gm, m) << what;
        expect_same(down(gout_rows, m), IVec(out_rows.begin(), out_rows.begin() + m),
                    what + "rows");
        expect_same(down(gout_grads, size_t(m) * D),
                    Vec(out_grads.begin(), out_grads.begin() + m * D), what + "grads");
      }
  // Unsorted rows are recorded and raised by the next check.
  DEVICE_HALF_NEEDS_A_GPU();
  IVec bad = {1, 0};
  Vec g(2 * 3, 1.0f);
  Buffer<int32_t> gbad = up(bad);
  Buffer<float> gg = up(g), gd(Device::kCuda, 2 * 4);
  scatter_rows_dense(gpu_, gbad.data(), gg.data(), 2, 3, 2, gd.data());
  try {
    check_device_errors(gpu_);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scatter_rows_dense"), std::string::npos) << e.what();
  }
}

TEST_F(Parity, KernelErrorsAreRaisedAndLeaveTablesAlone) {
  DEVICE_HALF_NEEDS_A_GPU();
  // An out-of-range id: recorded by the gather, raised by the check, then cleared.
  Vec table = random_vec(4 * 3, gen_);
  IVec ids = {0, 1, 2, 9, 3};
  Buffer<float> gtable = up(table), gout(Device::kCuda, 5 * 3);
  Buffer<RowId> gids = up(ids);
  gather_rows(gpu_, gtable.data(), gids.data(), gout.data(), 4, 5, 3);
  try {
    check_device_errors(gpu_);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gather_rows"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 3, value 9, bound 4"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(check_device_errors(gpu_));  // cleared

  // A pending error is raised by the next synchronizing op.
  gather_rows(gpu_, gtable.data(), gids.data(), gout.data(), 4, 5, 3);
  int64_t nu = 0;
  Buffer<RowId> gu(Device::kCuda, 5);
  Buffer<float> gg(Device::kCuda, 5 * 3);
  EXPECT_THROW(sort_reduce_rows(gpu_, gids.data(), gout.data(), 5, 3, gu.data(), gg.data(), &nu),
               Error);

  // Unsorted unique_rows: the update does nothing, the check names the problem.
  IVec rows = {2, 1};
  Vec grads(2 * 3, 0.5f);
  Buffer<RowId> grows = up(rows);
  Buffer<float> ggrads = up(grads);
  SgdHyper sgd;
  embedding_sgd(gpu_, gtable.data(), grows.data(), ggrads.data(), 4, 2, 3, sgd);
  EXPECT_THROW(check_device_errors(gpu_), Error);
  expect_same(down(gtable), table, "table after a rejected update");
}

// ---- the fused table update ------------------------------------------------------------

// A bad row in an update, for every table optimizer, fused or not: each device
// refuses it (at the call, or at the next check on the GPU) and leaves the
// table and its state exactly as they were. The fused update runs with its
// unique count (the GPU waits for it) and without (the whole update enqueued). The rows are sorted,
// so the bad one is first or last and the others are valid: an update that checked rows while it
// applied them would have changed some.
TEST_F(Parity, BadRowLeavesTablesAloneWithEveryOptimizer) {
  const int64_t R = 50;
  const int D = 8;
  EmbeddingOptimizerConfig opt;
  opt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.01f};
  opt.adagrad = {0.05f, 0.1f, 1e-7f, 0.01f};
  opt.sgd = {0.3f, 0.01f};
  auto refused = [](const ExecContext& ctx, const std::function<void()>& op,
                    const std::string& what) {
    try {
      op();
      check_device_errors(ctx);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error&) {
    }
    EXPECT_NO_THROW(check_device_errors(ctx)) << what << ": the record was not cleared";
  };
  for (int32_t bad : {-1, int32_t(R), int32_t(R) + 1000})
    for (size_t at : {size_t{0}, size_t{10}, size_t{19}}) {
      // Valid rows 0, 2, 4, ... with the one at `at` replaced by the bad row;
      // sorted, the bad row lands first (-1) or last (R and beyond).
      IVec rows;
      for (int32_t k = 0; k < 20; ++k) rows.push_back(2 * k);
      rows[at] = bad;
      std::sort(rows.begin(), rows.end());  // ascending and distinct, as the updates expect
      const int64_t n = int64_t(rows.size());
      const Vec grads = random_vec(size_t(n) * D, gen_, -0.1f, 0.1f);
      const Vec tab0 = random_vec(size_t(R) * D, gen_),
                m0 = random_vec(size_t(R) * D, gen_, 0, 0.1f),
                v0 = random_vec(size_t(R) * D, gen_, 0.0f, 0.01f);
      for (const ExecContext* ctx : {&cpu_, &gpu_}) {
        const bool dev = ctx == &gpu_;
        const std::string what =
            shape({{"bad", bad}, {"at", int64_t(at)}}) + (dev ? "device " : "cpu ");
        for (EmbeddingOptimizer kind :
             {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam,
              EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kAdagrad,
              EmbeddingOptimizer::kRowwiseAdagrad}) {
          opt.kind = kind;
          // reduce_update_rows (the trainer's fused path) with and without its
          // count, and the optimizer on already-unique rows, each on fresh
          // copies of the table and state.
          for (int fused = 0; fused < 3; ++fused) {
            const std::string w = what + optimizer_name(kind) +
                                  (fused == 2   ? " fused, no count"
                                   : fused == 1 ? " fused"
                                                : " unique");
            Vec tab = tab0, m = m0, v = v0;
            Buffer<RowId> grows = up(rows);
            Buffer<float> ggrads = up(grads), gtab = up(tab), gm = up(m), gv = up(v);
            const RowId* r = dev ? grows.data() : rows.data();
            const float* g = dev ? ggrads.data() : grads.data();
            float* pt = dev ? gtab.data() : tab.data();
            float* pm = dev ? gm.data() : m.data();
            float* pv = dev ? gv.data() : v.data();
            refused(
                *ctx,
                [&] {
                  if (fused) {
                    int64_t nu = 0;
                    reduce_update_rows(*ctx, r, g, n, TableRows{pt, pm, pv, R, D}, opt, 1,
                                       fused == 1 ? &nu : nullptr);
                    return;
                  }
                  switch (kind) {
                    case EmbeddingOptimizer::kDenseAdam:
                      embedding_dense_adam(*ctx, pt, pm, pv, r, g, R, n, D, 1, opt.adam);
                      break;
                    case EmbeddingOptimizer::kLazyAdam:
                      embedding_lazy_adam(*ctx, pt, pm, pv, r, g, R, n, D, 1, opt.adam);
                      break;
                    case EmbeddingOptimizer::kSgd:
                      embedding_sgd(*ctx, pt, r, g, R, n, D, opt.sgd);
                      break;
                    case EmbeddingOptimizer::kAdagrad:
                      embedding_adagrad(*ctx, pt, pm, r, g, R, n, D, opt.adagrad);
                      break;
                    case EmbeddingOptimizer::kRowwiseAdagrad:
                      embedding_rowwise_adagrad(*ctx, pt, pm, r, g, R, n, D, opt.adagrad);
                      break;
                  }
                },
                w);
            expect_same(dev ? down(gtab) : tab, tab0, w + " table");
            expect_same(dev ? down(gm) : m, m0, w + " state 1");
            expect_same(dev ? down(gv) : v, v0, w + " state 2");
          }
        }
      }
    }
}

TEST_F(Parity, ReduceUpdateRowsEveryOptimizer) {
  EmbeddingOptimizerConfig opt;
  opt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.01f};
  opt.adagrad = {0.05f, 0.1f, 1e-7f, 0.01f};
  opt.sgd = {0.3f, 0.01f};
  for (EmbeddingOptimizer kind :
       {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam, EmbeddingOptimizer::kSgd,
        EmbeddingOptimizer::kAdagrad, EmbeddingOptimizer::kRowwiseAdagrad}) {
    opt.kind = kind;
    for (int D : {1, 3, 4, 5, 8, 192})
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}})
        for (int64_t R : {int64_t{3}, int64_t{5000}}) {
          const std::string what =
              shape({{"D", D}, {"n", n}, {"R", R}}) + optimizer_name(kind) + " ";
          // Duplicates everywhere, and one row repeated past two sub-runs.
          IVec rows = random_ids(n, 0, int32_t(R), gen_);
          for (int64_t k = 0; k < n; k += 3) rows[k] = int32_t(R / 2);
          if (n == 1000) {
            ASSERT_GT(std::count(rows.begin(), rows.end(), int32_t(R / 2)), 2 * kSubRun) << what;
          }
          const Vec grads = random_vec(size_t(n) * D, gen_, -0.1f, 0.1f);
          // m is Adagrad's accumulator there, so it starts >= 0 like one.
          const bool acc =
              kind == EmbeddingOptimizer::kAdagrad || kind == EmbeddingOptimizer::kRowwiseAdagrad;
          const float m_lo = acc ? 0.0f : -0.1f;
          Vec tab = random_vec(size_t(R) * D, gen_),
              m = random_vec(size_t(R) * D, gen_, m_lo, 0.1f),
              v = random_vec(size_t(R) * D, gen_, 0.0f, 0.01f);
          Buffer<RowId> grows = up(rows);
          Buffer<float> ggrads = up(grads), gtab = up(tab), gm = up(m), gv = up(v);
          // And without the unique count: the counts stay on the GPU, no host wait.
          Buffer<float> qtab = up(tab), qm = up(m), qv = up(v);
          int64_t nu = -1, gnu = -1;
          for (int64_t t = 1; t <= 2; ++t) {
            reduce_update_rows(cpu_, rows.data(), grads.data(), n,
                               TableRows{tab.data(), m.data(), v.data(), R, D}, opt, t, &nu);
            reduce_update_rows(gpu_, grows.data(), ggrads.data(), n,
                               TableRows{gtab.data(), gm.data(), gv.data(), R, D}, opt, t, &gnu);
            reduce_update_rows(gpu_, grows.data(), ggrads.data(), n,
                               TableRows{qtab.data(), qm.data(), qv.data(), R, D}, opt, t);
          }
          ASSERT_EQ(gnu, nu) << what;
          expect_same(down(qtab), down(gtab), what + "table, counts on the device");
          expect_same(down(qm), down(gm), what + "state 1, counts on the device");
          expect_same(down(qv), down(gv), what + "state 2, counts on the device");
          IVec distinct = rows;
          std::sort(distinct.begin(), distinct.end());
          EXPECT_EQ(nu, std::unique(distinct.begin(), distinct.end()) - distinct.begin()) << what;
          // NaN meets NaN in expect_close: the reference must have none.
          ASSERT_TRUE(std::none_of(tab.begin(), tab.end(), [](float x) { return std::isnan(x); }))
              << what;
          // The run sums follow the same order on both devices; the update's
          // sqrt and division may differ by an ulp or two.
          expect_close(down(gtab), tab, kElemAtol, kElemRtol, what + "table");
          expect_close(down(gm), m, kElemAtol, kElemRtol, what + "state 1");
          expect_close(down(gv), v, kElemAtol, kElemRtol, what + "state 2");
        }
  }
}

// Dense Adam with columns given directly (GivenColumns) on the GPU: the bits of the same update
// over gradient rows carrying them on each row's first row and zeros on the others, on the
// vector (D = 192, columns from 64) and scalar (D = 9, from 3) paths, rows repeated past two
// sub-runs; and close to the CPU's.
TEST_F(Parity, DenseAdamGivenColumnsAreTheirFirstRowSums) {
  EmbeddingOptimizerConfig opt;
  opt.kind = EmbeddingOptimizer::kDenseAdam;
  opt.adam = {0.01f, 0.9f, 0.999f, 1e-7f, 0.0f};
  for (const auto& [D, col] : {std::pair<int, int>{192, 64}, std::pair<int, int>{9, 3}})
    for (int64_t n : {int64_t{1}, int64_t{1000}}) {
      const int64_t R = 700, lo = 100, hi = 650;
      const int w = D - col;
      const std::string what = shape({{"D", D}, {"col", col}, {"n", n}});
      IVec rows = random_ids(n, 0, int32_t(R), gen_);
      for (int64_t k = 0; k < n; k += 3) rows[k] = int32_t(R / 2);
      const Vec given = random_vec(size_t(hi - lo) * w, gen_, -0.1f, 0.1f);
      Vec grads = random_vec(size_t(n) * D, gen_, -0.1f, 0.1f), full = grads;
      std::vector<bool> seen(size_t(R), false);
      for (int64_t k = 0; k < n; ++k) {
        const int32_t r = rows[size_t(k)];
        if (r < lo || r >= hi) continue;
        for (int d = col; d < D; ++d) {
          full[size_t(k) * D + d] = seen[size_t(r)] ? 0.0f : given[size_t(r - lo) * w + d - col];
          grads[size_t(k) * D + d] = std::nanf("");
        }
        seen[size_t(r)] = true;
      }
      const Vec tab = random_vec(size_t(R) * D, gen_);
      const Vec zeros(size_t(R) * D, 0.0f);
      Buffer<RowId> grows = up(rows);
      Buffer<float> gfull = up(full), ggrads = up(grads), ggiven = up(given);
      Buffer<float> gtab[2] = {up(tab), up(tab)}, gm[2] = {up(zeros), up(zeros)},
                    gv[2] = {up(zeros), up(zeros)};
      Vec ctab = tab, cm = zeros, cv = zeros;
      for (int64_t t = 1; t <= 2; ++t) {
        reduce_update_rows(gpu_, grows.data(), gfull.data(), n,
                           TableRows{gtab[0].data(), gm[0].data(), gv[0].data(), R, D}, opt, t);
        reduce_update_rows(gpu_, grows.data(), ggrads.data(), n,
                           TableRows{gtab[1].data(), gm[1].data(), gv[1].data(), R, D}, opt, t,
                           nullptr, GivenColumns{ggiven.data(), lo, hi, col});
        reduce_update_rows(cpu_, rows.data(), grads.data(), n,
                           TableRows{ctab.data(), cm.data(), cv.data(), R, D}, opt, t, nullptr,
                           GivenColumns{given.data(), lo, hi, col});
      }
      expect_same(down(gtab[1]), down(gtab[0]), what + "table");
      expect_same(down(gm[1]), down(gm[0]), what + "first moments");
      expect_same(down(gv[1]), down(gv[0]), what + "second moments");
      expect_close(down(gtab[1]), ctab, kElemAtol, kElemRtol, what + "table against the CPU");
    }
}

TEST_F(Parity, RoutingErrorsNameTheOp) {
  DEVICE_HALF_NEEDS_A_GPU();
  IVec ids = {0, 7, 3}, keys(3);
  Buffer<int32_t> gids = up(ids), gkeys = up(keys);
  ids_to_keys(gpu_, gids.data(), 3, 10, 7, gkeys.data());
  try {
    check_device_errors(gpu_);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids_to_keys"), std::string::npos) << e.what();
  }
  const KeyLayout layout = parity_layout(2, 10);
  IVec routed = {0, int32_t(layout.key_begin[2]) + 1};  // the second: a replicated table's key
  Buffer<int32_t> groutes = up(routed), grows(Device::kCuda, 2);
  Buffer<int64_t> gperm(Device::kCuda, 2);
  std::vector<int64_t> counts(2);
  try {
    bucketize_by_owner(gpu_, groutes.data(), 2, layout, gperm.data(), grows.data(), counts.data());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucketize_by_owner"), std::string::npos) << e.what();
  }
}

// ---- topk.h ---------------------------------------------------------------------------

// Same items and scores bit for bit: scores from a few levels (many ties, -0
// and +0 among them), rows with many, none, or all items excluded, K past
// the items left, and blocks of rows larger than one CUB call sorts.
TEST_F(Parity, TopKEqualsTheCpuSelection) {
  const float levels[] = {-0.0f, 0.0f, 1.5f, -2.25f, 3.0f, 1e-3f, -1e-30f};
  for (const auto& [n, I, K] :
       {std::tuple{int64_t{0}, int64_t{5}, 3}, std::tuple{int64_t{1}, int64_t{1}, 1},
        std::tuple{int64_t{7}, int64_t{13}, 20}, std::tuple{int64_t{300}, int64_t{1000}, 10},
        std::tuple{int64_t{3}, (int64_t{1} << 25) + 7, 5}}) {
    Vec scores(size_t(n * I));
    std::uniform_int_distribution<int> pick(0, 6);
    std::uniform_real_distribution<float> real(-4.0f, 4.0f);
    for (size_t x = 0; x < scores.size(); ++x)
      scores[x] = x % 3 == 0 ? real(gen_) : levels[pick(gen_)];
    LVec offsets(size_t(n + 1), 0);
    IVec excluded;
    for (int64_t u = 0; u < n; ++u) {
      const int64_t every = u % 4 == 0 ? 1 : 2 + u % 5;  // row 0, 4, ...: everything
      if (u % 4 != 1)
        for (int64_t j = u % 3; j < std::min<int64_t>(I, 4096); j += every)
          excluded.push_back(int32_t(j));
      offsets[size_t(u + 1)] = int64_t(excluded.size());
    }
    const std::string what = shape({{"n", n}, {"I", I}, {"K", K}});
    for (bool with_excluded : {false, true}) {
      IVec c_items(size_t(n * K)), g_items_host;
      Vec c_scores(size_t(n * K));
      top_k(cpu_, scores.data(), n, I, with_excluded ? offsets.data() : nullptr,
            with_excluded ? excluded.data() : nullptr, K, c_items.data(), c_scores.data());
      Buffer<float> gs = up(scores);
      Buffer<int64_t> go = up(offsets);
      Buffer<int32_t> ge = up(excluded.empty() ? IVec{0} : excluded);
      Buffer<int32_t> gi(g_dev, size_t(std::max<int64_t>(1, n * K)));
      Buffer<float> gsc(g_dev, size_t(std::max<int64_t>(1, n * K)));
      top_k(gpu_, gs.data(), n, I, with_excluded ? go.data() : nullptr,
            with_excluded ? ge.data() : nullptr, K, gi.data(), gsc.data());
      IVec gi_host(size_t(n * K));
      Vec gs_host(size_t(n * K));
      device_copy(Device::kCpu, gi_host.data(), g_dev, gi.data(), gi_host.size() * 4);
      device_copy(Device::kCpu, gs_host.data(), g_dev, gsc.data(), gs_host.size() * 4);
      EXPECT_EQ(gi_host, c_items) << what << (with_excluded ? " excluded" : "");
      EXPECT_EQ(0, std::memcmp(gs_host.data(), c_scores.data(), c_scores.size() * 4))
          << what << (with_excluded ? " excluded" : "");
    }
  }
}

// An excluded item outside [0, I) would mark another row's item (or memory
// past the scores) on the GPU: both devices refuse it, naming the op.
TEST_F(Parity, TopKRefusesExcludedItemsOutsideTheRow) {
  const int64_t n = 3, I = 6;
  const int K = 8;  // more than the row: the tail is item -1
  const Vec scores = random_vec(size_t(n * I), gen_);
  for (int32_t bad : {-1, int32_t(I), int32_t(I) + 7}) {
    const LVec offsets = {0, 1, 3, 4};
    const IVec excluded = {2, 0, bad, 5};  // row 1 holds the bad entry
    for (const ExecContext* ctx : {&cpu_, &gpu_}) {
      const bool dev = ctx == &gpu_;
      const std::string what = shape({{"bad", bad}}) + (dev ? "device" : "cpu");
      Buffer<float> gs = up(scores);
      Buffer<int64_t> go = up(offsets);
      Buffer<int32_t> ge = up(excluded);
      Buffer<int32_t> gi(g_dev, size_t(n * K));
      Buffer<float> gsc(g_dev, size_t(n * K));
      IVec items(size_t(n * K));
      Vec top(size_t(n * K));
      try {
        top_k(*ctx, dev ? gs.data() : scores.data(), n, I, dev ? go.data() : offsets.data(),
              dev ? ge.data() : excluded.data(), K, dev ? gi.data() : items.data(),
              dev ? gsc.data() : top.data());
        check_device_errors(*ctx);
        ADD_FAILURE() << what << ": accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos) << what << e.what();
      }
    }
  }
}

// NCF_SCRATCH_DEBUG=separate (the sanitizer stages' mode: every scratch array an
// allocation of its own) changes where arrays live, not what the ops compute:
// the sort-reduce and top-K on a context made in that mode equal the CPU's bit
// for bit. Any other value is refused by name.
TEST_F(Parity, SeparateScratchModeComputesTheSame) {
  const int64_t n = 5000, D = 8, I = 300;
  const IVec ids = random_ids(n, 0, 700, gen_);
  const Vec grads = random_vec(size_t(n * D), gen_), scores = random_vec(size_t(4 * I), gen_);
  IVec urows(n, -1), items(size_t(4 * 10));
  Vec rgrads(size_t(n * D)), top(size_t(4 * 10));
  int64_t nu = -1;
  sort_reduce_rows(cpu_, ids.data(), grads.data(), n, D, urows.data(), rgrads.data(), &nu, 700);
  top_k(cpu_, scores.data(), 4, I, nullptr, nullptr, 10, items.data(), top.data());
  DEVICE_HALF_NEEDS_A_GPU();
  struct Env {
    explicit Env(const char* v) { setenv("NCF_SCRATCH_DEBUG", v, 1); }
    ~Env() { unsetenv("NCF_SCRATCH_DEBUG"); }
  };
  {
    Env bad("pad");
    try {
      make_cuda_context(0);
      ADD_FAILURE() << "NCF_SCRATCH_DEBUG=pad accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NCF_SCRATCH_DEBUG=pad"), std::string::npos) << e.what();
    }
  }
  Env separate("separate");
  ExecContext sep = make_cuda_context(0);
  {
    Buffer<RowId> gids = up(ids), gurows = up(IVec(n, -1));
    Buffer<float> ggrads = up(grads), grgrads = up(Vec(size_t(n * D))), gs = up(scores);
    Buffer<int32_t> gi(g_dev, items.size());
    Buffer<float> gt(g_dev, top.size());
    int64_t gnu = -1;
    sort_reduce_rows(sep, gids.data(), ggrads.data(), n, D, gurows.data(), grgrads.data(), &gnu,
                     700);
    top_k(sep, gs.data(), 4, I, nullptr, nullptr, 10, gi.data(), gt.data());
    check_device_errors(sep);
    ASSERT_EQ(gnu, nu);
    expect_same(down(gurows, size_t(nu)), IVec(urows.begin(), urows.begin() + nu), "unique rows");
    expect_same(down(grgrads, size_t(nu * D)), Vec(rgrads.begin(), rgrads.begin() + nu * D),
                "row sums");
    expect_same(down(gi), items, "top-K items");
    expect_same(down(gt), top, "top-K scores");
  }
  destroy_cuda_context(sep);
}

// ---- one whole training step: train_step on both devices -----------------------------------

// A step's ReLU kinks may fall on opposite sides on the two devices (a
// pre-activation within rounding of 0), which changes whole gradient rows; an
// element they touch moves by at most lr per step either way. So: every
// element within steps · 2 · lr, and all but kKinkShare of them within the
// element tolerance.
constexpr double kKinkShare = 0.01;

void expect_mostly_close(const Vec& gpu, const Vec& cpu, double bound, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t loose = 0;
  for (size_t k = 0; k < gpu.size(); ++k) {
    const double d = std::fabs(double(gpu[k]) - cpu[k]);
    ASSERT_LE(d, bound) << what << " [" << k << "]: gpu " << gpu[k] << ", cpu " << cpu[k];
    loose += d > kElemAtol + kElemRtol * std::fabs(cpu[k]);
  }
  EXPECT_LE(double(loose), kKinkShare * double(gpu.size()) + 1)
      << what << ": " << loose << " elements past the tolerance";
}

// The training steps' small set (300 users, 200 items) at `data`.
void prepare_step_data(const std::string& data) {
  auto r = test::run(test::bin("ncf_prep") +
                     " --synthetic custom --users 300 --items 200 "
                     "--interactions 8000 --eval_negatives 20 --record_rows 256 --num_shards 2 "
                     "--seed 5 --output " +
                     data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// On the GPU, the step whose item lookup writes the GMF columns only (layer 0 reading its
// runs' MLP columns from the item table) gives the bits of the one that writes whole rows.
TEST_F(Parity, NarrowItemLookupStepIsTheWholeRowStepBitForBit) {
  test::TempDir dir;
  const std::string data = dir.file("data");
  ASSERT_NO_FATAL_FAILURE(prepare_step_data(data));
  const DatasetMeta meta = DatasetMeta::load(data);
  const PositiveLists lists(data, meta);
  const DevicePositiveLists dlists(lists, g_dev);
  NeuMFConfig cfg;
  cfg.mf_dim = 8;
  cfg.layers = {64, 32, 16, 8};
  EmbeddingPlan plan;
  plan.D = cfg.embedding_width();
  plan.W = 1;
  plan.tables = {{"user", int64_t(meta.num_users), Placement::kRowWise, 0, 1, 0.05f},
                 {"item", int64_t(meta.num_items), Placement::kRowWise, 0, 2, 0.05f}};
  EmbeddingOptimizerConfig eopt;
  eopt.kind = EmbeddingOptimizer::kDenseAdam;
  eopt.adam = {0.002f, 0.9f, 0.999f, 1e-7f, 0.0f};
  SingleCommunicator comm;
  set_layer0_by_item(Layer0ByItem::kOn);  // by item on the CPU stand-in too
  for (MathMode mode : {MathMode::kTf32, MathMode::kBf16}) {
    set_math_mode(mode);
    std::vector<float> params[2], tables[2][2];
    for (int narrow = 0; narrow < 2; ++narrow) {
      set_narrow_item_lookups(narrow == 1);
      EmbeddingCollection coll(plan, comm, gpu_, eopt, false);
      coll.init(3);
      NeuMF model(cfg, g_dev);
      model.init(3);
      TrainState st;
      st.positives = &lists;
      st.device_positives = &dlists;
      st.num_items = int64_t(meta.num_items);
      st.num_neg = 4;
      st.seed = 3;
      st.dense_hyper = {0.002f, 0.9f, 0.999f, 1e-8f, 0.0f};
      st.tables = &coll;
      st.model = &model;
      st.allocate(gpu_);
      Buffer<double> loss(g_dev, 1);
      TrainReader reader(data, meta, 0, 1, 400, 3, false);
      reader.start_epoch(0);
      TrainBatch b;
      for (int step = 0; step < 3; ++step) {
        ASSERT_TRUE(reader.next(&b));
        const int64_t n = int64_t(b.users.size());
        ASSERT_TRUE(coll.narrow_lookups());
        ASSERT_TRUE(model.layer0_by_item(n * 5, ItemKeys{b.items.data(), st.num_items}));
        Buffer<int32_t> gu = up(b.users), gi = up(b.items);
        train_step(st, {gu.data(), gi.data(), n, b.slice_begin, b.epoch, b.step_count}, comm, gpu_,
                   loss.data());
      }
      params[narrow] = down(model.params(), size_t(model.num_params()));
      for (int t = 0; t < 2; ++t) tables[narrow][t] = coll.gather_table(t);
    }
    const std::string what = mode == MathMode::kTf32 ? "tf32 " : "bf16 ";
    expect_same(params[1], params[0], what + "tower");
    for (int t = 0; t < 2; ++t)
      expect_same(tables[1][t], tables[0][t], what + "table " + std::to_string(t));
  }
}

TEST_F(Parity, TrainStepOnBothDevices) {
  test::TempDir dir;
  const std::string data = dir.file("data");
  ASSERT_NO_FATAL_FAILURE(prepare_step_data(data));
  const DatasetMeta meta = DatasetMeta::load(data);
  const PositiveLists lists(data, meta);
  const DevicePositiveLists dlists(lists, g_dev);
  NeuMFConfig wide;  // D = 8 + 32 = 40: float4 paths
  wide.mf_dim = 8;
  wide.layers = {64, 32, 16, 8};
  NeuMFConfig odd;  // D = 3 + 2 = 5: scalar paths
  odd.mf_dim = 3;
  odd.layers = {4, 5, 3};
  // Placements: both row-wise (the exchange path), or a table-wise user table and
  // a replicated item table (the dense-gradient path: scatter, allreduce, compact).
  const Placement placements[2][2] = {{Placement::kRowWise, Placement::kRowWise},
                                      {Placement::kTableWise, Placement::kReplicated}};
  for (const NeuMFConfig& cfg : {wide, odd})
    for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam})
      for (const auto& place : placements)
        for (bool dedup : {false, true}) {
          const std::string what = shape({{"D", cfg.embedding_width()}, {"dedup", dedup}}) +
                                   optimizer_name(kind) + " " + placement_name(place[0]) + "/" +
                                   placement_name(place[1]) + " ";
          EmbeddingPlan plan;
          plan.D = cfg.embedding_width();
          plan.W = 1;
          plan.tables = {{"user", int64_t(meta.num_users), place[0], 0, 1, 0.05f},
                         {"item", int64_t(meta.num_items), place[1], 0, 2, 0.05f}};
          EmbeddingOptimizerConfig eopt;
          eopt.kind = kind;
          eopt.adam = {0.002f, 0.9f, 0.999f, 1e-7f, 0.0f};
          SingleCommunicator comm;
          struct Side {
            std::unique_ptr<EmbeddingCollection> tables;
            std::unique_ptr<NeuMF> model;
            TrainState st;
            Buffer<double> loss;
          } side[2];
          const ExecContext* ctx[2] = {&cpu_, &gpu_};
          for (int d = 0; d < 2; ++d) {
            side[d].tables =
                std::make_unique<EmbeddingCollection>(plan, comm, *ctx[d], eopt, dedup);
            side[d].tables->init(3);
            side[d].model = std::make_unique<NeuMF>(cfg, ctx[d]->device);
            side[d].model->init(3);
            TrainState& st = side[d].st;
            st.positives = &lists;
            st.device_positives = &dlists;
            st.num_items = int64_t(meta.num_items);
            st.num_neg = 4;
            st.seed = 3;
            st.dense_hyper = {0.002f, 0.9f, 0.999f, 1e-8f, 0.0f};
            st.tables = side[d].tables.get();
            st.model = side[d].model.get();
            st.allocate(*ctx[d]);
            side[d].loss = Buffer<double>(ctx[d]->device, 1);
          }
          TrainReader reader(data, meta, 0, 1, 400, 3, false);
          reader.start_epoch(0);
          TrainBatch b;
          const int kSteps = 3;
          for (int step = 0; step < kSteps; ++step) {
            ASSERT_TRUE(reader.next(&b));
            const int64_t n = int64_t(b.users.size());
            Buffer<int32_t> gu = up(b.users), gi = up(b.items);
            double loss[2];
            for (int d = 0; d < 2; ++d) {
              const StepBatch batch{d ? gu.data() : b.users.data(),
                                    d ? gi.data() : b.items.data(),
                                    n,
                                    b.slice_begin,
                                    b.epoch,
                                    b.step_count};
              train_step(side[d].st, batch, comm, *ctx[d], side[d].loss.data());
              loss[d] = down(side[d].loss)[0];
            }
            // The loss share: a double sum of per-sample losses whose logits carry
            // the FP32 GEMM differences (~1e-5 relative).
            EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0])) << what << "step " << step;
          }
          const double bound = kSteps * 2.0 * 0.002 + 1e-5;
          const size_t n_params = size_t(side[0].model->num_params());
          expect_mostly_close(down(side[1].model->params(), n_params),
                              down(side[0].model->params(), n_params), bound, what + "tower");
          for (int table = 0; table < 2; ++table)
            expect_mostly_close(side[1].tables->gather_table(table),
                                side[0].tables->gather_table(table), bound,
                                what + "table " + std::to_string(table));
        }
}

}  // namespace
}  // namespace ncf
