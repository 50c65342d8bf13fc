// The synthetic generator: the item model (popularity, topic factors, alias
// tables), per-user activity counts solved to sum exactly, and the split stage
// that draws each user's items without repeats; prep_stages.h's shared stages
// draw the eval negatives and write the dataset. Every draw is keyed by (seed,
// stream, user or item), so the output does not depend on the thread count.
#include "data/synthetic.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "common/check.h"
#include "common/parallel.h"
#include "common/philox.h"
#include "data/extend.h"
#include "data/prep_stages.h"

namespace ncf {
namespace {

constexpr uint32_t kMaxTasteTopics = 3;
constexpr uint32_t kMaxRank = 4096;
// Counter layout of a user's stream (kStreamSynthUser, index = user): block 0
// activity, blocks 1-2 taste, blocks kFirstDrawBlock... one per item draw. The
// exponential keys of the dense fallback use index user | kKeyIndexBit.
constexpr uint32_t kFirstDrawBlock = 4;
constexpr uint64_t kKeyIndexBit = 1ull << 63;
constexpr double kTwo32 = 4294967296.0;
// Activity weights are clamped here so they stay finite as float.
constexpr double kMaxActivityWeight = 1e30;

// Uniform index in [0, n) from 32 random bits (n < 2^32).
inline uint32_t scale32(uint32_t x, uint64_t n) {
  return static_cast<uint32_t>((static_cast<uint64_t>(x) * n) >> 32);
}

// ------------------------------------------------------------ alias tables ---

// Walker's alias method: column j yields its own outcome when the 32-bit coin is
// below keep, its alias otherwise. One Philox block gives the column and the coin.
// Cells hold item ids, so a draw touches one cell.
struct AliasCell {
  uint32_t keep;
  uint32_t self;   // item of this column
  uint32_t other;  // item of the alias column
};

// Vose's construction over n weights (not all zero) of the items ids[0..n).
void build_alias(const double* w, const uint32_t* ids, uint32_t n, AliasCell* out) {
  double total = 0;
  for (uint32_t j = 0; j < n; ++j) total += w[j];
  std::vector<double> q(n);
  std::vector<uint32_t> small, large;
  for (uint32_t j = 0; j < n; ++j) {
    q[j] = w[j] * n / total;
    (q[j] < 1.0 ? small : large).push_back(j);
  }
  auto keep_of = [](double p) -> uint32_t {
    if (p <= 0) return 0;
    if (p >= 1) return UINT32_MAX;
    return static_cast<uint32_t>(p * kTwo32);
  };
  while (!small.empty() && !large.empty()) {
    uint32_t s = small.back();
    small.pop_back();
    uint32_t l = large.back();
    out[s] = {keep_of(q[s]), ids[s], ids[l]};
    q[l] = (q[l] + q[s]) - 1.0;
    if (q[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // Leftovers are 1 up to rounding.
  for (uint32_t j : small) out[j] = {UINT32_MAX, ids[j], ids[j]};
  for (uint32_t j : large) out[j] = {UINT32_MAX, ids[j], ids[j]};
}

inline uint32_t alias_draw(const AliasCell* cells, uint32_t n, uint32_t col_bits,
                           uint32_t coin_bits) {
  const AliasCell& c = cells[scale32(col_bits, n)];
  return coin_bits < c.keep ? c.self : c.other;
}

// -------------------------------------------------------------- item model ---

struct ItemModel {
  uint64_t I = 0;                // items
  uint32_t num_topics = 0;       // topics (rank)
  std::vector<double> pop;       // I: 1 / rank^s
  std::vector<uint32_t> topic1;  // I: primary topic
  std::vector<uint32_t> topic2;  // I: secondary topic (may equal the primary)
  std::vector<float> share1;     // I: factor on the primary topic, in [0.5, 1)
  double pop_total = 0;
  std::vector<double> topic_mass;       // num_topics: Z_t = sum_i v_i(t) pop(i)
  std::vector<AliasCell> global;        // I: draws by popularity
  std::vector<uint64_t> member_off;     // num_topics + 1
  std::vector<uint32_t> members;        // items of each topic, ascending
  std::vector<AliasCell> member_alias;  // per topic over its members: v_i(t) pop(i)

  double factor(uint64_t i, uint32_t t) const {
    double v = 0;
    if (topic1[i] == t) v += share1[i];
    if (topic2[i] == t) v += 1.0 - static_cast<double>(share1[i]);
    return v;
  }
  uint32_t topic_size(uint32_t t) const {
    return static_cast<uint32_t>(member_off[t + 1] - member_off[t]);
  }
};

ItemModel build_items(const SyntheticParams& p, uint64_t seed) {
  ItemModel m;
  m.I = p.shape.num_items;
  m.num_topics = p.rank;
  const uint64_t I = m.I;
  const uint32_t num_topics = m.num_topics;
  m.topic1.resize(I);
  m.topic2.resize(I);
  m.share1.resize(I);
  for (uint64_t i = 0; i < I; ++i) {
    Philox4 b = CounterRng{seed, kStreamSynthItem, i}.block(0);
    m.topic1[i] = scale32(b.v[0], num_topics);
    m.topic2[i] = scale32(b.v[1], num_topics);
    // 23 bits keep 0.5 + 0.5 u below 1 in float, so both factors stay positive.
    m.share1[i] = static_cast<float>(0.5 + 0.5 * ((b.v[2] >> 9) * (1.0 / 8388608.0)));
  }
  // Popularity ranks: a seeded Fisher-Yates permutation (draw 2 = Philox block 1).
  std::vector<uint32_t> perm(I);
  std::iota(perm.begin(), perm.end(), 0u);
  for (uint64_t j = I - 1; j > 0; --j)
    std::swap(perm[j], perm[CounterRng{seed, kStreamSynthItem, j}.below(2, j + 1)]);
  m.pop.resize(I);
  for (uint64_t r = 0; r < I; ++r) m.pop[perm[r]] = std::pow(static_cast<double>(r + 1), -p.zipf_s);
  for (uint64_t i = 0; i < I; ++i) m.pop_total += m.pop[i];
  m.global.resize(I);
  {
    std::vector<uint32_t> ids(I);
    std::iota(ids.begin(), ids.end(), 0u);
    build_alias(m.pop.data(), ids.data(), static_cast<uint32_t>(I), m.global.data());
  }

  // Topic member lists (CSR) and their alias tables.
  m.member_off.assign(num_topics + 1, 0);
  for (uint64_t i = 0; i < I; ++i) {
    ++m.member_off[m.topic1[i] + 1];
    if (m.topic2[i] != m.topic1[i]) ++m.member_off[m.topic2[i] + 1];
  }
  for (uint32_t t = 0; t < num_topics; ++t) m.member_off[t + 1] += m.member_off[t];
  m.members.resize(m.member_off[num_topics]);
  std::vector<uint64_t> fill(m.member_off.begin(), m.member_off.end() - 1);
  for (uint64_t i = 0; i < I; ++i) {
    m.members[fill[m.topic1[i]]++] = static_cast<uint32_t>(i);
    if (m.topic2[i] != m.topic1[i]) m.members[fill[m.topic2[i]]++] = static_cast<uint32_t>(i);
  }
  m.topic_mass.assign(num_topics, 0.0);
  m.member_alias.resize(m.members.size());
  std::vector<double> w;
  for (uint32_t t = 0; t < num_topics; ++t) {
    const uint64_t b = m.member_off[t];
    const uint32_t n = m.topic_size(t);
    w.resize(n);
    for (uint32_t j = 0; j < n; ++j) {
      const uint32_t i = m.members[b + j];
      w[j] = m.factor(i, t) * m.pop[i];
      m.topic_mass[t] += w[j];
    }
    if (n) build_alias(w.data(), m.members.data() + b, n, m.member_alias.data() + b);
  }
  return m;
}

// ------------------------------------------------------------------ users ---

// A user's taste: up to 3 topics; draw picks topic j when the 32-bit word is
// below cut[j] (cumulative weights times 2^32; the last cut is 2^32).
struct Taste {
  uint32_t num = 0;
  uint32_t topic[kMaxTasteTopics] = {};
  uint64_t cut[kMaxTasteTopics] = {};
  double weight(uint32_t j) const { return (cut[j] - (j ? cut[j - 1] : 0)) / kTwo32; }
};

Taste taste_of(uint64_t seed, uint64_t user, uint32_t num_topics) {
  CounterRng rng{seed, kStreamSynthUser, user};
  Philox4 a = rng.block(1), b = rng.block(2);
  Taste t;
  double w[kMaxTasteTopics];
  const uint32_t k = 1 + scale32(a.v[0], kMaxTasteTopics);
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t topic = scale32(a.v[1 + j], num_topics);
    const double e = -std::log((b.v[j] + 0.5) / kTwo32);  // Exp(1): Dirichlet(1) weights
    uint32_t s = 0;
    while (s < t.num && t.topic[s] != topic) ++s;
    if (s == t.num) {
      t.topic[t.num] = topic;
      w[t.num++] = e;
    } else {
      w[s] += e;
    }
  }
  double total = 0;
  for (uint32_t j = 0; j < t.num; ++j) total += w[j];
  double cum = 0;
  for (uint32_t j = 0; j < t.num; ++j) {
    cum += w[j];
    t.cut[j] =
        (j + 1 == t.num) ? (1ull << 32) : static_cast<uint64_t>(std::llround(cum / total * kTwo32));
  }
  return t;
}

// Raw activity weight w_u >= 0 (Pareto(alpha) - 1); counts are m + floor(lambda w_u).
float activity_weight(uint64_t seed, uint64_t user, double alpha) {
  const double u = CounterRng{seed, kStreamSynthUser, user}.uniform_double(0);
  const double w = std::pow(1.0 - u, -1.0 / alpha) - 1.0;
  return static_cast<float>(std::min(w, kMaxActivityWeight));
}

// Draw-time constants shared by the generator and PlantedModel.
struct Mixture {
  uint64_t global_cut;  // a draw is by popularity when its first word is below this
  double global_share;  // global_cut / 2^32
};

Mixture mixture_of(double preference) {
  Mixture x;
  x.global_cut = static_cast<uint64_t>(std::llround((1.0 - preference) * kTwo32));
  x.global_share = x.global_cut / kTwo32;
  return x;
}

// One draw from p_u, from one Philox block: word 0 picks popularity vs taste,
// word 3 the topic, words 1 and 2 the alias column and coin.
inline uint32_t draw_item(const ItemModel& m, const Taste& t, const Mixture& x, Philox4 r) {
  if (r.v[0] < x.global_cut)
    return alias_draw(m.global.data(), static_cast<uint32_t>(m.I), r.v[1], r.v[2]);
  uint32_t j = 0;
  while (j + 1 < t.num && r.v[3] >= t.cut[j]) ++j;
  const uint32_t topic = t.topic[j];
  const uint32_t n = m.topic_size(topic);
  if (n == 0)  // an empty topic (rank near num_items) falls back to popularity
    return alias_draw(m.global.data(), static_cast<uint32_t>(m.I), r.v[1], r.v[2]);
  const uint64_t b = m.member_off[topic];
  return alias_draw(m.member_alias.data() + b, n, r.v[1], r.v[2]);
}

// p_u(i) = pop(i) (base + sum_j coef[j] v_i(topic[j])): the probability that one
// draw_item picks i, with the per-user constants folded in once.
struct UserLaw {
  double base = 0;
  uint32_t num = 0;
  uint32_t topic[kMaxTasteTopics] = {};
  double coef[kMaxTasteTopics] = {};

  double operator()(const ItemModel& m, uint64_t i) const {
    double c = base;
    for (uint32_t j = 0; j < num; ++j) c += coef[j] * m.factor(i, topic[j]);
    return m.pop[i] * c;
  }
};

UserLaw law_of(const ItemModel& m, const Taste& t, const Mixture& x) {
  UserLaw law;
  double by_pop = x.global_share;
  for (uint32_t j = 0; j < t.num; ++j) {
    const uint32_t topic = t.topic[j];
    if (m.topic_mass[topic] > 0) {
      law.topic[law.num] = topic;
      law.coef[law.num++] = (1.0 - x.global_share) * t.weight(j) / m.topic_mass[topic];
    } else {
      by_pop += (1.0 - x.global_share) * t.weight(j);  // drawn by popularity instead
    }
  }
  law.base = by_pop / m.pop_total;
  return law;
}

// Per-thread scratch for drawing users.
struct Scratch {
  std::vector<uint64_t> bits;                     // I bits, all zero between users
  std::vector<std::pair<double, uint32_t>> keys;  // dense fallback, up to I entries
};

// Fills order[0..n) with n distinct items in draw (= timestamp) order: successive
// draws from p_u, repeats rejected. Leaves the n items' bits set in s.bits.
// When repeats eat the draw budget (a heavy user whose taste is nearly used up),
// the rest is sampled densely: ordering the items not yet drawn by Exp(1) / p_u(i)
// continues the successive draws without repeats exactly (Efraimidis-Spirakis;
// the exponentials are memoryless), at O(I) cost for that user.
void draw_user_items(const ItemModel& m, const Mixture& x, uint64_t seed, uint64_t user, uint32_t n,
                     Scratch& s, int32_t* order) {
  const Taste t = taste_of(seed, user, m.num_topics);
  const CounterRng rng{seed, kStreamSynthUser, user};
  const uint64_t budget =
      std::min<uint64_t>(3ull * n + 64, static_cast<uint64_t>(UINT32_MAX) - kFirstDrawBlock);
  uint32_t got = 0;
  for (uint64_t k = 0; k < budget && got < n; ++k) {
    const uint32_t it = draw_item(m, t, x, rng.block(static_cast<uint32_t>(kFirstDrawBlock + k)));
    uint64_t& word = s.bits[it >> 6];
    const uint64_t bit = 1ull << (it & 63);
    if (word & bit) continue;
    word |= bit;
    order[got++] = static_cast<int32_t>(it);
  }
  if (got == n) return;

  const CounterRng key_rng{seed, kStreamSynthUser, user | kKeyIndexBit};
  const UserLaw law = law_of(m, t, x);
  s.keys.clear();
  for (uint64_t i = 0; i < m.I; ++i) {
    if ((s.bits[i >> 6] >> (i & 63)) & 1) continue;
    const double e = -std::log(1.0 - key_rng.uniform_double(i));
    s.keys.push_back({e / law(m, i), static_cast<uint32_t>(i)});
  }
  const size_t rest = n - got;
  std::nth_element(s.keys.begin(), s.keys.begin() + rest, s.keys.end());
  std::sort(s.keys.begin(), s.keys.begin() + rest);
  for (size_t j = 0; j < rest; ++j) {
    const uint32_t it = s.keys[j].second;
    s.bits[it >> 6] |= 1ull << (it & 63);
    order[got++] = static_cast<int32_t>(it);
  }
}

// Writes the n items whose bits are set, ascending, to out, and clears their bits
// (`order` lists them). Scans the bitmap when that is cheaper than sorting.
void take_sorted(const int32_t* order, uint32_t n, uint64_t num_items, Scratch& s, int32_t* out) {
  const uint64_t words = (num_items + 63) / 64;
  if (words <= 8ull * n) {
    uint32_t k = 0;
    for (uint64_t w = 0; w < words && k < n; ++w) {
      uint64_t v = s.bits[w];
      s.bits[w] = 0;
      while (v) {
        out[k++] = static_cast<int32_t>(w * 64 + __builtin_ctzll(v));
        v &= v - 1;
      }
    }
    return;
  }
  std::copy(order, order + n, out);
  std::sort(out, out + n);
  for (uint32_t j = 0; j < n; ++j) s.bits[order[j] >> 6] = 0;
}

// ------------------------------------------------------------- validation ---

void check_params(const SyntheticParams& p) {
  const SyntheticShape& sh = p.shape;
  const std::string what = "synthetic shape '" + sh.name + "': ";
  if (sh.num_users < 1 || sh.num_users > INT32_MAX)
    NCF_FAIL(what, "num_users ", sh.num_users, " must be in [1, ", INT32_MAX, "]");
  if (sh.num_items < 2 || sh.num_items > INT32_MAX)
    NCF_FAIL(what, "num_items ", sh.num_items, " must be in [2, ", INT32_MAX, "]");
  if (p.min_per_user < 2)
    NCF_FAIL(what, "min_per_user ", p.min_per_user, " must be >= 2 (one train + one test item)");
  if (!(p.activity_alpha > 0 && std::isfinite(p.activity_alpha)))
    NCF_FAIL(what, "activity_alpha ", p.activity_alpha, " must be > 0");
  if (!(p.zipf_s >= 0 && std::isfinite(p.zipf_s)))
    NCF_FAIL(what, "zipf_s ", p.zipf_s, " must be >= 0");
  if (p.rank < 1 || p.rank > kMaxRank)
    NCF_FAIL(what, "rank ", p.rank, " must be in [1, ", kMaxRank, "]");
  if (!(p.preference >= 0 && p.preference < 1))
    NCF_FAIL(what, "preference ", p.preference,
             " must be in [0, 1) (some popularity mass keeps every item reachable)");
}

// Most interactions per user: num_items / 2, and num_items - E so that E
// distinct eval negatives remain (E = 0 when they are drawn with replacement).
uint64_t per_user_cap(uint64_t I, uint32_t E) {
  if (I < E) return 0;
  return std::min<uint64_t>(I / 2, I - E);
}

}  // namespace

// ------------------------------------------------------------ public API ---

SyntheticShape synthetic_shape(const std::string& name) {
  if (name == "ml-1m") return {name, 6040, 3706, 1000209};
  if (name == "ml-20m") return {name, 138493, 26744, 20000263};
  if (name == "small") return {name, 2000, 1000, 100000};
  NCF_FAIL("unknown synthetic shape '", name, "' (known: ml-1m, ml-20m, small)");
}

uint32_t synthetic_max_per_user(const SyntheticParams& params, uint32_t eval_negatives) {
  check_params(params);
  const uint64_t I = params.shape.num_items;
  const uint64_t cap = per_user_cap(I, eval_negatives);
  if (cap < params.min_per_user && per_user_cap(I, 0) >= params.min_per_user)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_items ", I, " allows at most ", cap,
             " interactions per user (num_items / 2, and num_items - ", eval_negatives,
             " distinct eval negatives), below min_per_user ", params.min_per_user,
             "; use more items, fewer eval negatives or --eval_sampling with_replacement");
  if (cap < params.min_per_user)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_items ", I, " allows at most ", cap,
             " interactions per user (num_items / 2), below min_per_user ", params.min_per_user,
             "; use more items");
  return static_cast<uint32_t>(cap);
}

std::vector<uint32_t> synthetic_user_counts(const SyntheticParams& params, uint32_t eval_negatives,
                                            uint64_t seed, int threads) {
  const uint32_t cap = synthetic_max_per_user(params, eval_negatives);
  const uint64_t U = params.shape.num_users;
  const uint64_t total = params.shape.num_interactions;
  const uint32_t m = params.min_per_user;
  if (total < uint64_t(m) * U)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_interactions ", total,
             " < min_per_user ", m, " x num_users ", U, " = ", uint64_t(m) * U);
  if (total > uint64_t(cap) * U)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_interactions ", total,
             " > the feasible maximum ", uint64_t(cap) * U, " = num_users ", U, " x max_per_user ",
             cap, " (num_items ", params.shape.num_items, ")");
  threads = resolve_threads(threads);

  // One 32-bit slot per user: first the activity weight's float bits, then the
  // count, so planning costs 4 bytes per user.
  std::vector<uint32_t> slot(U);
  auto weight = [&](uint64_t u) {
    float w;
    std::memcpy(&w, &slot[u], 4);
    return static_cast<double>(w);
  };
  parallel_ranges(threads, U, [&](uint64_t b, uint64_t e) {
    for (uint64_t u = b; u < e; ++u) {
      float w = activity_weight(seed, u, params.activity_alpha);
      std::memcpy(&slot[u], &w, 4);
    }
  });
  const double room = cap - m;
  auto count_at = [&](double w, double lambda) -> uint32_t {
    const double extra = lambda * w;
    return extra >= room ? cap : m + static_cast<uint32_t>(extra);
  };
  // Integer sums: exact in any order, so the total does not depend on the threads.
  auto total_at = [&](double lambda) {
    std::atomic<uint64_t> sum{0};
    parallel_ranges(threads, U, [&](uint64_t b, uint64_t e) {
      uint64_t s = 0;
      for (uint64_t u = b; u < e; ++u) s += count_at(weight(u), lambda);
      sum += s;
    });
    return sum.load();
  };

  // Largest lambda with total(lambda) <= total, found by doubling then bisection;
  // stop once the bracket's totals are within U / 1024 of each other.
  double lo = 0, hi = 1;
  uint64_t s_lo = uint64_t(m) * U, s_hi = total_at(hi);
  while (s_hi <= total && hi < 1e300) {
    lo = hi;
    s_lo = s_hi;
    hi *= 2;
    s_hi = total_at(hi);
  }
  const uint64_t close = U / 1024 + 1;
  for (int it = 0; it < 200 && s_lo < total && s_hi > total && s_hi - s_lo > close; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (!(mid > lo && mid < hi)) break;
    const uint64_t s = total_at(mid);
    if (s <= total) {
      lo = mid;
      s_lo = s;
    } else {
      hi = mid;
      s_hi = s;
    }
  }
  // The remaining r go, one each, to the first users (by id) whose count grows
  // between lo and hi, then (rarely needed) to any user below the cap.
  uint64_t r = total - s_lo;
  for (uint64_t u = 0; u < U; ++u) {
    const double w = weight(u);
    uint32_t c = count_at(w, lo);
    if (r && count_at(w, hi) > c) {
      ++c;
      --r;
    }
    slot[u] = c;
  }
  while (r)
    for (uint64_t u = 0; u < U && r; ++u)
      if (slot[u] < cap) {
        ++slot[u];
        --r;
      }
  return slot;
}

namespace {

// Split stage of the generator: each user's items are drawn (the draw order is
// the timestamp order, so the last draw is held out) and sorted into positives.
SplitUsers synthetic_split(const ItemModel& items, const Mixture& mix, uint64_t seed,
                           const std::vector<uint32_t>& counts) {
  SplitUsers s;
  s.num_users = counts.size();
  s.sizes = [&counts](uint64_t u, uint64_t* np, uint64_t* nt) {
    *np = counts[u];
    *nt = counts[u] - 1;
  };
  s.split = [&items, &mix, seed, &counts](UserBlock* b, uint64_t begin, uint64_t end) {
    Scratch scratch;
    scratch.bits.assign((items.I + 63) / 64, 0);
    std::vector<int32_t> draws;
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = b->first_user + j;
      const uint32_t n = counts[u];
      draws.resize(n);
      draw_user_items(items, mix, seed, u, n, scratch, draws.data());
      take_sorted(draws.data(), n, items.I, scratch, b->positives_of(j));
      std::copy(draws.begin(), draws.end() - 1, b->train_of(j));
      b->eval_of(j)[0] = draws.back();
    }
  };
  return s;
}

}  // namespace

DatasetMeta generate_synthetic(const SyntheticParams& params, const std::string& out_dir,
                               const PrepOptions& opt) {
  const SyntheticShape& sh = params.shape;
  const PrepProgress progress{opt.progress, "synthetic " + sh.name,
                              std::chrono::steady_clock::now()};
  check_params(params);
  const uint64_t U = sh.num_users, I = sh.num_items, total = sh.num_interactions;
  const uint32_t E = opt.eval_negatives;
  const uint64_t seed = opt.seed;
  const int threads = resolve_threads(opt.threads);

  // The counts leave every user E items for distinct eval negatives; drawn
  // with replacement they need leave none. auto: distinct when the counts fit
  // beside them, else with replacement when the counts fit that way (when
  // neither does, the distinct refusals say why).
  EvalSampling sampling = opt.eval_sampling;
  if (sampling == EvalSampling::kAuto) {
    auto fits = [&](uint32_t reserve) {
      const uint64_t cap = per_user_cap(I, reserve);
      return cap >= params.min_per_user && total <= cap * U;
    };
    sampling = !fits(E) && fits(0) ? EvalSampling::kWithReplacement : EvalSampling::kDistinct;
    if (sampling == EvalSampling::kWithReplacement)
      std::fprintf(stderr,
                   "ncf_prep: note: synthetic shape '%s': %llu interactions of %llu users, at "
                   "least %u each, do not fit beside %u distinct eval negatives among %llu items; "
                   "eval negatives are drawn with replacement instead, repeats masked "
                   "(--eval_sampling with_replacement, TF Model Garden's and MLPerf's rule)\n",
                   sh.name.c_str(), (unsigned long long)total, (unsigned long long)U,
                   params.min_per_user, E, (unsigned long long)I);
  }
  const uint32_t reserve = sampling == EvalSampling::kWithReplacement ? 0 : E;

  // Plan stage (the generator's parse): activity counts and the item model.
  const uint32_t cap = synthetic_max_per_user(params, reserve);
  if (opt.progress)
    std::fprintf(stderr, "synthetic %s: planning %llu users, %llu items, %llu interactions\n",
                 sh.name.c_str(), (unsigned long long)U, (unsigned long long)I,
                 (unsigned long long)total);
  const std::vector<uint32_t> counts = synthetic_user_counts(params, reserve, seed, threads);
  const ItemModel items = build_items(params, seed);
  const Mixture mix = mixture_of(params.preference);
  if (opt.progress)
    std::fprintf(stderr, "synthetic %s: planned (%.1f s), max %u interactions per user\n",
                 sh.name.c_str(), progress.seconds(), cap);

  DatasetPlan plan;
  // --extend: dense ids extend the parent's by identity (extend.h).
  if (!opt.extend.prev.empty()) plan.lineage = identity_lineage(opt.extend.prev);
  plan.source = "synthetic:" + sh.name;
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = total - U;
  plan.num_positives = total;
  plan.eval_negatives = E;
  plan.eval_sampling = sampling;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = seed;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.generator = {{"generator", "synthetic"},
                    {"shape", sh.name},
                    {"num_users", U},
                    {"num_items", I},
                    {"num_interactions", total},
                    {"min_per_user", params.min_per_user},
                    {"max_per_user", cap},
                    {"activity_alpha", params.activity_alpha},
                    {"zipf_s", params.zipf_s},
                    {"rank", params.rank},
                    {"preference", params.preference}};
  const EvalNegatives negatives{I, E, seed, nullptr, nullptr};
  return assemble_dataset(out_dir, plan, synthetic_split(items, mix, seed, counts), negatives,
                          threads, progress);
}

// ----------------------------------------------------------- PlantedModel ---

struct PlantedModel::Impl {
  SyntheticParams params;
  uint64_t seed = 0;
  ItemModel items;
  Mixture mix;
};

PlantedModel::PlantedModel(const SyntheticParams& params, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  check_params(params);
  impl_->params = params;
  impl_->seed = seed;
  impl_->items = build_items(params, seed);
  impl_->mix = mixture_of(params.preference);
}

PlantedModel::~PlantedModel() = default;
PlantedModel::PlantedModel(PlantedModel&&) noexcept = default;
PlantedModel& PlantedModel::operator=(PlantedModel&&) noexcept = default;

double PlantedModel::score(uint64_t user, uint64_t item) const {
  const Impl& p = *impl_;
  NCF_CHECK(item < p.items.I, "item ", item, " out of range [0, ", p.items.I, ")");
  const Taste t = taste_of(p.seed, user, p.items.num_topics);
  return std::log(law_of(p.items, t, p.mix)(p.items, item));
}

double PlantedModel::popularity(uint64_t item) const {
  NCF_CHECK(item < impl_->items.I, "item ", item, " out of range [0, ", impl_->items.I, ")");
  return impl_->items.pop[item];
}

double PlantedModel::item_factor(uint64_t item, uint32_t t) const {
  NCF_CHECK(item < impl_->items.I, "item ", item, " out of range [0, ", impl_->items.I, ")");
  return impl_->items.factor(item, t);
}

double PlantedModel::user_taste(uint64_t user, uint32_t t) const {
  const Taste taste = taste_of(impl_->seed, user, impl_->items.num_topics);
  double w = 0;
  for (uint32_t j = 0; j < taste.num; ++j)
    if (taste.topic[j] == t) w += taste.weight(j);
  return w;
}

}  // namespace ncf
