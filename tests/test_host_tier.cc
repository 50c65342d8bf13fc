// The host tier (--device_table_budget) in one process: the residency plan of
// row_cache.h against a written-out simulation of its rules, its promises (no row of the
// window evicted, no wait, once the budget holds a window), and the collection with a
// cache of every size giving the bits of the all-on-device collection over many steps,
// for every optimizer that updates touched rows only, FP32 and BF16 rows, announced
// ahead or not; then the collection on 3 MPI ranks (this binary under mpirun), where the
// announcements route the steps' keys. The ncf_dist runs are in test_host_tier_runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/single_communicator.h"
#include "common/check.h"
#include "embedding/collection.h"
#include "embedding/row_cache.h"
#include "embedding/tier_ops.h"
#include "test_util.h"
#include "train/config.h"

namespace ncf {
namespace {

// A step's rows as the trainer lists them: in no order, with repeats (hot rows 0..7).
std::vector<int32_t> step_rows(std::mt19937& g, int64_t R, int n) {
  std::vector<int32_t> v;
  for (int k = 0; k < n; ++k) v.push_back(int32_t(g() % 4 == 0 ? g() % 8 : g() % uint32_t(R)));
  return v;
}

// Each row once, at its first listing.
std::vector<int32_t> first_listings(const std::vector<int32_t>& rows) {
  std::set<int32_t> seen;
  std::vector<int32_t> v;
  for (int32_t r : rows)
    if (seen.insert(r).second) v.push_back(r);
  return v;
}

// row_cache.h's rules written out with whole scans: a step's rows load in the order it
// lists them, each at its first listing; a free slot (the row's own, else the lowest),
// then the evictable row's (outside the window) used least recently, then the lowest
// row's; the steps load in order; begin() evicts rows of later steps by farthest next use
// only when nothing else is left, and those steps load them last, in the order evicted.
struct NaiveCache {
  int64_t C;
  std::map<int32_t, int32_t> slot;                            // resident row -> slot
  std::map<int32_t, int64_t> last;                            // row -> last step retired with it
  std::vector<std::pair<int64_t, std::set<int32_t>>> window;  // announced, not retired
  std::vector<std::vector<int32_t>> missing;                  // per window step
  int64_t evicted_in_window = 0;

  bool in_window(int32_t r, size_t from = 0) const {
    for (size_t k = from; k < window.size(); ++k)
      if (window[k].second.count(r)) return true;
    return false;
  }
  // Slots once used stay used (an evicted row's slot is taken at once).
  std::set<int32_t> ever;
  int32_t free_slot(int32_t row) const {
    if (row < C && !ever.count(row)) return row;
    for (int32_t s = 0; s < C; ++s)
      if (!ever.count(s)) return s;
    return -1;
  }
  int32_t take(int32_t row) {
    const int32_t f = free_slot(row);
    if (f >= 0) ever.insert(f);
    if (f >= 0) return f;
    int32_t best = -1;
    std::pair<int64_t, int32_t> key{};
    for (auto& [r, s] : slot) {
      if (in_window(r)) continue;
      const std::pair<int64_t, int32_t> k{last.count(r) ? last.at(r) : -1, r};
      if (best < 0 || k < key) {
        best = r;
        key = k;
      }
    }
    if (best < 0) return -1;
    const int32_t s = slot.at(best);
    slot.erase(best);
    return s;
  }
  void load_pending() {
    for (size_t k = 0; k < window.size(); ++k) {
      std::vector<int32_t> left;
      bool full = false;
      for (int32_t r : missing[k]) {
        if (slot.count(r)) continue;
        const int32_t s = full ? -1 : take(r);
        if (s < 0) {
          full = true;
          left.push_back(r);
          continue;
        }
        slot[r] = s;
      }
      missing[k] = left;
      if (!left.empty()) return;
    }
  }
  void announce(int64_t s, const std::vector<int32_t>& rows) {
    const std::vector<int32_t> once = first_listings(rows);
    window.emplace_back(s, std::set<int32_t>(once.begin(), once.end()));
    missing.push_back({});
    for (int32_t r : once)
      if (!slot.count(r)) missing.back().push_back(r);
    load_pending();
  }
  void begin() {
    load_pending();
    const auto& cur = window.front().second;
    const std::vector<int32_t> still = missing.front();  // in the order they load
    for (int32_t r : still) {
      if (slot.count(r)) continue;
      int32_t s = take(r);
      if (s < 0) {
        int32_t best = -1;
        std::tuple<int64_t, int64_t, int32_t> key{};
        for (auto& [x, sx] : slot) {
          if (cur.count(x)) continue;
          int64_t next = -1;
          for (size_t k = 1; k < window.size() && next < 0; ++k)
            if (window[k].second.count(x)) next = window[k].first;
          const std::tuple<int64_t, int64_t, int32_t> kx{-next, last.count(x) ? last.at(x) : -1, x};
          if (best < 0 || kx < key) {
            best = x;
            key = kx;
          }
        }
        s = slot.at(best);
        slot.erase(best);
        ++evicted_in_window;
        for (size_t k = 1; k < window.size(); ++k)
          if (window[k].second.count(best)) missing[k].push_back(best);
      }
      slot[r] = s;
    }
    missing.front().clear();
  }
  void retire() {
    for (int32_t r : window.front().second) last[r] = window.front().first;
    window.erase(window.begin());
    missing.erase(missing.begin());
  }
  int64_t window_rows() const {
    std::set<int32_t> u;
    for (auto& [s, rows] : window) u.insert(rows.begin(), rows.end());
    return int64_t(u.size());
  }
  void forget() {  // the steps announced and not run: gone, their rows still resident
    window.clear();
    missing.clear();
  }
};

void expect_same_contents(const RowCache& c, const NaiveCache& n, int64_t R,
                          const std::string& when, int64_t s) {
  for (int32_t r = 0; r < R; ++r) {
    const int32_t want = n.slot.count(r) ? n.slot.at(r) : -1;
    ASSERT_EQ(c.slot_of(r), want) << when << " step " << s << " row " << r;
  }
}

// S steps of `rows` ids over R rows, k ahead, through a cache of C slots and the written-out
// rules side by side, step numbers from `base`; every `forget` steps the window is forgotten
// (a stopped run) and the same steps come again. The first `narrow` steps take their ids
// from the rows below `narrow_rows` only.
// threads > 0: the cache's passes split over that many threads from 4 rows on, whatever
// the table's size, so that these small steps take them.
void follow_rules(int64_t R, int64_t C, int k, int64_t base, int rows, int64_t S, int64_t forget,
                  int64_t narrow = 0, int64_t narrow_rows = 0, int threads = 0) {
  std::mt19937 g(uint32_t(C * 7 + k));
  RowCache cache(R, C);
  if (threads > 0) cache.set_threads(threads, 4, 1, 0);
  NaiveCache naive{C, {}, {}, {}, {}, 0, {}};
  std::vector<std::vector<int32_t>> steps;
  for (int64_t s = 0; s < S; ++s) steps.push_back(step_rows(g, s < narrow ? narrow_rows : R, rows));
  RowCache::Moves m;
  int64_t next = 0;
  const std::string at =
      "base " + std::to_string(base) + " C " + std::to_string(C) + " k " + std::to_string(k) + ": ";
  for (int64_t s = 0; s < S; ++s) {
    for (; next <= std::min<int64_t>(S - 1, s + k); ++next) {
      // Filled, as the collection fills it, into memory a retired step's list held.
      std::vector<int32_t> list = cache.spare_rows();
      EXPECT_TRUE(list.empty());
      list.insert(list.end(), steps[size_t(next)].begin(), steps[size_t(next)].end());
      cache.announce(base + next, std::move(list), &m);
      naive.announce(base + next, steps[size_t(next)]);
      expect_same_contents(cache, naive, R, at + "announce", next);
    }
    cache.begin(base + s, &m);
    naive.begin();
    expect_same_contents(cache, naive, R, at + "begin", s);
    ASSERT_EQ(cache.window_rows(), naive.window_rows()) << at << "step " << s;
    ASSERT_EQ(cache.mirrors(), C >= R) << at << "step " << s;
    if (cache.mirrors()) {  // then every resident row is in its own slot
      for (int32_t r = 0; r < R; ++r) {
        if (cache.slot_of(r) >= 0) {
          ASSERT_EQ(cache.slot_of(r), r) << at << "step " << s;
        }
      }
    }
    for (int32_t r : steps[size_t(s)]) ASSERT_GE(cache.slot_of(r), 0) << "step " << s;
    cache.retire(base + s);
    naive.retire();
    if (s % forget == forget - 1) {
      cache.forget_window();
      naive.forget();
      EXPECT_EQ(cache.window_rows(), 0);
      next = s + 1;
    }
  }
  EXPECT_EQ(cache.counters().evicted_in_window, naive.evicted_in_window) << at;
  EXPECT_EQ(cache.counters().steps, S);
  if (threads > 0) {
    EXPECT_GT(cache.counters().parallel_passes, 0) << at;
  } else {
    EXPECT_EQ(cache.counters().parallel_passes, 0) << at;
  }
}

TEST(RowCache, FollowsItsWrittenOutRulesAtEveryBudget) {
  // Steps numbered from 0, and from 65525: the first forgotten window (at step 12) leaves
  // resident rows last used on both sides of step 65535, whose list of evictable rows is
  // rebuilt in order of those steps.
  for (int64_t base : {0, 65525})
    for (int64_t C : {300, 120, 60, 31})
      for (int k : {0, 1, 3}) follow_rules(300, C, k, base, 30, 40, 13);
}

// The same on several threads (and the parallel passes on one): each row's listings read
// in order by one thread, the slots chosen in order by the caller.
TEST(RowCache, FollowsItsWrittenOutRulesOnSeveralThreads) {
  for (int threads : {1, 3})
    for (int64_t C : {300, 120, 31})
      for (int k : {0, 2}) follow_rules(300, C, k, 0, 30, 40, 13, 0, 0, threads);
  follow_rules(300, 60, 1, 0, 30, 500, 211, 0, 0, 2);
}

// Long enough that the list of evictable rows drops its stale entries (over 2 x C + 4096 of
// them not yet taken: 250 steps over 280 rows, nothing evicted from the 290 slots, then
// every row) and the entries taken from its front (over 4096, at 60 slots).
TEST(RowCache, FollowsItsWrittenOutRulesOverLongRuns) {
  for (int k : {1, 2}) {
    follow_rules(300, 290, k, 0, 30, 500, 499, 250, 280);
    follow_rules(300, 60, k, 0, 30, 500, 211);
  }
}

// The moves say exactly what changed: replaying them on a slot table gives the contents.
TEST(RowCache, MovesReplayToTheContents) {
  const int64_t R = 200, C = 50;
  std::mt19937 g(3);
  RowCache cache(R, C);
  std::vector<int32_t> at(size_t(C), -1);  // slot -> row, from the moves alone
  auto replay = [&](const RowCache::Moves& m) {
    for (size_t k = 0; k < m.evict_slots.size(); ++k) {
      ASSERT_EQ(at[size_t(m.evict_slots[k])], m.evict_rows[k]) << "evicts the row it holds";
      at[size_t(m.evict_slots[k])] = -1;
    }
    for (size_t k = 0; k < m.load_rows.size(); ++k) {
      ASSERT_EQ(at[size_t(m.load_slots[k])], -1) << "loads into a free slot";
      at[size_t(m.load_slots[k])] = m.load_rows[k];
    }
  };
  for (int64_t s = 0; s < 30; ++s) {
    RowCache::Moves m;
    cache.announce(s, step_rows(g, R, 20), &m);
    replay(m);
    m.clear();
    cache.begin(s, &m);
    replay(m);
    cache.retire(s);
  }
  for (int32_t slot = 0; slot < C; ++slot) {
    if (at[size_t(slot)] < 0) continue;
    EXPECT_EQ(cache.slot_of(at[size_t(slot)]), slot);
  }
}

// Once the budget holds every window's rows, no row of a window is evicted and, the
// window primed, no step waits: every load was done ahead.
TEST(RowCache, ABudgetThatHoldsTheWindowNeverEvictsInsideItNorWaits) {
  const int64_t R = 1000;
  const int k = 2;
  std::mt19937 g(5);
  std::vector<std::vector<int32_t>> steps;
  for (int s = 0; s < 60; ++s) steps.push_back(step_rows(g, R, 40));
  size_t most = 0;  // the largest window: k + 2 consecutive steps (the last one not retired)
  for (size_t s = 0; s + 1 < steps.size(); ++s) {
    std::set<int32_t> u;
    for (size_t j = s; j < std::min(steps.size(), s + k + 2); ++j)
      u.insert(steps[j].begin(), steps[j].end());
    most = std::max(most, u.size());
  }
  RowCache cache(R, int64_t(most));
  RowCache::Moves m;
  for (int64_t s = 0; s < k; ++s) cache.announce(s, steps[size_t(s)], &m);
  for (int64_t s = 0; s < 60; ++s) {
    if (s + k < 60) cache.announce(s + k, steps[size_t(s + k)], &m);
    cache.begin(s, &m);
    cache.retire(s);
  }
  EXPECT_EQ(cache.counters().evicted_in_window, 0);
  EXPECT_EQ(cache.counters().waits, 0);
  EXPECT_GT(cache.counters().evictions, 0) << "the budget is below the table: rows left";
}

TEST(RowCache, AStepLargerThanTheBudgetIsRefusedNamingTheFlag) {
  RowCache cache(100, 5);
  RowCache::Moves m;
  cache.announce(0, {1, 2, 3, 4, 5, 6, 7}, &m);
  try {
    cache.begin(0, &m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device_table_budget"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("touches 7"), std::string::npos) << e.what();
  }
}

// Both ways of each (a bit set where the bound is small beside the list, a sort where not)
// against sets, the scratch left all zero for the next call.
TEST(RowLists, UniqueInOrderAndSortDistinctAgainstSets) {
  std::mt19937 g(11);
  std::vector<uint64_t> bits;
  for (int64_t bound : {int64_t{100}, int64_t{5000}, int64_t{1} << 30}) {
    for (int n : {0, 1, 50, 3000}) {
      std::vector<int32_t> v;
      for (int k = 0; k < n; ++k)
        v.push_back(int32_t(g() % 3 == 0 ? g() % 16 : g() % uint64_t(bound)));
      std::vector<int32_t> u = v;
      unique_in_order(&u, bound, &bits);
      const std::vector<int32_t> once = first_listings(v);
      std::vector<int32_t> ascending = once;
      std::sort(ascending.begin(), ascending.end());
      const bool bit_set = (bound + 63) / 64 <= 8 * int64_t(n);
      EXPECT_EQ(u, bit_set ? once : ascending) << bound << " " << n;
      std::vector<int32_t> sorted = once;
      std::shuffle(sorted.begin(), sorted.end(), g);
      sort_distinct(&sorted, bound, &bits);
      EXPECT_EQ(sorted, ascending) << bound << " " << n;
      for (uint64_t w : bits) ASSERT_EQ(w, 0u) << bound << " " << n;
    }
  }
}

// A table's part of a list: its repeats dropped (each row at its first listing) exactly
// where the table has at most 4 x its ids' rows, else left as it is; the scratch all zero
// after; an id outside the table refused.
TEST(RowLists, DropRepeatsWhereDenseAgainstFirstListings) {
  std::mt19937 g(13);
  std::vector<uint64_t> bits;
  for (int64_t base : {int64_t{0}, int64_t{1000003}}) {
    for (int64_t rows : {int64_t{1}, int64_t{64}, int64_t{1000}, int64_t{70000}}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{249}, int64_t{250},
                        int64_t{999}, int64_t{5000}}) {
        std::vector<int32_t> v;
        for (int64_t k = 0; k < n; ++k)
          v.push_back(int32_t(
              base + int64_t(g() % uint64_t(g() % 4 == 0 ? std::min<int64_t>(5, rows) : rows))));
        std::vector<int32_t> u = v;
        const int64_t kept = drop_repeats_where_dense(u.data(), n, base, rows, &bits);
        u.resize(size_t(kept));
        EXPECT_EQ(u, 4 * n >= rows ? first_listings(v) : v) << base << " " << rows << " " << n;
        for (uint64_t w : bits) ASSERT_EQ(w, 0u) << base << " " << rows << " " << n;
      }
    }
  }
  std::vector<int32_t> high{4, 5, 6}, low{4, 3, 5};  // rows 4 and 5
  EXPECT_THROW(drop_repeats_where_dense(high.data(), 3, 4, 2, &bits), Error);
  EXPECT_THROW(drop_repeats_where_dense(low.data(), 3, 4, 2, &bits), Error);
}

// The cache does the same with each table's repeats dropped first as with the whole list:
// every call's moves and the counters, at a budget of every row, one that evicts and the
// largest step's rows.
TEST(RowCache, TablesWithoutTheirRepeatsMoveTheSameRows) {
  const int64_t users = 600, items = 40;  // an item table touched many times a step
  std::mt19937 g(17);
  std::vector<std::vector<int32_t>> steps;
  for (int s = 0; s < 50; ++s) {
    std::vector<int32_t> v;
    for (int k = 0; k < 30; ++k) v.push_back(int32_t(g() % uint64_t(users)));
    for (int k = 0; k < 120; ++k) v.push_back(int32_t(users + int64_t(g() % uint64_t(items))));
    steps.push_back(v);
  }
  std::vector<uint64_t> bits;
  auto dropped = [&](std::vector<int32_t> v) {
    const int64_t ku = drop_repeats_where_dense(v.data(), 30, 0, users, &bits);
    const int64_t ki = drop_repeats_where_dense(v.data() + 30, 120, users, items, &bits);
    EXPECT_EQ(ku, 30) << "600 user rows for 30 ids: left as they are";
    EXPECT_LE(ki, items);
    std::copy(v.begin() + 30, v.begin() + 30 + ki, v.begin() + ku);
    v.resize(size_t(ku + ki));
    return v;
  };
  int64_t most = 0;  // the largest step's rows, from the first pass: the smallest budget
  for (int64_t C : {int64_t{640}, int64_t{200}, int64_t{-1}}) {
    if (C < 0) C = most;
    const int k = 2;
    RowCache whole(users + items, C), each(users + items, C);
    auto same = [&](const RowCache::Moves& a, const RowCache::Moves& b, int64_t s) {
      ASSERT_EQ(a.evict_slots, b.evict_slots) << C << " step " << s;
      ASSERT_EQ(a.evict_rows, b.evict_rows) << C << " step " << s;
      ASSERT_EQ(a.load_rows, b.load_rows) << C << " step " << s;
      ASSERT_EQ(a.load_slots, b.load_slots) << C << " step " << s;
    };
    RowCache::Moves ma, mb;
    for (int64_t s = 0; s < 50 + k; ++s) {
      if (s < 50) {
        ma.clear();
        mb.clear();
        whole.announce(s, steps[size_t(s)], &ma);
        each.announce(s, dropped(steps[size_t(s)]), &mb);
        same(ma, mb, s);
      }
      const int64_t b = s - k;
      if (b < 0) continue;
      ma.clear();
      mb.clear();
      whole.begin(b, &ma);
      each.begin(b, &mb);
      same(ma, mb, b);
      whole.retire(b);
      each.retire(b);
    }
    const RowCache::Counters &a = whole.counters(), &b = each.counters();
    most = a.most_step_rows;
    EXPECT_EQ(a.loads, b.loads) << C;
    EXPECT_EQ(a.waits, b.waits) << C;
    EXPECT_EQ(a.evictions, b.evictions) << C;
    EXPECT_EQ(a.evicted_in_window, b.evicted_in_window) << C;
    EXPECT_EQ(a.most_window_rows, b.most_window_rows) << C;
    EXPECT_EQ(a.most_step_rows, b.most_step_rows) << C;
    // What each budget exercises: rows left the cache below 640; at the largest step's
    // rows (under a window) begin() evicted rows of later steps.
    if (C < users + items) {
      EXPECT_GT(a.evictions, 0) << C;
    }
    if (C < 200) {
      EXPECT_GT(a.evicted_in_window, 0) << C;
    }
  }
}

// Steps of a real shape's proportions (users' ids mostly distinct, items' repeated many
// times over), through caches whose passes run on 1 thread and, split, on 1, 2 and 3:
// every call's moves, the counters and the final contents are the same, at a budget of
// every row, two that evict, and the largest step's rows; a window forgotten midway.
TEST(RowCache, EveryThreadCountMakesTheSameMoves) {
  const int64_t users = 45000, items = 5000, R = users + items;
  const int k = 2, S = 60, forget_at = 23;
  std::mt19937 g(19);
  std::vector<std::vector<int32_t>> steps;
  for (int s = 0; s < S; ++s) {
    std::vector<int32_t> v;
    for (int j = 0; j < 1500; ++j) v.push_back(int32_t(g() % uint64_t(users)));
    for (int j = 0; j < 6000; ++j)
      v.push_back(int32_t(users + int64_t(g() % 4 == 0 ? g() % 50 : g() % uint64_t(items))));
    steps.push_back(v);
  }
  int64_t most = 0;
  for (int64_t C : {R, R * 3 / 10, R / 10, int64_t{-1}}) {
    if (C < 0) C = most;
    struct Run {
      int threads, from;
      std::unique_ptr<RowCache> cache;
      RowCache::Moves m;
    };
    std::vector<Run> runs;
    for (auto [threads, from] : {std::pair{1, 4}, {1, 1}, {2, 1}, {3, 1}}) {
      runs.push_back({threads, from, std::make_unique<RowCache>(R, C), {}});
      runs.back().cache->set_threads(threads, 256, from, 0);
    }
    const std::string at = "C " + std::to_string(C);
    auto all = [&](const auto& call, int64_t s) {
      for (Run& r : runs) {
        r.m.clear();
        call(*r.cache, &r.m);
      }
      for (size_t q = 1; q < runs.size(); ++q) {
        const std::string who =
            at + " threads " + std::to_string(runs[q].threads) + " step " + std::to_string(s);
        ASSERT_EQ(runs[q].m.evict_slots, runs[0].m.evict_slots) << who;
        ASSERT_EQ(runs[q].m.evict_rows, runs[0].m.evict_rows) << who;
        ASSERT_EQ(runs[q].m.load_rows, runs[0].m.load_rows) << who;
        ASSERT_EQ(runs[q].m.load_slots, runs[0].m.load_slots) << who;
      }
    };
    int64_t next = 0;
    for (int64_t s = 0; s < S; ++s) {
      for (; next <= std::min<int64_t>(S - 1, s + k); ++next)
        all([&](RowCache& c, RowCache::Moves* m) { c.announce(next, steps[size_t(next)], m); },
            next);
      all([&](RowCache& c, RowCache::Moves* m) { c.begin(s, m); }, s);
      for (Run& r : runs) r.cache->retire(s);
      if (s == forget_at) {
        for (Run& r : runs) r.cache->forget_window();
        next = s + 1;
      }
    }
    const RowCache::Counters& a = runs[0].cache->counters();
    most = a.most_step_rows;
    EXPECT_EQ(a.parallel_passes, 0) << at;
    for (size_t q = 1; q < runs.size(); ++q) {
      const RowCache::Counters& b = runs[q].cache->counters();
      EXPECT_GT(b.parallel_passes, 0) << at;
      EXPECT_EQ(a.loads, b.loads) << at;
      EXPECT_EQ(a.waits, b.waits) << at;
      EXPECT_EQ(a.evictions, b.evictions) << at;
      EXPECT_EQ(a.evicted_in_window, b.evicted_in_window) << at;
      EXPECT_EQ(a.most_window_rows, b.most_window_rows) << at;
      for (int32_t r = 0; r < R; ++r)
        ASSERT_EQ(runs[q].cache->slot_of(r), runs[0].cache->slot_of(r)) << at << " row " << r;
    }
    if (C < R) {
      EXPECT_GT(a.evictions, 0) << at;
    }
    if (C == most) {
      EXPECT_GT(a.evicted_in_window, 0) << at;
    }
  }
}

// A row outside the table is refused by the passes on several threads as on one, naming
// its place and value, before any row's state changes.
TEST(RowCache, ARowOutsideTheTableIsRefusedOnSeveralThreads) {
  for (int threads : {1, 3}) {
    RowCache cache(1000, 100);
    cache.set_threads(threads, 4, threads == 1 ? 4 : 1, 0);
    RowCache::Moves m;
    std::vector<int32_t> rows;
    for (int j = 0; j < 40; ++j) rows.push_back(j * 7);
    rows[29] = 1000;
    try {
      cache.announce(0, rows, &m);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("row[29]=1000 outside [0, 1000)"), std::string::npos)
          << e.what();
    }
  }
}

// ---- the ops, against loops ------------------------------------------------------------

TEST(TierOps, CopyMapAndAssignAgainstLoops) {
  ExecContext ctx;
  ctx.threads = 2;
  std::vector<float> src(40 * 3), dst(10 * 3, -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  const std::vector<int32_t> from = {39, 0, 17, 5}, to = {9, 2, 0, 4};
  copy_rows(ctx, src.data(), from.data(), 40, dst.data(), to.data(), 10, 4, 3, 4);
  for (size_t k = 0; k < from.size(); ++k)
    for (int d = 0; d < 3; ++d) EXPECT_EQ(dst[size_t(to[k]) * 3 + d], src[size_t(from[k]) * 3 + d]);
  EXPECT_EQ(dst[3], -1.0f) << "rows not named stay";
  std::vector<uint16_t> s16 = {1, 2, 3, 4, 5, 6}, d16(6, 0);  // three rows of 2, odd words
  const std::vector<int32_t> f16 = {2, 0}, t16 = {0, 1};
  copy_rows(ctx, s16.data(), f16.data(), 3, d16.data(), t16.data(), 3, 2, 2, 2);
  EXPECT_EQ(d16, (std::vector<uint16_t>{5, 6, 1, 2, 0, 0}));
  std::vector<int32_t> map(8, -1);
  const std::vector<int32_t> rows = {6, 1}, slots = {0, 3};
  assign_map(ctx, map.data(), rows.data(), slots.data(), 0, 2, 8);
  std::vector<int32_t> out(2);
  map_rows(ctx, map.data(), rows.data(), 8, 2, out.data());
  EXPECT_EQ(out, slots);
  // A row not cached, or outside the table, is named: the first bad one, by its index.
  auto refusal = [&](const std::vector<int32_t>& r, int64_t R) -> std::string {
    std::vector<int32_t> o(r.size());
    try {
      map_rows(ctx, map.data(), r.data(), R, int64_t(r.size()), o.data());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(refusal({6, 2, 1}, 8).find("rows[1]=2 is not in the device cache"), std::string::npos)
      << refusal({6, 2, 1}, 8);
  EXPECT_NE(refusal({6, 1, 8, -1}, 8).find("rows[2]=8 outside [0, 8)"), std::string::npos)
      << refusal({6, 1, 8, -1}, 8);
  EXPECT_NE(refusal({6, -1}, 8).find("rows[1]=-1 outside"), std::string::npos)
      << refusal({6, -1}, 8);
  EXPECT_NE(refusal({0}, 0).find("rows[0]=0 outside [0, 0)"), std::string::npos) << refusal({0}, 0);
  EXPECT_THROW(copy_rows(ctx, src.data(), from.data(), 39, dst.data(), to.data(), 10, 4, 3, 4),
               Error)
      << "row 39 outside a source of 39 rows";
}

// ---- the collection: every bit of the all-on-device one ------------------------------

constexpr int64_t kUsers = 150, kItems = 90;
constexpr int kD = 6;

EmbeddingPlan plan_of(bool bf16) {
  EmbeddingPlan plan;
  plan.D = kD;
  plan.W = 1;
  plan.tables = {{"user", kUsers, Placement::kRowWise, 0, 1, 0.01f},
                 {"item", kItems, Placement::kRowWise, 0, 2, 0.01f}};
  plan.table_elem_bytes = bf16 ? 2 : 4;
  return plan;
}

EmbeddingOptimizerConfig optimizer(EmbeddingOptimizer kind) {
  EmbeddingOptimizerConfig o;
  o.kind = kind;
  o.sgd = {0.3f, 0.0f};
  o.adagrad.lr = 0.2f;
  o.adam.lr = 0.05f;
  return o;
}

struct Trace {
  std::vector<std::vector<float>> rows;  // each step's looked-up rows, both tables
  std::vector<float> tables[2];
  std::vector<std::vector<float>> state;  // every chunk of every state array at the end
};

// 12 steps of lookups and updates with fixed ids and gradients; cache 0 = all on device;
// ahead = steps announced ahead (-1: none, each lookup announces itself).
Trace run_steps(EmbeddingOptimizer kind, bool bf16, int64_t cache, int ahead,
                const RowCache::Counters** counters = nullptr) {
  static SingleCommunicator comm;
  ExecContext ctx;
  ctx.threads = 2;
  static std::unique_ptr<EmbeddingCollection> keep;
  keep = std::make_unique<EmbeddingCollection>(plan_of(bf16), comm, ctx, optimizer(kind), false,
                                               cache);
  EmbeddingCollection& e = *keep;
  e.init(13);
  const int steps = 12;
  std::vector<std::vector<int32_t>> users, items;
  std::mt19937 g(77);
  for (int s = 0; s < steps; ++s) {
    users.emplace_back(40);
    items.emplace_back(70);
    for (auto& x : users.back()) x = int32_t(g() % 3 == 0 ? g() % 4 : g() % kUsers);
    for (auto& x : items.back()) x = int32_t(g() % 3 == 0 ? g() % 4 : g() % kItems);
  }
  auto ids = [&](int s) {
    return std::vector<TableIds>{{users[size_t(s)].data(), 40}, {items[size_t(s)].data(), 70}};
  };
  Trace tr;
  int announced = 0;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int s = 0; s < steps; ++s) {
    for (; ahead >= 0 && announced <= std::min(steps - 1, s + ahead); ++announced)
      e.announce(ids(announced));
    e.lookup(ids(s));
    tr.rows.emplace_back(e.rows(0), e.rows(0) + 40 * kD);
    tr.rows.back().insert(tr.rows.back().end(), e.rows(1), e.rows(1) + 70 * kD);
    for (int t = 0; t < 2; ++t)
      for (int64_t i = 0; i < (t ? 70 : 40) * kD; ++i) e.row_grads(t)[i] = u(g);
    e.gradients_start(nullptr);
    e.gradients_finish(s + 1);
  }
  tr.tables[0] = e.gather_table(0);
  tr.tables[1] = e.gather_table(1);
  for (int t = 0; t < 2; ++t)
    for (int a = 0; a < e.num_state_arrays(); ++a)
      for (int64_t c = 0; c < e.num_chunks(t); ++c) {
        int64_t n = 0;
        const float* p = e.export_chunk(t, a, c, &n);
        tr.state.emplace_back(p, p + n * e.state_width(a));
      }
  if (counters) *counters = e.cache_counters();
  return tr;
}

void expect_same_bits(const Trace& a, const Trace& b, const std::string& what) {
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t s = 0; s < a.rows.size(); ++s)
    ASSERT_EQ(0, std::memcmp(a.rows[s].data(), b.rows[s].data(), a.rows[s].size() * 4))
        << what << ": the rows looked up at step " << s;
  for (int t = 0; t < 2; ++t)
    ASSERT_EQ(0, std::memcmp(a.tables[t].data(), b.tables[t].data(), a.tables[t].size() * 4))
        << what << ": table " << t;
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t k = 0; k < a.state.size(); ++k)
    ASSERT_EQ(a.state[k], b.state[k]) << what << ": state chunk " << k;
}

TEST(HostTierCollection, EveryBudgetGivesTheBitsOfTheAllOnDeviceRun) {
  const int64_t R = kUsers + kItems;
  for (EmbeddingOptimizer kind :
       {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kAdagrad, EmbeddingOptimizer::kRowwiseAdagrad,
        EmbeddingOptimizer::kLazyAdam}) {
    for (bool bf16 : {false, true}) {
      const Trace ref = run_steps(kind, bf16, 0, -1);
      // 100%, 30%, 10% of the rows, and 110: one step's rows and little more.
      for (int64_t C : {R, R * 3 / 10, R / 10 + 100, int64_t(110)}) {
        for (int ahead : {-1, 0, 2}) {
          const RowCache::Counters* c = nullptr;
          const Trace got = run_steps(kind, bf16, C, ahead, &c);
          const std::string what = std::string(optimizer_name(kind)) + (bf16 ? " bf16" : " fp32") +
                                   " cache " + std::to_string(C) + " ahead " +
                                   std::to_string(ahead);
          expect_same_bits(ref, got, what);
          ASSERT_NE(c, nullptr);
          // Lookups not announced work on the home arrays: the cache sees none of them.
          EXPECT_EQ(c->steps, ahead < 0 ? 0 : 12) << what;
          if (C < R && ahead >= 0) {
            EXPECT_GT(c->evictions, 0) << what << ": the cache was too small to hold all";
          }
        }
      }
    }
  }
}

TEST(HostTierCollection, DenseAdamIsRefusedNamingTheOptimizersThatWork) {
  SingleCommunicator comm;
  ExecContext ctx;
  try {
    EmbeddingCollection e(plan_of(false), comm, ctx, optimizer(EmbeddingOptimizer::kDenseAdam),
                          false, 100);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--device_table_budget"), std::string::npos) << m;
    EXPECT_NE(m.find("rowwise_adagrad"), std::string::npos) << m;
  }
}

// A checkpoint's rows imported into a collection whose cache holds rows replace them: the
// next lookup reads the imported values, not the cached ones.
TEST(HostTierCollection, ImportedRowsReplaceCachedOnes) {
  SingleCommunicator comm;
  ExecContext ctx;
  EmbeddingCollection e(plan_of(false), comm, ctx, optimizer(EmbeddingOptimizer::kSgd), false, 50);
  e.init(3);
  const std::vector<int32_t> u = {0, 1, 2}, it = {5};
  e.lookup({{u.data(), 3}, {it.data(), 1}});  // rows 0..2 and 5 now cached
  std::vector<float> rows(size_t(e.chunk_rows()) * kD, 0.25f);
  for (int64_t c = 0; c < e.num_chunks(0); ++c) e.import_chunk(0, 0, c, rows.data());
  e.lookup({{u.data(), 3}, {it.data(), 1}});
  for (int k = 0; k < 3 * kD; ++k) ASSERT_EQ(e.rows(0)[k], 0.25f) << k;
}

// Under --device_table_budget auto a GPU rank whose tables fit takes no cache, and one
// whose tables do not takes one; the announcements are collective, so the tier is on every
// rank or none: the ranks without a cache take one of every row (it mirrors them).
TEST(HostTierDecision, EveryRankOrNone) {
  EXPECT_EQ(agreed_cache_slots({0, 0, 0}, 1, 500), 0);
  EXPECT_EQ(agreed_cache_slots({0, 40, 0}, 1, 500), 40);
  EXPECT_EQ(agreed_cache_slots({0, 40, 0}, 0, 500), 500);
  EXPECT_EQ(agreed_cache_slots({0, 40, 0}, 2, 0), 1) << "a rank without rows still has one slot";
  EXPECT_EQ(agreed_cache_slots({7, 40, 3}, 2, 500), 3) << "each rank keeps its own budget";
  EXPECT_THROW(agreed_cache_slots({1, 2}, 2, 5), Error);
}

// ---- W > 1: this binary again, under mpirun -----------------------------------------

// Steps of lookups and updates on every rank of comm, each rank's ids its own (hot ids
// shared), gradients from the rows, replicated tables' gradients allreduced as the trainer
// does; cache 0 = no tier, else each step's ids announced `ahead` steps before it. Returns
// every step's looked-up rows, then the tables; *key_exchanges counts the exchanges of
// counts and all-to-alls the run made, *step_rows the most rows of this rank a step touched
// (with the tier).
std::vector<float> mpi_steps(const EmbeddingPlan& plan, Communicator& comm, int64_t cache,
                             int ahead, int64_t* key_exchanges, int64_t* step_rows = nullptr) {
  ExecContext ctx;
  EmbeddingCollection e(plan, comm, ctx, optimizer(EmbeddingOptimizer::kLazyAdam), plan.dedup,
                        cache);
  e.init(21);
  const int steps = 10, r = comm.rank();
  std::vector<std::vector<int32_t>> users, items;
  std::mt19937 g(uint32_t(91 + 7 * r));
  for (int s = 0; s < steps; ++s) {
    users.emplace_back(size_t(30 + 4 * r + s % 3));
    items.emplace_back(size_t(60 - 5 * r));
    for (auto& x : users.back()) x = int32_t(g() % 3 == 0 ? g() % 5 : g() % kUsers);
    for (auto& x : items.back()) x = int32_t(g() % 2 == 0 ? g() % 4 : g() % kItems);
  }
  auto ids = [&](int s) {
    return std::vector<TableIds>{{users[size_t(s)].data(), int64_t(users[size_t(s)].size())},
                                 {items[size_t(s)].data(), int64_t(items[size_t(s)].size())}};
  };
  const CommCounters before = comm.counters();
  std::vector<float> out, rep(size_t(e.replicated_grad_floats()));
  int announced = 0;
  for (int s = 0; s < steps; ++s) {
    for (; cache > 0 && announced <= std::min(steps - 1, s + ahead); ++announced)
      e.announce(ids(announced));
    e.lookup(ids(s));
    for (int t = 0; t < 2; ++t) {
      const int64_t n = ids(s)[size_t(t)].n;
      const float* rows = e.rows(t);
      out.insert(out.end(), rows, rows + n * kD);
      float* gr = e.row_grads(t);
      for (int64_t k = 0; k < n * kD; ++k) gr[k] = 0.5f * rows[k] - 0.002f * float(k % 5);
    }
    e.gradients_start(rep.empty() ? nullptr : rep.data());
    if (!rep.empty()) comm.all_reduce_sum(rep.data(), rep.size(), DType::kFloat32);
    e.gradients_finish(s + 1);
    e.update_replicated(rep.data(), s + 1);
  }
  const CommCounters after = comm.counters();
  if (step_rows) *step_rows = cache > 0 ? e.cache_counters()->most_step_rows : 0;
  *key_exchanges = 0;
  for (CollectiveKind k : {CollectiveKind::kCounts, CollectiveKind::kAllToAll})
    *key_exchanges += after.calls[int(k)] - before.calls[int(k)];
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> table = e.gather_table(t);
    out.insert(out.end(), table.begin(), table.end());
  }
  return out;
}

// On CPU ranks a step's announcement routes its keys as its lookup would (the distinct ones
// with --dedup, bucketed by owner) and sends them to the owners, so the lookup exchanges no
// keys of its own. Every step's rows and the final tables equal the run without a host
// tier bit for bit, at a budget of every row and at a small one, for row-wise, table-wise
// and replicated tables, with and without --dedup, at W = 3; the run makes exactly the
// exchanges of the run without a tier (the step's exchange of keys became the
// announcement's). A lookup whose ids are not those announced for it is refused on every
// rank.
TEST(HostTierMpi, AnnouncementsRouteTheStepsKeys) {
  const test::RunResult r = test::run("NCF_HOST_TIER_WORKER=1 timeout -k 5 120 " + test::mpirun(3) +
                                      " " + test::self_exe() + " --gtest_filter=HostTierWorker.*");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("[  FAILED  ]"), std::string::npos) << r.output;
  int done = 0;
  for (size_t p = r.output.find("host tier worker: done"); p != std::string::npos;
       p = r.output.find("host tier worker: done", p + 1))
    ++done;
  EXPECT_EQ(done, 3) << r.output;
}

TEST(HostTierWorker, RoutesAsTheLookup) {
  if (!std::getenv("NCF_HOST_TIER_WORKER")) GTEST_SKIP() << "runs only inside HostTierMpi.*";
  const int rc = run_main(0, nullptr, [](int& argc, char**& argv) {
    const RankInfo info = bootstrap(&argc, &argv, true);
    auto comm = make_communicator(info, Device::kCpu, "mpi");
    const int W = info.world;
    for (const std::string forced : {"row", "table", "user=row,item=replicated"})
      for (bool dedup : {false, true}) {
        const EmbeddingPlan plan = test::user_item_plan(kUsers, kItems, kD, W, forced, dedup);
        const std::string what =
            forced + (dedup ? " dedup" : "") + " rank " + std::to_string(info.rank);
        int64_t x_ref = 0, x_all = 0, x_small = 0, step_rows = 0;
        const std::vector<float> ref = mpi_steps(plan, *comm, 0, 0, &x_ref);
        const std::vector<float> all =
            mpi_steps(plan, *comm, kUsers + kItems, 2, &x_all, &step_rows);
        // The largest step's rows (a rank that holds no rows still has a cache, of one):
        // rows of the next step leave and come back.
        const std::vector<float> small =
            mpi_steps(plan, *comm, std::max<int64_t>(step_rows, 1), 1, &x_small);
        EXPECT_EQ(ref.size(), all.size()) << what;
        EXPECT_EQ(ref.size(), small.size()) << what;
        EXPECT_EQ(std::memcmp(ref.data(), all.data(), ref.size() * 4), 0) << what << ", 100%";
        EXPECT_EQ(std::memcmp(ref.data(), small.data(), ref.size() * 4), 0)
            << what << ", the largest step's rows";
        EXPECT_EQ(x_all, x_ref) << what;
        EXPECT_EQ(x_small, x_ref) << what;
      }
    // Ids other than the announced ones: refused before any exchange, on every rank.
    EmbeddingCollection e(test::user_item_plan(kUsers, kItems, kD, W, "row", false), *comm,
                          ExecContext{}, optimizer(EmbeddingOptimizer::kSgd), false, 200);
    e.init(5);
    std::vector<int32_t> u = {1, 2, 3}, it = {4, 5};
    e.announce({{u.data(), 3}, {it.data(), 2}});
    it[1] = 6;
    try {
      e.lookup({{u.data(), 3}, {it.data(), 2}});
      ADD_FAILURE() << "a lookup of other ids than the announced ones went through";
    } catch (const Error& err) {
      const std::string m = err.what();
      EXPECT_NE(m.find("ids are not the 5 announced for it"), std::string::npos) << m;
    }
    std::printf("host tier worker: done\n");
    std::fflush(stdout);
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace ncf
