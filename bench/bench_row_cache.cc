// The host tier's bookkeeping alone (embedding/row_cache.h), without rows to copy: each
// step's announce (k steps ahead), begin and retire, on the ids a one-rank step of the
// given shape lists (its positives' users, then its samples' items: positives with a
// popular head, negatives uniform). Each list is copied, inside the timed part, into memory
// the cache hands back from a retired step (RowCache::spare_rows), and each table's part
// loses its repeats where the table has at most 4 x its ids' rows (drop_repeats_where_dense:
// the item part at any real shape), as a one-rank collection builds it; --raw_lists hands
// the cache the repeats too, as the collection did before, so one binary runs both. Prints
// the mean microseconds per step of the second half of the steps (the first half fills the
// cache) at each budget, and of its three calls, the best of --repeats passes; and the slowest
// step of all, with its number (a one-time cost a mean hides). --threads splits the cache's
// passes over that many threads (RowCache::set_threads, as an ncf_dist rank does with its
// own), from --parallel_from threads on (4, as ncf_dist; 1 runs the split passes on one
// thread), where the table has --parallel_spread times a pass's rows (16, as ncf_dist): no
// move changes, so the counters printed are the same at every count.
// --sorted_input makes each list ascending and distinct inside the timed part first (a bit
// set over the rows, scanned once), as the collection did before the cache took lists
// with repeats: with this file copied into an older commit, the two side by side.
//
//   bench_row_cache [--users 200000] [--items 100000] [--positives 1638] [--negatives 4]
//                   [--lookahead 2] [--steps 4000] [--budgets 100,30,10] [--repeats 3]
//                   [--sorted_input] [--raw_lists] [--threads 1] [--parallel_from 4]
//                   [--parallel_spread 16]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "embedding/row_cache.h"

namespace {

struct Options {
  long long users = 200000, items = 100000;
  int positives = 1638, negatives = 4, lookahead = 2, steps = 4000, repeats = 3, threads = 1,
      parallel_from = ncf::RowCache::kParallelFrom;
  long long parallel_spread = ncf::RowCache::kParallelSpread;
  std::vector<int> budgets{100, 30, 10};
  bool sorted_input = false, raw_lists = false;
};

// v ascending and distinct, values in [0, bound): a bit set scanned once.
void sorted_unique(std::vector<int32_t>* v, int64_t bound, std::vector<uint64_t>* bits) {
  const int64_t words = (bound + 63) / 64;
  if (int64_t(bits->size()) < words) bits->assign(size_t(words), 0);
  for (int32_t x : *v) (*bits)[size_t(x) >> 6] |= uint64_t{1} << (x & 63);
  v->clear();
  for (int64_t w = 0; w < words; ++w) {
    uint64_t b = (*bits)[size_t(w)];
    (*bits)[size_t(w)] = 0;
    for (; b != 0; b &= b - 1) v->push_back(int32_t(w * 64 + __builtin_ctzll(b)));
  }
}

// A list to fill: memory a retired step held where the cache hands it back (spare_rows),
// else a new one (an older cache: this file copied into an older commit).
template <typename Cache>
auto spare_list(Cache& c, int) -> decltype(c.spare_rows()) {
  return c.spare_rows();
}
template <typename Cache>
std::vector<int32_t> spare_list(Cache&, long) {
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"The host tier's bookkeeping per step (see the file's header)"};
  app.add_option("--users", o.users, "user rows")->check(CLI::Range(1LL, 1LL << 30));
  app.add_option("--items", o.items, "item rows")->check(CLI::Range(1LL, 1LL << 30));
  app.add_option("--positives", o.positives, "positives a step")->check(CLI::Range(1, 1 << 24));
  app.add_option("--negatives", o.negatives, "negatives per positive")->check(CLI::Range(0, 999));
  app.add_option("--lookahead", o.lookahead, "steps announced ahead")->check(CLI::Range(0, 64));
  app.add_option("--steps", o.steps, "steps (the second half timed)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--budgets", o.budgets, "cache sizes in % of the rows")
      ->delimiter(',')
      ->check(CLI::Range(1, 100));
  app.add_option("--repeats", o.repeats, "passes (the best is printed)")->check(CLI::Range(1, 100));
  app.add_flag("--sorted_input", o.sorted_input, "each list made ascending and distinct first");
  app.add_option("--threads", o.threads, "threads the cache's passes use")
      ->check(CLI::Range(1, 1024));
  app.add_option("--parallel_from", o.parallel_from,
                 "the fewest threads that take the parallel passes (1: even one)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--parallel_spread", o.parallel_spread,
                 "split only where the table has this many times a pass's rows (0: always)")
      ->check(CLI::Range(0LL, 1LL << 30));
  app.add_flag("--raw_lists", o.raw_lists, "each list with its repeats (no per-table drop)");
  CLI11_PARSE(app, argc, argv);
  if (o.users + o.items > INT32_MAX) {
    std::fprintf(stderr, "bench_row_cache: --users + --items = %lld rows, over 2^31 - 1\n",
                 o.users + o.items);
    return 2;
  }
  const int64_t R = o.users + o.items;
  const int64_t per_step = int64_t(o.positives) * (2 + o.negatives);
  std::printf("rows %lld (users %lld, items %lld), ids a step %lld, lookahead %d, steps %d%s\n",
              (long long)R, o.users, o.items, (long long)per_step, o.lookahead, o.steps,
              o.sorted_input ? ", lists made ascending and distinct first"
              : o.raw_lists
                  ? ", lists with their repeats"
                  : ", each table's repeats dropped where it has at most 4 x its ids' rows");
  std::printf("passes on %d thread%s (split from %d threads, where the rows are %lld x a pass's)\n",
              o.threads, o.threads == 1 ? "" : "s", o.parallel_from, o.parallel_spread);
  std::mt19937_64 g(1);
  std::vector<std::vector<int32_t>> steps(size_t(o.steps));
  for (auto& v : steps) {
    v.reserve(size_t(per_step));
    for (int j = 0; j < o.positives; ++j) v.push_back(int32_t(g() % uint64_t(o.users)));
    const uint64_t head = std::max<uint64_t>(1, uint64_t(o.items) / 50);
    for (int j = 0; j < o.positives; ++j)  // positives: 30% from the 2% most popular items
      v.push_back(int32_t(o.users + int64_t(g() % 10 < 3 ? g() % head : g() % uint64_t(o.items))));
    for (int64_t j = 0; j < int64_t(o.positives) * o.negatives; ++j)
      v.push_back(int32_t(o.users + int64_t(g() % uint64_t(o.items))));
  }
  using Clock = std::chrono::steady_clock;
  for (int pct : o.budgets) {
    const int64_t slots = std::max<int64_t>(1, R * pct / 100);
    double best = 0, best_parts[3] = {0, 0, 0}, slowest = 0;
    int64_t slowest_step = 0;
    ncf::RowCache::Counters c;
    for (int r = 0; r < o.repeats; ++r) {
      ncf::RowCache cache(R, slots);
      cache.set_threads(o.threads, ncf::RowCache::kParallelGrain, o.parallel_from,
                        o.parallel_spread);
      ncf::RowCache::Moves m;
      std::vector<uint64_t> bits;
      const int64_t S = o.steps, k = o.lookahead;
      auto announce = [&](int64_t s) {
        // The list copied into memory a retired step held, as the collection fills it.
        std::vector<int32_t> v = spare_list(cache, 0);
        v.assign(steps[size_t(s)].begin(), steps[size_t(s)].end());
        if (o.sorted_input) {
          sorted_unique(&v, R, &bits);
        } else if (!o.raw_lists) {
          // The users' part (the first `positives` ids), then the items' part.
          const int64_t n = int64_t(v.size()), nu = o.positives;
          const int64_t ku = ncf::drop_repeats_where_dense(v.data(), nu, 0, o.users, &bits);
          const int64_t ki =
              ncf::drop_repeats_where_dense(v.data() + nu, n - nu, o.users, o.items, &bits);
          std::copy(v.begin() + nu, v.begin() + nu + ki, v.begin() + ku);
          v.resize(size_t(ku + ki));
        }
        cache.announce(s, std::move(v), &m);
      };
      for (int64_t s = 0; s < std::min(k, S); ++s) announce(s);
      double timed = 0, parts[3] = {0, 0, 0};
      for (int64_t s = 0; s < S; ++s) {
        const auto t0 = Clock::now();
        if (s + k < S) announce(s + k);
        m.clear();
        const auto t1 = Clock::now();
        cache.begin(s, &m);
        m.clear();
        const auto t2 = Clock::now();
        cache.retire(s);
        const auto t3 = Clock::now();
        const double step_s = std::chrono::duration<double>(t3 - t0).count();
        if (step_s > slowest) {
          slowest = step_s;
          slowest_step = s;
        }
        if (s >= S / 2) {
          timed += std::chrono::duration<double>(t3 - t0).count();
          parts[0] += std::chrono::duration<double>(t1 - t0).count();
          parts[1] += std::chrono::duration<double>(t2 - t1).count();
          parts[2] += std::chrono::duration<double>(t3 - t2).count();
        }
      }
      const double per = 1e6 / double(S - S / 2);
      const double us = timed * per;
      if (r == 0 || us < best) {
        best = us;
        for (int q = 0; q < 3; ++q) best_parts[q] = parts[q] * per;
      }
      c = cache.counters();
    }
    std::printf(
        "budget %3d%% (%lld slots): %.1f us a step (announce %.1f, begin %.1f, retire %.1f); "
        "loads %lld, write-backs %lld, evicted inside their window %lld, waits %lld; slowest "
        "step %.1f us (step %lld)\n",
        pct, (long long)slots, best, best_parts[0], best_parts[1], best_parts[2],
        (long long)c.loads, (long long)c.evictions, (long long)c.evicted_in_window,
        (long long)c.waits, slowest * 1e6, (long long)slowest_step);
  }
  return 0;
}
