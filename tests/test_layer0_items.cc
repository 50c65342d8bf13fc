// Layer 0 by item in training (model/ops.h item_runs, gather_run_rows, run_sums and
// gather_bias_act's mask; NeuMF with ItemKeys), on the CPU:
//   - item_runs groups the samples by id as a stable sort does (checked against
//     std::stable_sort on pairs), on both of its sorts (counting and comparison), names an
//     id outside the bound, and refuses too few runs;
//   - gather_run_rows, run_sums(_bf16) and scatter_run_rows against loops written here,
//     bit for bit, at 1 and 3 threads;
//   - gather_bias_act(_bf16)'s mask is the bit layout relu_mask_words describes, taken
//     here from the stored output;
//   - NeuMF's forward and backward by item give the per-sample path's logits, loss and
//     gradients (the items' rows' gradients as each item's sum; FP32: within the FP32 rounding of
//     the products' other order; BF16 storage: within the bound test_bf16_storage.cc derives), and
//     run by item only where the mode (--layer0_by_item's values, parsed) allows and the batch
//     repeats its items.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "test_util.h"

namespace ncf {
namespace {

using Vec = std::vector<float>;
using Bits = std::vector<uint16_t>;
using IVec = std::vector<int32_t>;
using test::cpu;
using test::random_vec;

using test::ScopedMathMode;

// Layer 0 by item on CPU ranks too (its default, kAuto, is GPU ranks only).
struct ByItem {
  explicit ByItem(Layer0ByItem m) { set_layer0_by_item(m); }
  ~ByItem() { set_layer0_by_item(Layer0ByItem::kAuto); }
};

// Ids with a few hot items (the way positives repeat popular items) over [0, bound).
IVec skewed_ids(size_t n, int32_t bound, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> any(0, bound - 1);
  std::uniform_int_distribution<int32_t> hot(0, std::min<int32_t>(bound, 4) - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  IVec ids(n);
  for (int32_t& x : ids) x = coin(gen) < 0.3 ? hot(gen) : any(gen);
  return ids;
}

struct Runs {
  IVec order, starts, inv, first;
};

Runs runs_of(const IVec& ids, int64_t bound, int64_t R) {
  const int64_t B = int64_t(ids.size());
  Runs r{IVec(size_t(B), -9), IVec(size_t(R) + 1, -9), IVec(size_t(B), -9), IVec(size_t(R), -9)};
  item_runs(cpu(1), ids.data(), B, bound, R, r.order.data(), r.starts.data(), r.inv.data(),
            r.first.data());
  return r;
}

TEST(ItemRuns, GroupsTheSamplesByIdAsAStableSortDoes) {
  // bound 50 against 2,000 samples takes the counting sort; bound 10^6 the comparison sort.
  for (int64_t bound : {int64_t{50}, int64_t{1000000}})
    for (int64_t B : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{2000}}) {
      const std::string what = "bound " + std::to_string(bound) + ", B " + std::to_string(B);
      const IVec ids = skewed_ids(size_t(B), int32_t(bound), 11);
      const int64_t R = std::min(B, bound) + 3;  // room to spare: the last runs stay empty
      const Runs r = runs_of(ids, bound, R);
      std::vector<std::pair<int32_t, int32_t>> want;  // (id, sample), stably sorted by id
      for (int64_t b = 0; b < B; ++b) want.emplace_back(ids[size_t(b)], int32_t(b));
      std::stable_sort(want.begin(), want.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      int64_t u = -1;
      for (int64_t k = 0; k < B; ++k) {
        ASSERT_EQ(r.order[size_t(k)], want[size_t(k)].second) << what << ", order[" << k << "]";
        if (k == 0 || want[size_t(k)].first != want[size_t(k - 1)].first) {
          ++u;
          ASSERT_EQ(r.starts[size_t(u)], k) << what << ", starts[" << u << "]";
          ASSERT_EQ(r.first[size_t(u)], want[size_t(k)].second) << what << ", first[" << u << "]";
        }
        ASSERT_EQ(r.inv[size_t(want[size_t(k)].second)], u) << what << ", inv";
      }
      for (int64_t v = u + 1; v < R; ++v) {
        EXPECT_EQ(r.starts[size_t(v)], B) << what << ", empty run " << v;
        EXPECT_EQ(r.first[size_t(v)], -1) << what << ", empty run " << v;
      }
      EXPECT_EQ(r.starts[size_t(R)], B) << what << ", starts[R]";
    }
}

TEST(ItemRuns, NamesAnIdOutsideTheBoundAndRefusesTooFewRuns) {
  IVec ids = {3, 1, 4, 1, 5};
  IVec order(5), starts(6), inv(5), first(5);
  try {
    item_runs(cpu(1), ids.data(), 5, 5, 5, order.data(), starts.data(), inv.data(), first.data());
    ADD_FAILURE() << "id 5 below a bound of 5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[4] = 5 is outside [0, 5)"), std::string::npos)
        << e.what();
  }
  ids[4] = 0;
  try {  // 4 distinct ids, min(B, bound) = 5: 3 runs cannot hold them
    item_runs(cpu(1), ids.data(), 5, 5, 3, order.data(), starts.data(), inv.data(), first.data());
    ADD_FAILURE() << "R = 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("R=3"), std::string::npos) << e.what();
  }
}

// split_bf16: hi is the BF16 rounding, lo the rounding of what it left (computed here in
// double), and hi + lo is within 2^-16 of x relative (2^-9 for hi alone).
TEST(SplitBf16, KeepsAboutSixteenBits) {
  Vec X = random_vec(10007, 9, -3.0f, 3.0f);
  X[0] = 0.0f;
  X[1] = 1e-30f;
  X[2] = -65504.5f;
  for (int threads : {1, 3}) {
    Bits hi(X.size()), lo(X.size());
    split_bf16(cpu(threads), X.data(), int64_t(X.size()), hi.data(), lo.data());
    for (size_t i = 0; i < X.size(); ++i) {
      ASSERT_EQ(hi[i], float_to_bf16_bits(X[i])) << i;
      const double rest = double(X[i]) - double(bf16_bits_to_float(hi[i]));
      ASSERT_EQ(lo[i], float_to_bf16_bits(float(rest))) << i;
      const double both = double(bf16_bits_to_float(hi[i])) + double(bf16_bits_to_float(lo[i]));
      ASSERT_LE(std::fabs(both - double(X[i])), std::ldexp(std::fabs(double(X[i])), -16)) << i;
    }
  }
}

// split_tf32: hi is x rounded to 11 significant bits, nearest and ties to even (computed
// here with nearbyint on a scaled double), and hi + lo is x exactly.
TEST(SplitTf32, RoundsToElevenBitsAndKeepsTheRest) {
  Vec X = random_vec(10007, 10, -3.0f, 3.0f);
  X[0] = 0.0f;
  X[1] = 1.0f + 0x1p-11f;             // a tie: to even (1.0)
  X[2] = 1.0f + 0x1p-10f + 0x1p-11f;  // a tie: to even (1 + 2^-9)
  X[3] = -1e-30f;
  for (int threads : {1, 3}) {
    Vec hi(X.size()), lo(X.size());
    split_tf32(cpu(threads), X.data(), int64_t(X.size()), hi.data(), lo.data());
    for (size_t i = 0; i < X.size(); ++i) {
      const double x = X[i];
      double want = 0.0;
      if (x != 0.0) {
        const int e = std::ilogb(x);
        want = std::ldexp(std::nearbyint(std::ldexp(x, 10 - e)), e - 10);
      }
      ASSERT_EQ(double(hi[i]), want) << i << ": x = " << x;
      ASSERT_EQ(double(hi[i]) + double(lo[i]), x) << i;
    }
  }
  EXPECT_EQ(round_to_tf32(X[1]), 1.0f);
  EXPECT_EQ(round_to_tf32(X[2]), 1.0f + 0x1p-9f);
}

// scatter_run_rows against a loop: each run's parts added on its first sample, zeros on
// the others, the row stride kept (columns past w untouched).
TEST(ScatterRunRows, PutsEachRunsRowOnItsFirstSample) {
  const int64_t B = 500, bound = 37, ldy = 13;
  const int w = 8;
  const IVec ids = skewed_ids(size_t(B), int32_t(bound), 12);
  const int64_t R = bound + 2;
  const Runs r = runs_of(ids, bound, R);
  for (int parts : {1, 2}) {
    const Vec Yr = random_vec(size_t(parts * R) * w, 13);
    for (int threads : {1, 3}) {
      Vec Y(size_t(B) * ldy, 7.0f);
      scatter_run_rows(cpu(threads), Yr.data(), R, parts, w, r.inv.data(), r.first.data(), B,
                       Y.data(), ldy);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t u = r.inv[size_t(b)];
        for (int c = 0; c < ldy; ++c) {
          float want = 7.0f;
          if (c < w) {
            want = 0.0f;
            if (r.first[size_t(u)] == b) {
              want = Yr[size_t(u) * w + c];
              for (int p = 1; p < parts; ++p) want += Yr[size_t(p * R + u) * w + c];
            }
          }
          ASSERT_EQ(Y[size_t(b) * ldy + c], want)
              << "parts " << parts << ", sample " << b << ", column " << c;
        }
      }
    }
  }
}

// put_run_rows puts by item id what scatter_run_rows puts on the item's first sample; the
// rows of items the batch lacks keep their values.
TEST(PutRunRows, PutsEachRunsRowOnItsItemsRow) {
  const int64_t B = 500, bound = 37, ldy = 13;
  const int w = 8;
  const IVec ids = skewed_ids(size_t(B), int32_t(bound), 12);
  const int64_t R = bound + 2;
  const Runs r = runs_of(ids, bound, R);
  for (int parts : {1, 2}) {
    const Vec Yr = random_vec(size_t(parts * R) * w, 13);
    Vec per_sample(size_t(B) * w);
    scatter_run_rows(cpu(1), Yr.data(), R, parts, w, r.inv.data(), r.first.data(), B,
                     per_sample.data(), w);
    for (int threads : {1, 3}) {
      Vec Y(size_t(bound) * ldy, 7.0f);
      put_run_rows(cpu(threads), Yr.data(), R, parts, w, ids.data(), r.first.data(), bound,
                   Y.data(), ldy);
      std::vector<bool> present(size_t(bound), false);
      for (int32_t i : ids) present[size_t(i)] = true;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t u = r.inv[size_t(b)];
        if (r.first[size_t(u)] != b) continue;
        for (int c = 0; c < w; ++c)
          ASSERT_EQ(Y[size_t(ids[size_t(b)]) * ldy + c], per_sample[size_t(b) * w + c])
              << "parts " << parts << ", sample " << b << ", column " << c;
      }
      for (int64_t i = 0; i < bound; ++i)
        for (int c = 0; c < ldy; ++c) {
          if (!present[size_t(i)] || c >= w) {
            ASSERT_EQ(Y[size_t(i) * ldy + c], 7.0f) << "item " << i << ", column " << c;
          }
        }
    }
  }
  IVec bad = ids;
  bad[size_t(r.first[0])] = int32_t(bound);
  Vec Y(size_t(bound) * ldy);
  const Vec Yr = random_vec(size_t(R) * w, 14);
  EXPECT_THROW(
      put_run_rows(cpu(1), Yr.data(), R, 1, w, bad.data(), r.first.data(), bound, Y.data(), ldy),
      Error);
}

TEST(GatherRunRows, CopiesEachRunsFirstRowAndZerosTheEmptyRuns) {
  const int64_t B = 40, ld = 11;
  const int w = 6;
  const Vec X = random_vec(size_t(B) * ld, 3);
  const IVec first = {7, -1, 0, 39, -1, 12};
  for (int threads : {1, 3}) {
    Vec Y(first.size() * w, -5.0f);
    gather_run_rows(cpu(threads), X.data(), ld, w, first.data(), int64_t(first.size()), Y.data());
    for (size_t u = 0; u < first.size(); ++u)
      for (int c = 0; c < w; ++c)
        ASSERT_EQ(Y[u * w + c], first[u] < 0 ? 0.0f : X[size_t(first[u]) * ld + c])
            << "run " << u << ", column " << c << ", " << threads << " threads";
  }
}

TEST(RunSums, AddEachRunsRowsInSampleOrderInDouble) {
  const int64_t B = 3000, bound = 70;
  const IVec ids = skewed_ids(size_t(B), int32_t(bound), 5);
  const int64_t R = bound + 2;
  const Runs r = runs_of(ids, bound, R);
  for (int out : {1, 8, 13, 64}) {
    Vec dZ = random_vec(size_t(B) * out, 6);
    // Mixed magnitudes, so that another order of the adds gives other bits.
    for (size_t i = 0; i < dZ.size(); i += 7) dZ[i] *= 4096.0f;
    Bits dZ16(dZ.size());
    for (size_t i = 0; i < dZ.size(); ++i) dZ16[i] = float_to_bf16_bits(dZ[i]);
    Vec want(size_t(R) * out), want16(size_t(R) * out);
    for (int64_t u = 0; u < R; ++u)
      for (int j = 0; j < out; ++j) {
        double s = 0.0, s16 = 0.0;
        for (int64_t b = 0; b < B; ++b)  // sample order within the run: the ids' own order
          if (r.inv[size_t(b)] == u) {
            s += double(dZ[size_t(b) * out + j]);
            s16 += double(bf16_bits_to_float(dZ16[size_t(b) * out + j]));
          }
        want[size_t(u) * out + j] = float(s);
        want16[size_t(u) * out + j] = float(s16);
      }
    for (int threads : {1, 3}) {
      Vec got(size_t(R) * out, -1.0f), got16(size_t(R) * out, -1.0f);
      run_sums(cpu(threads), dZ.data(), r.order.data(), r.starts.data(), R, out, got.data());
      run_sums_bf16(cpu(threads), dZ16.data(), r.order.data(), r.starts.data(), R, out,
                    got16.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
          << "out " << out << ", " << threads << " threads";
      EXPECT_EQ(std::memcmp(got16.data(), want16.data(), got16.size() * 4), 0)
          << "BF16, out " << out << ", " << threads << " threads";
    }
  }
}

// The mask relu_mask_words describes, taken from a stored output by a loop.
template <typename T>
std::vector<uint32_t> mask_of(const std::vector<T>& Y, int64_t B, int out) {
  const int64_t words = relu_mask_words(out);
  std::vector<uint32_t> m(size_t(B * words), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int j = 0; j < out; ++j) {
      float y;
      if constexpr (std::is_same_v<T, float>) {
        y = Y[size_t(b) * out + j];
      } else {
        y = bf16_bits_to_float(Y[size_t(b) * out + j]);
      }
      if (y > 0.0f) m[size_t(b * words + j / 32)] |= uint32_t{1} << (j % 32);
    }
  return m;
}

// n·S = 305 rows: the masks of more than one of the kernel's 256-row blocks.
TEST(GatherBiasAct, WritesTheOutputsReluMask) {
  const int64_t R = 23, n = 61;
  const int S = 5;
  for (int out : {24, 128, 256}) {
    const int64_t B = n * S, words = relu_mask_words(out);
    const Vec P = random_vec(size_t(R) * out, 1), Yg = random_vec(size_t(n) * out, 2),
              bias = random_vec(size_t(out), 3);
    const IVec ids = skewed_ids(size_t(B), int32_t(R), 4);
    for (int threads : {1, 3}) {
      Vec Y(size_t(B) * out);
      Bits Y16(size_t(B) * out);
      std::vector<uint32_t> m(size_t(B * words), 0xDEADBEEFu), m16 = m;
      gather_bias_act(cpu(threads), P.data(), R, ids.data(), Yg.data(), bias.data(), Y.data(), n, S,
                      out, true, m.data());
      gather_bias_act_bf16(cpu(threads), P.data(), R, ids.data(), Yg.data(), bias.data(),
                           Y16.data(), n, S, out, true, m16.data());
      EXPECT_EQ(m, mask_of(Y, B, out)) << "out " << out << ", " << threads << " threads";
      EXPECT_EQ(m16, mask_of(Y16, B, out)) << "BF16, out " << out << ", " << threads << " threads";
    }
  }
}

struct StepOut {
  Vec logits, grads, dU, dI;
  double loss = 0.0;
  bool by_item = false;
};

StepOut step(NeuMF& model, const ExecContext& ctx, const Vec& U, const Vec& I, const Vec& labels,
             int64_t n, int S, ItemKeys keys) {
  const int64_t B = n * S;
  const int D = model.config().embedding_width();
  StepOut o{Vec(size_t(B)), Vec(), Vec(size_t(n) * D), Vec(size_t(B) * D)};
  Vec dl(static_cast<size_t>(B));
  model.forward_backward(ctx, U.data(), I.data(), n, S, labels.data(), B, o.logits.data(),
                         dl.data(), &o.loss, o.dU.data(), o.dI.data(), keys);
  o.grads.assign(model.grads().data(), model.grads().data() + model.num_params());
  o.by_item = model.layer0_by_item();
  return o;
}

// NeuMF on a batch whose items repeat (n·S samples over `items` items; each sample's
// item row is its item's row of a table), by item and per sample.
TEST(Layer0ByItem, GivesThePerSampleStepsValues) {
  NeuMFConfig cfg;
  cfg.mf_dim = 16;
  cfg.layers = {64, 64, 32, 16};
  const int64_t n = 300, items = 97;
  const int S = 5, D = cfg.embedding_width();
  const int64_t B = n * S;
  NeuMF model(cfg, Device::kCpu);
  test::init_with_biases(model, 5, 6, 0.1f);
  const Vec U = random_vec(size_t(n) * D, 21, -0.5f, 0.5f);
  const Vec table = random_vec(size_t(items) * D, 22, -0.5f, 0.5f);
  const IVec ids = skewed_ids(size_t(B), int32_t(items), 23);
  const Vec I = test::rows_by_id(table, ids, D);
  Vec labels = random_vec(size_t(B), 24, 0.0f, 1.0f);
  for (float& y : labels) y = y < 0.2f ? 1.0f : 0.0f;
  const ItemKeys keys{ids.data(), items};
  const ByItem on(Layer0ByItem::kOn);

  auto compare = [&](const StepOut& a, const StepOut& s, double rtol, const std::string& mode) {
    // Relative RMS of each tensor against the per-sample step's.
    auto check = [&](const Vec& x, const Vec& y, size_t off, size_t count, const std::string& w) {
      const double e = test::relative_rms(x.data() + off, y.data() + off, count);
      EXPECT_LE(e, rtol) << mode << ", " << w << ": by item vs per sample, relative RMS";
    };
    check(a.logits, s.logits, 0, a.logits.size(), "logits");
    for (const DenseLayerView& v : model.tower()) {
      const std::string l = "layer " + std::to_string(v.in) + "->" + std::to_string(v.out);
      check(a.grads, s.grads, size_t(v.w_offset), size_t(v.in) * v.out, l + " dW");
      check(a.grads, s.grads, size_t(v.b_offset), size_t(v.out), l + " db");
    }
    check(a.dU, s.dU, 0, a.dU.size(), "d_user_rows");
    // The GMF columns per sample; all columns as each item's sum over its samples.
    for (int64_t b = 0; b < B; ++b)
      check(a.dI, s.dI, size_t(b) * D, size_t(cfg.mf_dim),
            "d_item_rows GMF, sample " + std::to_string(b));
    // (Each item's sum over its samples is what the table's owner adds: by item the MLP
    // columns carry an item's whole gradient on one of its samples.)
    const Vec ai = test::sum_rows_by_id(a.dI, ids, items, D),
              si = test::sum_rows_by_id(s.dI, ids, items, D);
    check(ai, si, 0, ai.size(), "d_item_rows summed per item");
    // By item, each item's MLP gradient sits on its first sample only.
    const int h = cfg.mlp_half();
    for (int64_t b = 0; b < B; ++b) {
      const bool first = std::find(ids.begin(), ids.end(), ids[size_t(b)]) - ids.begin() == b;
      bool zero = true;
      for (int c = 0; c < h; ++c) zero = zero && a.dI[size_t(b) * D + cfg.mf_dim + c] == 0.0f;
      if (!first) {
        ASSERT_TRUE(zero) << mode << ": sample " << b << " is not its item's first";
      }
    }
    EXPECT_NEAR(a.loss, s.loss, rtol * s.loss) << mode << ", loss";
  };
  {
    // FP32: P's rows are the per-sample product's rows (another GEMM shape: its own
    // summation order at most) and dW0's items' half sums the same products in another
    // order; with h = 32 terms per product and B = 1,500 per weight, a few units in the
    // last place of FP32, far below 1e-5.
    ScopedMathMode m(MathMode::kFp32);
    const StepOut a = step(model, cpu(2), U, I, labels, n, S, keys);
    const StepOut s = step(model, cpu(2), U, I, labels, n, S, ItemKeys{});
    ASSERT_TRUE(a.by_item);
    ASSERT_FALSE(s.by_item);
    compare(a, s, 1e-5, "FP32");
    // The weight gradient's items' half moved off the per-sample bits: the by-item sums ran.
    const DenseLayerView& v0 = model.tower()[0];
    bool moved = false;
    for (int j = 0; j < v0.out && !moved; ++j)
      for (int k = cfg.mlp_half(); k < v0.in && !moved; ++k) {
        const size_t at = size_t(v0.w_offset + int64_t(j) * v0.in + k);
        moved = a.grads[at] != s.grads[at];
      }
    EXPECT_TRUE(moved) << "dW0's items' half has the per-sample bits";
    for (int threads : {1, 3}) {
      const StepOut again = step(model, cpu(threads), U, I, labels, n, S, keys);
      EXPECT_EQ(std::memcmp(again.grads.data(), a.grads.data(), a.grads.size() * 4), 0)
          << threads << " threads";
      EXPECT_EQ(std::memcmp(again.logits.data(), a.logits.data(), a.logits.size() * 4), 0)
          << threads << " threads";
    }
  }
  {
    // BF16 storage: the per-item sums of dZ0 enter dW0's product as two BF16 parts (about
    // 16 bits), where the per-sample product took each BF16 gradient as it is: within the
    // (2L + 1)·2^-8 test_bf16_storage.cc derives for BF16 storage.
    ScopedMathMode m(MathMode::kBf16);
    const StepOut a = step(model, cpu(2), U, I, labels, n, S, keys);
    const StepOut s = step(model, cpu(2), U, I, labels, n, S, ItemKeys{});
    ASSERT_TRUE(a.by_item);
    compare(a, s, (2.0 * double(model.tower().size()) + 1.0) / 256.0, "BF16");
    const StepOut again = step(model, cpu(3), U, I, labels, n, S, keys);
    EXPECT_EQ(std::memcmp(again.grads.data(), a.grads.data(), a.grads.size() * 4), 0) << "BF16";
  }
}

TEST(Layer0ByItem, ModeValuesAreParsedAndOthersRefused) {
  EXPECT_EQ(parse_layer0_by_item("auto", "v"), Layer0ByItem::kAuto);
  EXPECT_EQ(parse_layer0_by_item("on", "v"), Layer0ByItem::kOn);
  EXPECT_EQ(parse_layer0_by_item("off", "v"), Layer0ByItem::kOff);
  try {
    parse_layer0_by_item("yes", "--layer0_by_item");
    ADD_FAILURE() << "yes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--layer0_by_item yes: expected auto, on or off"),
              std::string::npos)
        << e.what();
  }
}

// By item only where the mode says (the default: GPU ranks) and the batch repeats its items.
TEST(Layer0ByItem, RunsOnlyWhereTheBatchRepeatsItsItems) {
  NeuMFConfig cfg;
  cfg.mf_dim = 8;
  cfg.layers = {16, 8};
  const int64_t n = 20;
  const int S = 3, D = cfg.embedding_width();
  const int64_t B = n * S;
  NeuMF model(cfg, Device::kCpu);
  model.init(1);
  const Vec U = random_vec(size_t(n) * D, 1), I = random_vec(size_t(B) * D, 2);
  Vec labels(size_t(B), 0.0f);
  const IVec ids = skewed_ids(size_t(B), 30, 3);
  // The default on a CPU model: per sample; kOff: per sample.
  EXPECT_EQ(layer0_by_item_mode(), Layer0ByItem::kAuto);
  EXPECT_FALSE(step(model, cpu(1), U, I, labels, n, S, ItemKeys{ids.data(), 30}).by_item);
  {
    const ByItem off(Layer0ByItem::kOff);
    EXPECT_FALSE(step(model, cpu(1), U, I, labels, n, S, ItemKeys{ids.data(), 30}).by_item);
  }
  const ByItem on(Layer0ByItem::kOn);
  // 30 items against 60 samples: R = 30 = B / 2, by item; 31: per sample.
  EXPECT_TRUE(step(model, cpu(1), U, I, labels, n, S, ItemKeys{ids.data(), 30}).by_item);
  EXPECT_FALSE(step(model, cpu(1), U, I, labels, n, S, ItemKeys{ids.data(), 31}).by_item);
  // No hidden layer: nothing to take by item.
  NeuMFConfig flat = cfg;
  flat.layers = {16};
  NeuMF no_tower(flat, Device::kCpu);
  no_tower.init(1);
  EXPECT_FALSE(step(no_tower, cpu(1), U, I, labels, n, S, ItemKeys{ids.data(), 30}).by_item);
}

}  // namespace
}  // namespace ncf
