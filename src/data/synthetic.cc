// The synthetic generator: the item model (popularity, topic factors, alias
// tables), per-user activity counts solved to sum exactly, per-user draws without
// repeats, and the pipeline that generates blocks of users on worker threads and
// hands them to DatasetWriter in user order. Every draw is keyed by (seed,
// stream, user or item), so the output does not depend on the thread count.
#include "data/synthetic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "common/check.h"
#include "common/parallel.h"
#include "common/philox.h"

namespace ncf {
namespace {

constexpr uint32_t kMaxTasteTopics = 3;
constexpr uint32_t kMaxRank = 4096;
constexpr uint64_t kBlockUsers = 4096;
// A block closes before its buffer would pass this many int32 entries (unless it
// holds a single user), which bounds the memory of blocks in flight.
constexpr uint64_t kBlockInts = 1ull << 21;
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

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

// Runs f(begin, end, part) over `parts` contiguous slices of [0, n) on the
// thread pool; rethrows the failure of the lowest slice.
template <typename F>
void parallel_slices(uint64_t n, int parts, F&& f) {
  parts = std::max(parts, 1);
  if (parts == 1 || n < (1u << 16)) {
    for (int p = 0; p < parts; ++p) f(n * p / parts, n * (p + 1) / parts, p);
    return;
  }
  std::vector<std::exception_ptr> errors(parts);
  parallel_for(parts, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      try {
        f(n * p / parts, n * (p + 1) / parts, int(p));
      } catch (...) {
        errors[p] = std::current_exception();
      }
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
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
  uint32_t K = 0;                // topics (rank)
  std::vector<double> pop;       // I: 1 / rank^s
  std::vector<uint32_t> topic1;  // I: primary topic
  std::vector<uint32_t> topic2;  // I: secondary topic (may equal the primary)
  std::vector<float> share1;     // I: factor on the primary topic, in [0.5, 1)
  double pop_total = 0;
  std::vector<double> topic_mass;       // K: Z_t = sum_i v_i(t) pop(i)
  std::vector<AliasCell> global;        // I: draws by popularity
  std::vector<uint64_t> member_off;     // K + 1
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
  m.K = p.rank;
  const uint64_t I = m.I;
  const uint32_t K = m.K;
  m.topic1.resize(I);
  m.topic2.resize(I);
  m.share1.resize(I);
  for (uint64_t i = 0; i < I; ++i) {
    Philox4 b = CounterRng{seed, kStreamSynthItem, i}.block(0);
    m.topic1[i] = scale32(b.v[0], K);
    m.topic2[i] = scale32(b.v[1], K);
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
  m.member_off.assign(K + 1, 0);
  for (uint64_t i = 0; i < I; ++i) {
    ++m.member_off[m.topic1[i] + 1];
    if (m.topic2[i] != m.topic1[i]) ++m.member_off[m.topic2[i] + 1];
  }
  for (uint32_t t = 0; t < K; ++t) m.member_off[t + 1] += m.member_off[t];
  m.members.resize(m.member_off[K]);
  std::vector<uint64_t> fill(m.member_off.begin(), m.member_off.end() - 1);
  for (uint64_t i = 0; i < I; ++i) {
    m.members[fill[m.topic1[i]]++] = static_cast<uint32_t>(i);
    if (m.topic2[i] != m.topic1[i]) m.members[fill[m.topic2[i]]++] = static_cast<uint32_t>(i);
  }
  m.topic_mass.assign(K, 0.0);
  m.member_alias.resize(m.members.size());
  std::vector<double> w;
  for (uint32_t t = 0; t < K; ++t) {
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

Taste taste_of(uint64_t seed, uint64_t user, uint32_t K) {
  CounterRng rng{seed, kStreamSynthUser, user};
  Philox4 a = rng.block(1), b = rng.block(2);
  Taste t;
  double w[kMaxTasteTopics];
  const uint32_t k = 1 + scale32(a.v[0], kMaxTasteTopics);
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t topic = scale32(a.v[1 + j], K);
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
  const Taste t = taste_of(seed, user, m.K);
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
  uint64_t cap = I / 2;
  if (I < eval_negatives)
    cap = 0;
  else if (I - eval_negatives < cap)
    cap = I - eval_negatives;
  if (cap < params.min_per_user)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_items ", I, " allows at most ", cap,
             " interactions per user (num_items / 2, and num_items - ", eval_negatives,
             " eval negatives), below min_per_user ", params.min_per_user,
             "; use more items or fewer eval negatives");
  return static_cast<uint32_t>(cap);
}

std::vector<uint32_t> synthetic_user_counts(const SyntheticParams& params, uint32_t eval_negatives,
                                            uint64_t seed, int threads) {
  const uint32_t cap = synthetic_max_per_user(params, eval_negatives);
  const uint64_t U = params.shape.num_users;
  const uint64_t N = params.shape.num_interactions;
  const uint32_t m = params.min_per_user;
  if (N < uint64_t(m) * U)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_interactions ", N, " < min_per_user ",
             m, " x num_users ", U, " = ", uint64_t(m) * U);
  if (N > uint64_t(cap) * U)
    NCF_FAIL("synthetic shape '", params.shape.name, "': num_interactions ", N,
             " > the feasible maximum ", uint64_t(cap) * U, " = num_users ", U, " x max_per_user ",
             cap, " (num_items ", params.shape.num_items, ")");
  const int nthreads = resolve_threads(threads);

  // One 32-bit slot per user: first the activity weight's float bits, then the
  // count, so planning costs 4 bytes per user.
  std::vector<uint32_t> slot(U);
  auto weight = [&](uint64_t u) {
    float w;
    std::memcpy(&w, &slot[u], 4);
    return static_cast<double>(w);
  };
  parallel_slices(U, nthreads, [&](uint64_t b, uint64_t e, int) {
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
  std::vector<uint64_t> part(nthreads);
  auto total_at = [&](double lambda) {
    parallel_slices(U, nthreads, [&](uint64_t b, uint64_t e, int p) {
      uint64_t s = 0;
      for (uint64_t u = b; u < e; ++u) s += count_at(weight(u), lambda);
      part[p] = s;
    });
    uint64_t s = 0;
    for (uint64_t v : part) s += v;
    return s;
  };

  // Largest lambda with total(lambda) <= N, found by doubling then bisection;
  // stop once the bracket's totals are within U / 1024 of each other.
  double lo = 0, hi = 1;
  uint64_t s_lo = uint64_t(m) * U, s_hi = total_at(hi);
  while (s_hi <= N && hi < 1e300) {
    lo = hi;
    s_lo = s_hi;
    hi *= 2;
    s_hi = total_at(hi);
  }
  const uint64_t close = U / 1024 + 1;
  for (int it = 0; it < 200 && s_lo < N && s_hi > N && s_hi - s_lo > close; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (!(mid > lo && mid < hi)) break;
    const uint64_t s = total_at(mid);
    if (s <= N) {
      lo = mid;
      s_lo = s;
    } else {
      hi = mid;
      s_hi = s;
    }
  }
  // The remaining r go, one each, to the first users (by id) whose count grows
  // between lo and hi, then (rarely needed) to any user below the cap.
  uint64_t r = N - s_lo;
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

DatasetMeta generate_synthetic(const SyntheticParams& params, const std::string& out_dir,
                               const PrepOptions& opt) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  check_params(params);
  const SyntheticShape& sh = params.shape;
  const uint64_t U = sh.num_users, I = sh.num_items, N = sh.num_interactions;
  const uint32_t E = opt.eval_negatives;
  const uint64_t seed = opt.seed;
  const int nthreads = resolve_threads(opt.threads);

  const uint32_t cap = synthetic_max_per_user(params, E);
  if (opt.progress)
    std::fprintf(stderr, "synthetic %s: planning %llu users, %llu items, %llu interactions\n",
                 sh.name.c_str(), (unsigned long long)U, (unsigned long long)I,
                 (unsigned long long)N);
  const std::vector<uint32_t> counts = synthetic_user_counts(params, E, seed, nthreads);
  const ItemModel items = build_items(params, seed);
  const Mixture mix = mixture_of(params.preference);
  if (opt.progress)
    std::fprintf(stderr, "synthetic %s: planned (%.1f s), max %u interactions per user\n",
                 sh.name.c_str(), seconds(), cap);

  // Blocks of consecutive users; per user the buffer holds positives (n, sorted),
  // the draws (n: the n-1 train items then the test item) and E negatives.
  std::vector<uint64_t> block_first{0};
  {
    uint64_t users = 0, ints = 0;
    for (uint64_t u = 0; u < U; ++u) {
      const uint64_t need = 2ull * counts[u] + E;
      if (users > 0 && (users == kBlockUsers || ints + need > kBlockInts)) {
        block_first.push_back(u);
        users = ints = 0;
      }
      ++users;
      ints += need;
    }
    block_first.push_back(U);
  }
  const uint64_t num_blocks = block_first.size() - 1;

  DatasetPlan plan;
  plan.source = "synthetic:" + sh.name;
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = N - U;
  plan.num_positives = N;
  plan.eval_negatives = E;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = seed;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.generator = {{"generator", "synthetic"},
                    {"shape", sh.name},
                    {"num_users", U},
                    {"num_items", I},
                    {"num_interactions", N},
                    {"min_per_user", params.min_per_user},
                    {"max_per_user", cap},
                    {"activity_alpha", params.activity_alpha},
                    {"zipf_s", params.zipf_s},
                    {"rank", params.rank},
                    {"preference", params.preference}};
  DatasetWriter writer(out_dir, plan);

  struct Block {
    uint64_t index = UINT64_MAX;  // the block this slot holds
    bool ready = false;
    std::vector<int32_t> data;
    std::vector<uint64_t> offset;  // per user start in data, then the end
  };
  const uint64_t num_slots = 2ull * nthreads + 2;
  std::vector<Block> slots(num_slots);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next_block = 0, consumed = 0;
  bool failed = false;
  std::exception_ptr worker_error;

  auto fill_block = [&](uint64_t b, Block& out, Scratch& s) {
    const uint64_t first = block_first[b], last = block_first[b + 1];
    out.offset.clear();
    uint64_t size = 0;
    for (uint64_t u = first; u < last; ++u) {
      out.offset.push_back(size);
      size += 2ull * counts[u] + E;
    }
    out.offset.push_back(size);
    out.data.resize(size);
    for (uint64_t u = first; u < last; ++u) {
      const uint32_t n = counts[u];
      int32_t* pos = out.data.data() + out.offset[u - first];
      int32_t* draws = pos + n;
      draw_user_items(items, mix, seed, u, n, s, draws);
      take_sorted(draws, n, I, s, pos);
      draw_eval_negatives(u, pos, n, I, E, seed, s.bits, draws + n);
    }
  };
  auto worker = [&] {
    Scratch s;
    s.bits.assign((I + 63) / 64, 0);
    try {
      for (;;) {
        uint64_t b;
        {
          std::unique_lock<std::mutex> lk(mu);
          if (failed || next_block >= num_blocks) return;
          b = next_block++;
          cv.wait(lk, [&] { return failed || b < consumed + num_slots; });
          if (failed) return;
        }
        Block& slot = slots[b % num_slots];
        fill_block(b, slot, s);
        {
          std::lock_guard<std::mutex> lk(mu);
          slot.index = b;
          slot.ready = true;
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!worker_error) worker_error = std::current_exception();
      failed = true;
      cv.notify_all();
    }
  };

  std::vector<std::thread> pool;
  for (int t = 0; t < nthreads; ++t) pool.emplace_back(worker);
  std::exception_ptr main_error;
  try {
    uint64_t done_users = 0, done_positives = 0, next_report = U / 20;
    for (uint64_t b = 0; b < num_blocks; ++b) {
      Block& slot = slots[b % num_slots];
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return failed || (slot.ready && slot.index == b); });
        if (failed) break;
      }
      const uint64_t first = block_first[b], last = block_first[b + 1];
      for (uint64_t u = first; u < last; ++u) {
        const uint32_t n = counts[u];
        const int32_t* pos = slot.data.data() + slot.offset[u - first];
        writer.add_user(u, pos, n, pos + n, n - 1, pos + 2 * n - 1, size_t(E) + 1);
        done_positives += n;
      }
      done_users = last;
      {
        std::lock_guard<std::mutex> lk(mu);
        slot.ready = false;
        consumed = b + 1;
      }
      cv.notify_all();
      if (opt.progress && done_users >= next_report && done_users < U) {
        std::fprintf(stderr, "synthetic %s: %3d%% users (%llu / %llu), %llu interactions, %.1f s\n",
                     sh.name.c_str(), static_cast<int>(100 * done_users / U),
                     (unsigned long long)done_users, (unsigned long long)U,
                     (unsigned long long)done_positives, seconds());
        next_report = done_users + U / 20;
      }
    }
  } catch (...) {
    main_error = std::current_exception();
    std::lock_guard<std::mutex> lk(mu);
    failed = true;
  }
  cv.notify_all();
  for (auto& t : pool) t.join();
  if (worker_error) std::rethrow_exception(worker_error);
  if (main_error) std::rethrow_exception(main_error);

  if (opt.progress)
    std::fprintf(stderr, "synthetic %s: generated, writing train shards (%.1f s)\n",
                 sh.name.c_str(), seconds());
  DatasetMeta meta = writer.finish();
  if (opt.progress)
    std::fprintf(stderr, "synthetic %s: done in %.1f s\n", sh.name.c_str(), seconds());
  return meta;
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
  const Taste t = taste_of(p.seed, user, p.items.K);
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
  const Taste taste = taste_of(impl_->seed, user, impl_->items.K);
  double w = 0;
  for (uint32_t j = 0; j < taste.num; ++j)
    if (taste.topic[j] == t) w += taste.weight(j);
  return w;
}

}  // namespace ncf
