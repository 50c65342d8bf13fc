// CPU side of the exchange helpers (embedding/embedding_kernels.h) against
// naive per-owner filters, a std::map de-duplication and plain row loops (also for
// the replicated tables' dense gradient); the
// sampling path over DevicePositiveLists against the documented draw written
// out here; and what the CUDA context API does in a build or machine without a
// GPU. (The CUDA twins are compared with these in test_parity_gpu.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/philox.h"
#include "data/negatives.h"
#include "embedding/embedding_kernels.h"
#include "model/ops.h"
#include "test_util.h"

namespace ncf {
namespace {

using IVec = std::vector<int32_t>;
using LVec = std::vector<int64_t>;
using Vec = std::vector<float>;

using test::cpu;

IVec random_ids(size_t n, int32_t hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  IVec v(n);
  for (int32_t& x : v) x = d(gen);
  return v;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Three routed tables (row-wise, table-wise, row-wise) and a replicated one,
// whose keys are never routed.
KeyLayout mixed_layout(int W) {
  KeyLayout l;
  l.W = W;
  l.T = 4;
  const int64_t rows[4] = {50, 7, 13, 5};
  const Placement place[4] = {Placement::kRowWise, Placement::kTableWise, Placement::kRowWise,
                              Placement::kReplicated};
  for (int t = 0; t < 4; ++t) {
    l.key_begin[t + 1] = l.key_begin[t] + rows[t];
    l.placement[t] = place[t];
    l.owner[t] = t == 1 ? W - 1 : 0;
  }
  return l;
}

// Where key lives, written out by enumerating every row of every table.
void route_by_enumeration(const KeyLayout& l, int64_t key, int* owner, int32_t* row) {
  for (int p = 0; p < l.W; ++p) {
    int32_t flat = 0;  // rows rank p holds before this one
    for (int t = 0; t < l.T; ++t)
      for (int64_t x = 0; x < l.key_begin[t + 1] - l.key_begin[t]; ++x) {
        const bool held = l.placement[t] == Placement::kReplicated ||
                          (l.placement[t] == Placement::kRowWise ? x % l.W == p : l.owner[t] == p);
        if (!held) continue;
        if (l.key_begin[t] + x == key && l.placement[t] != Placement::kReplicated) {
          *owner = p;
          *row = flat;
          return;
        }
        ++flat;
      }
  }
  ADD_FAILURE() << "key " << key << " is held by nobody";
}

TEST(Bucketize, RoutesKeysOfSeveralTablesToTheirOwnersInInputOrder) {
  for (int W : {1, 2, 3, 8})
    for (size_t n : {size_t{0}, size_t{1}, size_t{9}, size_t{1000}}) {
      const KeyLayout l = mixed_layout(W);
      const IVec keys = random_ids(n, int32_t(l.key_begin[3]), uint32_t(7 * W + n));  // routed
      LVec perm(n, -1), counts(W, -1);
      IVec rows(n, -1);
      bucketize_by_owner(cpu(2), keys.data(), int64_t(n), l, perm.data(), rows.data(),
                         counts.data());
      // Owner by owner, the keys it holds in input order.
      LVec want_perm;
      IVec want_rows;
      for (int p = 0; p < W; ++p) {
        int64_t c = 0;
        for (size_t k = 0; k < n; ++k) {
          int owner = -1;
          int32_t row = -1;
          route_by_enumeration(l, keys[k], &owner, &row);
          if (owner != p) continue;
          want_perm.push_back(int64_t(k));
          want_rows.push_back(row);
          ++c;
        }
        EXPECT_EQ(counts[p], c) << "W=" << W << " n=" << n << " owner " << p;
      }
      EXPECT_EQ(perm, want_perm) << "W=" << W << " n=" << n;
      EXPECT_EQ(rows, want_rows) << "W=" << W << " n=" << n;
    }
}

TEST(Bucketize, LayoutCountsEveryRankRowsOnce) {
  for (int W : {1, 2, 3, 8}) {
    const KeyLayout l = mixed_layout(W);
    int64_t routed = 0;
    for (int p = 0; p < W; ++p) {
      int64_t held = 0;
      for (int t = 0; t < l.T; ++t) held += l.rows_on(t, p);
      EXPECT_EQ(l.total_rows_on(p), held);
      for (int64_t k = 0; k < l.total_rows_on(p); ++k) {
        int t = -1;
        const int64_t id = l.id_of_row(k, p, &t);
        if (l.placement[t] == Placement::kReplicated) continue;
        int owner = -1;
        int32_t row = -1;
        l.route(l.key_begin[t] + id, &owner, &row);
        EXPECT_EQ(owner, p) << "W=" << W << " rank " << p << " row " << k;
        EXPECT_EQ(row, k) << "W=" << W << " rank " << p;
        ++routed;
      }
    }
    EXPECT_EQ(routed, l.key_begin[3]) << "W=" << W << ": every routed key on exactly one rank";
  }
}

TEST(Bucketize, BadInputNamesTheProblem) {
  const KeyLayout l = mixed_layout(2);
  LVec perm(3), counts(2);
  IVec rows(3);
  IVec keys = {1, -4, 2};
  auto bucketize = [&](const KeyLayout& layout) {
    return error_of([&] {
      bucketize_by_owner(cpu(1), keys.data(), 3, layout, perm.data(), rows.data(), counts.data());
    });
  };
  std::string msg = bucketize(l);
  EXPECT_NE(msg.find("keys[1]=-4 outside [0, 75)"), std::string::npos) << msg;
  keys[1] = 72;  // the replicated table's
  msg = bucketize(l);
  EXPECT_NE(msg.find("keys[1]=72 belongs to a replicated table"), std::string::npos) << msg;
  keys[1] = 0;
  KeyLayout bad_owner = l;
  bad_owner.owner[1] = 2;
  msg = bucketize(bad_owner);
  EXPECT_NE(msg.find("owner 2"), std::string::npos) << msg;
  KeyLayout no_ranks = l;
  no_ranks.W = 0;
  EXPECT_NE(bucketize(no_ranks).find("world size W=0"), std::string::npos);
}

TEST(IdsToKeys, OffsetsIdsAndNamesAnIdOutsideTheTable) {
  const IVec ids = {0, 6, 3};
  IVec keys(3, -1);
  ids_to_keys(cpu(2), ids.data(), 3, 50, 7, keys.data());
  EXPECT_EQ(keys, (IVec{50, 56, 53}));
  const IVec bad = {0, 7, 3};
  const std::string msg = error_of([&] { ids_to_keys(cpu(1), bad.data(), 3, 50, 7, keys.data()); });
  EXPECT_NE(msg.find("id 7 at batch position 1 outside the table's rows [0, 7)"), std::string::npos)
      << msg;
}

TEST(UniqueIds, MatchesMapAndInverseRebuildsIds) {
  for (int32_t range : {1, 5, 100000})
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{5000}}) {
      IVec ids = random_ids(n, range, uint32_t(range + n));
      std::map<int32_t, int64_t> index;
      for (int32_t id : ids) index[id] = 0;
      IVec want;
      for (auto& [id, pos] : index) {
        pos = int64_t(want.size());
        want.push_back(id);
      }
      for (int threads : {1, 3}) {
        IVec uniq(n, -1);
        LVec inv(n, -1);
        int64_t nu = -1;
        unique_ids(cpu(threads), ids.data(), int64_t(n), uniq.data(), inv.data(), &nu);
        ASSERT_EQ(nu, int64_t(want.size()));
        EXPECT_EQ(IVec(uniq.begin(), uniq.begin() + nu), want);
        for (size_t k = 0; k < n; ++k) EXPECT_EQ(inv[k], index[ids[k]]) << k;
      }
    }
}

TEST(PermuteRows, GatherScatterAndRoundTrip) {
  const int D = 3;
  const int64_t n = 6, n_src = 4;
  Vec src(size_t(std::max(n, n_src)) * D);
  std::iota(src.begin(), src.end(), 0.0f);
  LVec idx = {3, 0, 0, 2, 1, 3};
  Vec out(size_t(n) * D, -1.0f);
  permute_rows(cpu(2), src.data(), n_src, idx.data(), out.data(), n, D);
  for (int64_t k = 0; k < n; ++k)
    for (int d = 0; d < D; ++d) EXPECT_EQ(out[k * D + d], src[idx[k] * D + d]) << k << "," << d;

  LVec perm = {4, 1, 5, 0, 3, 2};
  Vec scattered(size_t(n) * D, -1.0f), back(size_t(n) * D, -1.0f);
  unpermute_rows(cpu(2), src.data(), perm.data(), scattered.data(), n, D);
  for (int64_t k = 0; k < n; ++k)
    for (int d = 0; d < D; ++d) EXPECT_EQ(scattered[perm[k] * D + d], src[k * D + d]);
  permute_rows(cpu(1), scattered.data(), n, perm.data(), back.data(), n, D);
  EXPECT_EQ(back, Vec(src.begin(), src.begin() + n * D));
}

TEST(PermuteRows, BadIndicesNameThePosition) {
  Vec src(6), out(6);
  LVec idx = {0, 2};
  std::string msg =
      error_of([&] { permute_rows(cpu(1), src.data(), 2, idx.data(), out.data(), 2, 3); });
  EXPECT_NE(msg.find("idx[1]=2"), std::string::npos) << msg;
  LVec perm = {1, 1};
  msg = error_of([&] { unpermute_rows(cpu(1), src.data(), perm.data(), out.data(), 2, 3); });
  EXPECT_NE(msg.find("perm[1]=1"), std::string::npos) << msg;
  EXPECT_EQ(out, Vec(6, 0.0f)) << "nothing written before the check";
}

// ---- replicated tables: dense gradient and touched rows ----------------------------------

TEST(ReplicatedGradient, ScatterThenCompactRoundTripsAgainstALoop) {
  for (int threads : {1, 3})
    for (int D : {1, 3, 8})
      for (int64_t N : {int64_t{1}, int64_t{17}, int64_t{5000}}) {
        std::mt19937 gen(uint32_t(N * 10 + D));
        // Strictly increasing rows, about a third of the table.
        IVec rows;
        for (int32_t r = 0; r < N; ++r)
          if (gen() % 3 == 0) rows.push_back(r);
        const int64_t n = int64_t(rows.size());
        Vec grads(size_t(n) * D);
        std::uniform_real_distribution<float> u(-1, 1);
        for (float& g : grads) g = u(gen);
        Vec dense(size_t(N) * (D + 1), 7.0f);  // stale values must be cleared
        scatter_rows_dense(cpu(threads), rows.data(), grads.data(), n, D, N, dense.data());
        // The dense layout, written out.
        Vec want(size_t(N) * (D + 1), 0.0f);
        for (int64_t k = 0; k < n; ++k) {
          for (int d = 0; d < D; ++d) want[size_t(rows[k]) * (D + 1) + d] = grads[k * D + d];
          want[size_t(rows[k]) * (D + 1) + D] = 1.0f;
        }
        ASSERT_EQ(dense, want) << "N=" << N << " D=" << D;
        // An allreduce over two ranks doubles every entry; the touched rows and
        // their (doubled) gradients come back in ascending order.
        for (float& x : dense) x *= 2;
        IVec out_rows(size_t(N), -1);
        Vec out_grads(size_t(N) * D, -1.0f);
        int64_t m = -1;
        compact_touched_rows(cpu(threads), dense.data(), N, D, out_rows.data(), out_grads.data(),
                             &m);
        ASSERT_EQ(m, n);
        EXPECT_EQ(IVec(out_rows.begin(), out_rows.begin() + m), rows);
        for (int64_t k = 0; k < n * D; ++k) EXPECT_EQ(out_grads[k], 2 * grads[k]);
      }
}

TEST(ReplicatedGradient, CompactKeepsRowsWhoseSummedGradientIsZero) {
  // Touched on some rank with gradients that cancel: still touched (the count
  // column decides), so Adam's moments of that row are updated like a 1-rank run.
  const int D = 2;
  Vec dense = {0, 0, 0, 0.5f, -1, 1, 0, 0, 2};
  IVec rows(3, -1);
  Vec grads(3 * D, -1);
  int64_t m = 0;
  compact_touched_rows(cpu(1), dense.data(), 3, D, rows.data(), grads.data(), &m);
  ASSERT_EQ(m, 2);
  EXPECT_EQ(rows[0], 1);
  EXPECT_EQ(rows[1], 2);
  EXPECT_EQ(Vec(grads.begin(), grads.begin() + 4), (Vec{0.5f, -1, 0, 0}));
}

TEST(ReplicatedGradient, BadRowsNameThePosition) {
  Vec grads(3 * 2, 1.0f), dense(4 * 3, 5.0f);
  IVec unsorted = {0, 2, 2};
  std::string msg = error_of(
      [&] { scatter_rows_dense(cpu(1), unsorted.data(), grads.data(), 3, 2, 4, dense.data()); });
  EXPECT_NE(msg.find("rows[2]=2"), std::string::npos) << msg;
  IVec outside = {0, 4};
  msg = error_of(
      [&] { scatter_rows_dense(cpu(1), outside.data(), grads.data(), 2, 2, 4, dense.data()); });
  EXPECT_NE(msg.find("rows[1]=4"), std::string::npos) << msg;
  EXPECT_EQ(dense, Vec(4 * 3, 5.0f)) << "nothing written before the check";
  msg = error_of(
      [&] { scatter_rows_dense(cpu(1), outside.data(), grads.data(), 5, 2, 4, dense.data()); });
  EXPECT_NE(msg.find("n=5"), std::string::npos) << msg;
}

// ---- sampling over DevicePositiveLists on the CPU --------------------------------------

// Users' sorted positives as CSR: user 0 {1, 3}, user 1 {} , user 2 all but item 4.
struct SmallLists {
  uint64_t I = 6;
  LVec offsets = {0, 2, 2, 7};
  IVec items = {1, 3, 0, 1, 2, 3, 5};
};

// The negative draw's membership test against a linear scan: every list length
// from 0 to 70 (odd, even, powers of two and one past), every value from below the
// first to past the last, lists with gaps and with runs of consecutive items.
TEST(SortedContains, AgreesWithALinearScan) {
  std::mt19937 gen(5);
  for (int n = 0; n <= 70; ++n)
    for (int gap : {1, 3}) {
      IVec a;
      int32_t v = -2;
      for (int k = 0; k < n; ++k) {
        v += 1 + static_cast<int32_t>(gen() % gap);
        a.push_back(v);
      }
      for (int32_t x = -4; x <= v + 3; ++x) {
        const bool want = std::find(a.begin(), a.end(), x) != a.end();
        EXPECT_EQ(negatives_detail::sorted_contains(a.data(), n, x), want)
            << "n " << n << " gap " << gap << " x " << x;
      }
    }
}

// The lock-step rounds of the CUDA kernel against the one-at-a-time draw, over lists from
// empty to all but one item (most draws taken: many rounds) and rounds of 1, 3 and 8 draws.
template <int K>
void expect_ahead_is_the_sequential_draw(std::mt19937& gen) {
  for (uint64_t num_items : {uint64_t{1}, uint64_t{2}, uint64_t{7}, uint64_t{64}, uint64_t{1000}})
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t count = static_cast<int64_t>(gen() % num_items);  // < num_items
      IVec all(num_items);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), gen);
      IVec pos(all.begin(), all.begin() + count);
      std::sort(pos.begin(), pos.end());
      const CounterRng rng{gen(), kStreamTrainNegatives, gen()};
      for (int num_neg : {0, 1, 4, 9, 20}) {
        IVec want(num_neg, -7), got(num_neg, -9);
        negatives_detail::draw_negatives(rng, pos.data(), count, num_items, num_neg, want.data());
        negatives_detail::draw_negatives_ahead<K>(rng, pos.data(), count, num_items, num_neg,
                                                  got.data());
        EXPECT_EQ(got, want) << "K " << K << " items " << num_items << " count " << count
                             << " num_neg " << num_neg;
        for (int32_t c : got) EXPECT_FALSE(std::binary_search(pos.begin(), pos.end(), c));
      }
    }
}

TEST(DrawNegativesAhead, DrawsTheItemsOfTheSequentialDraw) {
  std::mt19937 gen(11);
  expect_ahead_is_the_sequential_draw<1>(gen);
  expect_ahead_is_the_sequential_draw<3>(gen);
  expect_ahead_is_the_sequential_draw<8>(gen);
}

TEST(DevicePositiveLists, CpuSamplingFollowsTheDocumentedDraw) {
  SmallLists s;
  DevicePositiveLists lists(Device::kCpu, s.offsets.data(), s.items.data(), 3);
  IVec users = {0, 2, 1, 0}, items = {1, 0, 5, 3};
  const int num_neg = 3, S = 1 + num_neg;
  const uint64_t seed = 77;
  const int64_t epoch = 2, slice_begin = 40;
  IVec ou(users.size() * S), oi(users.size() * S);
  Vec ol(users.size() * S);
  sample_negatives(cpu(2), lists, s.I, users.data(), items.data(), slice_begin, 4, num_neg, seed,
                   epoch, ou.data(), oi.data(), ol.data());
  for (size_t k = 0; k < users.size(); ++k) {
    // The draw written out: key (seed, train-negatives stream), counter (epoch<<40 | p).
    CounterRng rng{seed, kStreamTrainNegatives, (uint64_t(epoch) << 40) | (slice_begin + k)};
    const int32_t u = users[k];
    IVec pos(s.items.begin() + s.offsets[u], s.items.begin() + s.offsets[u + 1]);
    uint64_t d = 0;
    EXPECT_EQ(oi[k * S], items[k]);
    EXPECT_EQ(ol[k * S], 1.0f);
    for (int j = 1; j < S; ++j) {
      int32_t c;
      do {
        c = int32_t(rng.below(d++, s.I));
      } while (std::find(pos.begin(), pos.end(), c) != pos.end());
      EXPECT_EQ(oi[k * S + j], c) << "positive " << k << " negative " << j;
      EXPECT_EQ(ol[k * S + j], 0.0f);
      if (u == 2) {
        EXPECT_EQ(c, 4) << "user 2 has one free item";
      }
    }
    for (int j = 0; j < S; ++j) EXPECT_EQ(ou[k * S + j], u);
  }
}

TEST(DevicePositiveLists, BadUsersAndListsAreErrors) {
  SmallLists s;
  DevicePositiveLists lists(Device::kCpu, s.offsets.data(), s.items.data(), 3);
  IVec users = {3}, items = {0}, ou(2), oi(2);
  Vec ol(2);
  std::string msg = error_of([&] {
    sample_negatives(cpu(1), lists, s.I, users.data(), items.data(), 0, 1, 1, 1, 0, ou.data(),
                     oi.data(), ol.data());
  });
  EXPECT_NE(msg.find("users[0]=3"), std::string::npos) << msg;
  users[0] = 2;  // 5 positives of 5 items: no negative
  msg = error_of([&] {
    sample_negatives(cpu(1), lists, 5, users.data(), items.data(), 0, 1, 1, 1, 0, ou.data(),
                     oi.data(), ol.data());
  });
  EXPECT_NE(msg.find("interacted with all"), std::string::npos) << msg;
  LVec bad = {0, 2, 1, 7};
  msg = error_of([&] { DevicePositiveLists(Device::kCpu, bad.data(), s.items.data(), 3); });
  EXPECT_NE(msg.find("decrease at user 1"), std::string::npos) << msg;
  DevicePositiveLists empty;
  EXPECT_THROW(sample_negatives(cpu(1), empty, s.I, users.data(), items.data(), 0, 1, 1, 1, 0,
                                ou.data(), oi.data(), ol.data()),
               Error);
}

// ---- the CUDA context API without a GPU ----------------------------------------------------

TEST(CudaContext, FailsClearlyWithoutGpuAndChecksAreNoOpsOnCpu) {
  ExecContext c = cpu(1);
  EXPECT_NO_THROW(check_device_errors(c));
  destroy_cuda_context(c);  // not a CUDA context: left alone
  EXPECT_EQ(c.threads, 1);
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present; test_cuda_build_gpu covers it";
  std::string msg = error_of([] { make_cuda_context(0); });
  EXPECT_NE(msg.find("make_cuda_context"), std::string::npos) << msg;
  EXPECT_NE(device_error_text(DeviceErrorCode::kGatherRowOutOfRange), std::string());
}

// BF16 payloads: pack is round-to-nearest-even (hand-worked: a tie goes to the
// even neighbour, just past a tie goes up, truncation would give 1.0 for all
// three), unpack puts the 16 bits on top of a zero half, round does both, and
// any thread count gives the same bits.
TEST(Bf16Payloads, PackRoundsToNearestEvenUnpackWidensExactly) {
  const float tie_even = 1.0f + 0x1p-8f;             // halfway 1 and 1+2^-7: stays 1
  const float tie_odd = 1.0f + 0x1p-7f + 0x1p-8f;    // halfway, odd below: goes up to 1+2^-6
  const float past_tie = 1.0f + 0x1p-8f + 0x1p-10f;  // just past half: up to 1+2^-7
  const Vec hand = {tie_even, tie_odd, past_tie, -past_tie, 0.0f, 3.0f};
  const std::vector<uint16_t> want = {0x3F80, 0x3F82, 0x3F81, 0xBF81, 0x0000, 0x4040};
  std::vector<uint16_t> bits(hand.size());
  pack_bf16(cpu(1), hand.data(), bits.data(), int64_t(hand.size()));
  EXPECT_EQ(bits, want);
  Vec back(hand.size());
  unpack_bf16(cpu(1), bits.data(), back.data(), int64_t(bits.size()));
  const Vec want_back = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -(1.0f + 0x1p-7f), 0.0f, 3.0f};
  EXPECT_EQ(back, want_back);

  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  Vec x(100003);
  for (float& v : x) v = nd(g);
  std::vector<uint16_t> one(x.size()), three(x.size());
  pack_bf16(cpu(1), x.data(), one.data(), int64_t(x.size()));
  pack_bf16(cpu(3), x.data(), three.data(), int64_t(x.size()));
  EXPECT_EQ(one, three);
  Vec rounded = x;
  round_bf16(cpu(3), rounded.data(), int64_t(rounded.size()));
  Vec widened(x.size());
  unpack_bf16(cpu(2), one.data(), widened.data(), int64_t(x.size()));
  for (size_t k = 0; k < x.size(); ++k) {
    ASSERT_EQ(one[k], float_to_bf16_bits(x[k])) << k;
    ASSERT_EQ(rounded[k], widened[k]) << k;
    // The nearest BF16: within half an ulp (2^-8 of the value's binade).
    ASSERT_LE(std::fabs(double(widened[k]) - x[k]), std::ldexp(std::fabs(x[k]), -8)) << k;
  }
  EXPECT_THROW(pack_bf16(cpu(1), nullptr, one.data(), 3), Error);
  EXPECT_THROW(unpack_bf16(cpu(1), one.data(), x.data(), -1), Error);
}

}  // namespace
}  // namespace ncf
