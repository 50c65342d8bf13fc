// What the GPU parity tests (test_parity_gpu.cc and the parity_*_gpu.cc files beside it,
// one binary: test_parity_gpu) share: the tolerances, the helpers that make inputs and
// compare results, the Parity fixture and the sweeps of shapes. See test_parity_gpu.cc for
// what the tests check and how they run without a GPU.
#pragma once

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

inline Vec random_vec(size_t n, std::mt19937& gen, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline IVec random_ids(size_t n, int32_t lo, int32_t hi, std::mt19937& gen) {  // [lo, hi)
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  IVec v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// n distinct rows of [0, R), ascending.
inline IVec random_unique_rows(int64_t R, int64_t n, std::mt19937& gen) {
  IVec all(static_cast<size_t>(R));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

// Where the device half's buffers live: the GPU, or the host when the device
// half runs on the CPU stand-in (set by the fixture before every test).
inline Device g_dev = Device::kCuda;

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
inline void expect_loss_close(double gpu, double cpu, const std::vector<float>& gpu_logits,
                              const std::vector<float>& cpu_logits, double double_atol,
                              double double_rtol, const std::string& what) {
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

inline std::string shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
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
    set_fused_top(true);
    set_layer0_by_item(Layer0ByItem::kAuto);
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
  // A size that is there to fill a GPU (many blocks per op, more rows than one CUB call
  // sorts): on a GPU on_gpu_size; on the CPU stand-in stand_in, which takes the same CPU
  // paths (several threads' chunks) at a small part of the time and memory. At 2^20 rows
  // the stand-in's runs cost CI minutes, half of it in page faults of GBs of inputs.
  int64_t gpu_scale(int64_t on_gpu_size, int64_t stand_in) const {
    return on_gpu() ? on_gpu_size : stand_in;
  }
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

const int kGemmShapes[][3] = {{0, 3, 4}, {3, 0, 4},     {5, 7, 0},       {1, 1, 1},
                              {7, 5, 3}, {1000, 8, 64}, {64, 192, 1000}, {3, 5, 192}};

const int kLayerShapes[][2] = {{1, 1}, {3, 5}, {5, 3}, {8, 64}, {64, 192}, {192, 64}};

using Bits = std::vector<uint16_t>;

using test::bf16_bits_of;
using test::widen_bf16;

// Two routed tables (row-wise, table-wise) and a replicated one whose keys are
// never routed.
inline KeyLayout parity_layout(int W, int64_t rows0) {
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

}  // namespace ncf
