// The host tier's residency plan: see row_cache.h.
#include "embedding/row_cache.h"

#include <algorithm>
#include <tuple>

#include "common/check.h"

namespace ncf {

// A step's rows are far apart in row_: each is fetched this many rows before its turn.
constexpr size_t kAhead = 16;
// announce()'s and retire()'s passes do little per row, so they fetch further ahead.
constexpr size_t kAheadPass = 64;

void RowCache::Moves::clear() {
  evict_slots.clear();
  evict_rows.clear();
  load_rows.clear();
  load_slots.clear();
}

RowCache::RowCache(int64_t rows, int64_t slots) {
  NCF_CHECK(rows >= 0 && rows <= INT32_MAX, "row cache: ", rows, " rows");
  NCF_CHECK(slots >= 1 && slots <= INT32_MAX, "row cache: ", slots, " slots");
  slots = std::min(slots, std::max<int64_t>(rows, 1));
  row_.assign(size_t(rows), RowState{});
  row_of_.assign(size_t(slots), -1);
  free_.resize(size_t(slots));
  for (int64_t k = 0; k < slots; ++k) free_[size_t(k)] = int32_t(slots - 1 - k);
  // The list of evictable rows holds at most 2 x slots + 4096 entries not yet taken, and a
  // step adds at most its rows (no more than the slots): room for that, its pages touched
  // now, so that no step moves it to a larger array or faults its fresh pages in (at the
  // GPU kit's 25% budget those faults were half of each step's retire).
  if (!mirrors()) {
    lru_.resize(size_t(3 * slots + 8192));
    lru_.clear();
  }
}

bool RowCache::announced(int64_t s) const {
  for (const Step& st : window_)
    if (st.s == s) return true;
  return false;
}

int64_t RowCache::loaded_through() const {
  for (const Step& st : window_)
    for (int32_t r : st.missing)
      if (row_[size_t(r)].slot < 0) return st.s - 1;
  return next_s_ - 1;
}

void RowCache::note_window_size() {
  counters_.most_window_rows = std::max(counters_.most_window_rows, window_rows_);
}

void RowCache::announce(int64_t s, std::vector<int32_t> rows, Moves* m) {
  NCF_CHECK(next_s_ < 0 || s == next_s_, "row cache: step ", s, " announced, step ", next_s_,
            " expected");
  NCF_CHECK(s > retired_ && s < INT32_MAX, "row cache: step ", s, " out of range (step ", retired_,
            " retired)");
  next_s_ = s + 1;
  // The window's steps are numbered lo, lo + 1, ...: window_[a - lo] is step a.
  const int64_t lo = window_.empty() ? s : window_.front().s;
  const int32_t s32 = int32_t(s);
  const size_t n = rows.size();
  Step st;
  if (!spare_.empty()) {
    st = std::move(spare_.back());
    spare_.pop_back();
  }
  st.s = s;
  st.prev.resize(n);
  st.missing.resize(n);
  // One pass, without a branch on the data: each row's state says whether it enters the
  // window (tally[0]), passes from an earlier step a of the window to s (tally[1 + a - lo]:
  // a's count of rows it is the last to touch drops), or was listed before in this step
  // (last announced step s: tally[1 + s - lo], a repeat, dropped from the list in place).
  // Four tallies, taken in turn, so that runs of rows from the same step do not each wait
  // for the last increment of one counter.
  const size_t TW = window_.size() + 2;
  std::vector<int64_t>& tally = tally_;
  tally.assign(4 * TW, 0);
  const int64_t R = int64_t(row_.size());
  size_t j = 0, miss = 0;
  for (size_t k = 0; k < n; ++k) {
    const int32_t r = rows[k];
    NCF_CHECK(uint64_t(r) < uint64_t(R), "row cache: step ", s, " row[", k, "]=", r,
              " outside [0, ", R, ")");
    if (k + kAheadPass < n && uint64_t(rows[k + kAheadPass]) < uint64_t(R))
      __builtin_prefetch(&row_[size_t(rows[k + kAheadPass])]);
    RowState& x = row_[size_t(r)];
    const int32_t a = x.last_ann;
    const size_t first = a != s32;  // 1 where r is not a repeat within the step
    ++tally[(k & 3) * TW + (a >= lo ? size_t(a - lo) + 1 : 0)];
    rows[j] = r;  // j <= k: a place already read
    st.prev[j] = a;
    j += first;
    st.missing[miss] = r;
    miss += first & size_t(x.slot < 0);
    x.last_ann = s32;
  }
  rows.resize(j);
  st.prev.resize(j);
  st.missing.resize(miss);
  for (size_t q = 1; q < 4; ++q)
    for (size_t w = 0; w < TW; ++w) tally[w] += tally[q * TW + w];
  window_rows_ += tally[0];
  for (size_t w = 0; w < window_.size(); ++w) window_[w].last_of -= tally[w + 1];
  st.last_of = int64_t(j);
  st.rows = std::move(rows);
  window_.push_back(std::move(st));
  note_window_size();
  load_pending(m);
}

std::vector<int32_t> RowCache::spare_rows() {
  for (Step& st : spare_)
    if (st.rows.capacity() > 0) {
      std::vector<int32_t> v = std::move(st.rows);  // emptied by recycle()
      st.rows = {};
      return v;
    }
  return {};
}

void RowCache::recycle(Step&& st) {
  if (spare_.size() >= 4) return;  // enough for the steps a window turns over
  st.rows.clear();
  st.prev.clear();
  st.missing.clear();
  st.by_row.clear();
  st.last_of = 0;
  st.begun = false;
  spare_.push_back(std::move(st));
}

int64_t RowCache::index_in(const Step& st, int32_t row) {
  if (st.by_row.size() != st.rows.size()) {  // made at the first question
    st.by_row.resize(st.rows.size());
    for (size_t k = 0; k < st.rows.size(); ++k) st.by_row[k] = {st.rows[k], int32_t(k)};
    std::sort(st.by_row.begin(), st.by_row.end());
  }
  const auto at = std::lower_bound(st.by_row.begin(), st.by_row.end(),
                                   std::pair<int32_t, int32_t>{row, INT32_MIN});
  return at != st.by_row.end() && at->first == row ? at->second : -1;
}

int64_t RowCache::last_use(int32_t row) const {
  int64_t a = row_[size_t(row)].last_ann;
  if (window_.empty()) return a;
  const int64_t lo = window_.front().s;
  while (a >= lo) {  // announced by a step of the window: the announcement before it
    const Step& st = window_[size_t(a - lo)];
    a = st.prev[size_t(index_in(st, row))];
  }
  return a;
}

void RowCache::place(int32_t row, int32_t slot, Moves* m) {
  row_[size_t(row)].slot = slot;
  row_of_[size_t(slot)] = row;
  ++resident_;
  m->load_rows.push_back(row);
  m->load_slots.push_back(slot);
  ++counters_.loads;
}

void RowCache::evict(int32_t row, int32_t slot, Moves* m) {
  m->evict_slots.push_back(slot);
  m->evict_rows.push_back(row);
  row_[size_t(row)].slot = -1;
  row_of_[size_t(slot)] = -1;
  --resident_;
  ++counters_.evictions;
}

int32_t RowCache::take_slot(int32_t row, Moves* m) {
  // A slot is free until its first row (an evicted row's slot is taken at once): the
  // row's own slot where it is free; else the lowest free one (free_ keeps the slots
  // taken as own slots until they come up).
  if (row < int32_t(row_of_.size()) && row_of_[size_t(row)] < 0) return row;
  while (!free_.empty()) {
    const int32_t slot = free_.back();
    free_.pop_back();
    if (row_of_[size_t(slot)] < 0) return slot;
  }
  if (!lru_live_) rebuild_lru();  // a forgotten window left it out of date
  while (lru_head_ < lru_.size()) {
    // The list's rows are far apart in row_: each is fetched 2 x kAhead pops before its
    // turn, and kAhead pops before it, by then at hand, its slot's entry, which an
    // eviction writes.
    if (lru_head_ + 2 * kAhead < lru_.size())
      __builtin_prefetch(&row_[size_t(lru_[lru_head_ + 2 * kAhead].first)]);
    if (lru_head_ + kAhead < lru_.size()) {
      const int32_t near = row_[size_t(lru_[lru_head_ + kAhead].first)].slot;
      if (near >= 0) __builtin_prefetch(&row_of_[size_t(near)]);
    }
    const auto [victim, step] = lru_[lru_head_++];
    if (!evictable(victim, step)) continue;  // stale: back in the window, or already gone
    const int32_t slot = row_[size_t(victim)].slot;
    evict(victim, slot, m);
    return slot;
  }
  return -1;
}

void RowCache::load_pending(Moves* m) {
  for (Step& st : window_) {
    size_t k = 0;
    for (; k < st.missing.size(); ++k) {
      if (k + kAhead < st.missing.size()) {
        // The row's state, and its own slot's entry, which take_slot reads first.
        const int32_t ahead = st.missing[k + kAhead];
        __builtin_prefetch(&row_[size_t(ahead)]);
        if (ahead < int32_t(row_of_.size())) __builtin_prefetch(&row_of_[size_t(ahead)]);
      }
      const int32_t r = st.missing[k];
      if (row_[size_t(r)].slot >= 0) continue;  // loaded for an earlier step meanwhile
      const int32_t slot = take_slot(r, m);
      if (slot < 0) break;
      place(r, slot, m);
    }
    st.missing.erase(st.missing.begin(), st.missing.begin() + std::ptrdiff_t(k));
    if (!st.missing.empty()) return;  // the steps load in order
  }
}

std::vector<int32_t> RowCache::forced_victims(const Step& cur) const {
  // The next use of each resident row of the later steps (not in cur): its first step.
  std::vector<std::pair<int32_t, int64_t>> next;  // (row, first later step)
  for (const Step& st : window_) {
    if (st.s <= cur.s) continue;
    for (int32_t r : st.rows)
      if (row_[size_t(r)].slot >= 0 && index_in(cur, r) < 0) next.emplace_back(r, st.s);
  }
  std::sort(next.begin(), next.end());  // by row, then step: the first entry is the next use
  // Farthest next use first, then least recently used, then the lowest row.
  std::vector<std::tuple<int64_t, int64_t, int32_t>> keys;
  for (size_t k = 0; k < next.size(); ++k) {
    if (k > 0 && next[k].first == next[k - 1].first) continue;
    const int32_t r = next[k].first;
    keys.emplace_back(-next[k].second, last_use(r), r);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<int32_t> order;
  order.reserve(keys.size());
  for (const auto& key : keys) order.push_back(std::get<2>(key));
  return order;
}

void RowCache::begin(int64_t s, Moves* m) {
  NCF_CHECK(!window_.empty() && window_.front().s == s && !window_.front().begun,
            "row cache: step ", s, " begun out of order");
  ++counters_.steps;
  const int64_t loads_before = counters_.loads;
  load_pending(m);
  Step& cur = window_.front();
  counters_.most_step_rows = std::max(counters_.most_step_rows, int64_t(cur.rows.size()));
  NCF_REQUIRE(int64_t(cur.rows.size()) <= slots(), "flag --device_table_budget: the cache holds ",
              slots(), " rows of this rank's tables, but step ", s, " alone touches ",
              cur.rows.size(), ": raise the budget or lower --batch_size");
  std::vector<int32_t> still;
  for (int32_t r : cur.missing)
    if (row_[size_t(r)].slot < 0) still.push_back(r);
  cur.missing.clear();
  // The forced evictions' order, made once: evicting one changes no other's key, and the
  // rows placed meanwhile are step s's own, never candidates.
  std::vector<int32_t> victims;
  size_t next_victim = 0;
  bool ordered = false;
  for (int32_t r : still) {
    if (row_[size_t(r)].slot >= 0) continue;  // listed twice
    int32_t slot = take_slot(r, m);
    if (slot < 0) {
      if (!ordered) {
        victims = forced_victims(cur);
        ordered = true;
      }
      NCF_CHECK(next_victim < victims.size(), "row cache: no slot for row ", r, " of step ", s);
      const int32_t victim = victims[next_victim++];
      slot = row_[size_t(victim)].slot;
      evict(victim, slot, m);
      ++counters_.evicted_in_window;
    }
    place(r, slot, m);
  }
  // The later steps that need an evicted row load it again, after their other missing rows,
  // in the order of the evictions.
  if (next_victim > 0) {
    for (Step& st : window_) {
      if (st.s <= s) continue;
      for (size_t v = 0; v < next_victim; ++v)
        if (index_in(st, victims[v]) >= 0) st.missing.push_back(victims[v]);
    }
  }
  cur.begun = true;
  if (counters_.loads > loads_before) {
    ++counters_.waits;
    counters_.waited_loads += counters_.loads - loads_before;
  }
}

// Every set bit of b[words] as its index (64 w + bit), ascending, into out; the words
// zeroed. Returns the end. Writes up to 2 places past it (out needs that room): a word's
// first two bits are written whether it has them or not, so that the mostly empty or
// single-bit words of a sparse set cost no mispredicted branch.
static int32_t* drain_bits(uint64_t* b, int64_t words, int32_t* out) {
  constexpr uint64_t kTop = uint64_t{1} << 63;  // makes ctz of an empty word defined (63)
  for (int64_t w = 0; w < words; ++w) {
    const uint64_t x0 = b[w];
    b[w] = 0;
    const int32_t base = int32_t(w * 64);
    const uint64_t x1 = x0 & (x0 - 1), x2 = x1 & (x1 - 1);
    out[0] = base + __builtin_ctzll(x0 | kTop);
    out[1] = base + __builtin_ctzll(x1 | kTop);
    out += int(x0 != 0) + int(x1 != 0);
    for (uint64_t x = x2; x != 0; x &= x - 1) *out++ = base + __builtin_ctzll(x);
  }
  return out;
}

void RowCache::leaving_rows(const Step& st, std::vector<int32_t>* leaving) {
  const std::vector<int32_t>& rows = st.rows;
  const int32_t s = int32_t(st.s);
  const int64_t words = (int64_t(row_.size()) + 63) / 64;
  if (words > 8 * int64_t(rows.size())) {
    // Few rows beside the table: each row's own state says whether a later step took it.
    leaving->resize(rows.size());
    size_t n = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
      const int32_t r = rows[k];
      if (k + kAheadPass < rows.size()) __builtin_prefetch(&row_[size_t(rows[k + kAheadPass])]);
      (*leaving)[n] = r;
      n += size_t(row_[size_t(r)].last_ann == s);
    }
    leaving->resize(n);
    sort_distinct(leaving, int64_t(row_.size()), &bits_);
    return;
  }
  // Else without reading the rows' state (at random among all rows): a row of step s stays
  // in the window exactly where a later announced step touches it, and all of those are in
  // the window (s is its oldest). So s's rows less theirs, in a bit set scanned in order
  // (ascending). Of a later step's rows only those whose previous step is s need clearing:
  // any other row of s it touches, a step between touched first.
  if (int64_t(bits_.size()) < words) bits_.assign(size_t(words), 0);
  uint64_t* b = bits_.data();
  for (int32_t r : rows) b[size_t(r) >> 6] |= uint64_t{1} << (r & 63);
  std::vector<int32_t>& taken = taken_;
  for (size_t w = 1; w < window_.size(); ++w) {
    const Step& later = window_[w];
    // Their places first (a branch-free pass), then their bits cleared.
    taken.resize(later.rows.size());
    size_t n = 0;
    for (size_t j = 0; j < later.rows.size(); ++j) {
      taken[n] = later.rows[j];
      n += size_t(later.prev[j] == s);
    }
    for (size_t j = 0; j < n; ++j) b[size_t(taken[j]) >> 6] &= ~(uint64_t{1} << (taken[j] & 63));
  }
  leaving->resize(rows.size() + 2);
  leaving->resize(size_t(drain_bits(b, words, leaving->data()) - leaving->data()));
}

void RowCache::retire(int64_t s) {
  NCF_CHECK(!window_.empty() && window_.front().s == s && window_.front().begun, "row cache: step ",
            s, " retired before it ran");
  const Step& st = window_.front();
  // The rows whose last announced step is s leave the window.
  window_rows_ -= st.last_of;
  if (!mirrors()) {
    // They join the least recently used end, the lowest row first. Kept from the first
    // step, whether or not a slot was needed yet: built at once when the cache first
    // filled, the list of a large cache's millions of resident rows stalled that step.
    if (!lru_live_) rebuild_lru();  // after forget_window
    leaving_rows(st, &leaving_);
    if (lru_.size() + leaving_.size() > lru_.capacity()) drop_taken_lru();
    const size_t at = lru_.size();
    lru_.resize(at + leaving_.size());
    for (size_t k = 0; k < leaving_.size(); ++k) lru_[at + k] = {leaving_[k], int32_t(s)};
  }
  retired_ = s;
  recycle(std::move(window_.front()));
  window_.pop_front();
  // Stale entries (rows back in the window, or gone) are dropped once they outnumber the
  // slots, so the list stays within a few times the cache whatever the run's length. Each
  // entry's row is read at random: fetched a pass's distance ahead, the entries kept moved
  // to the front in place without a branch. Else the entries already taken from the front
  // are dropped once they outnumber the rest.
  const size_t n = lru_.size();
  if (n - lru_head_ > 2 * row_of_.size() + 4096) {
    size_t kept = 0;
    for (size_t k = lru_head_; k < n; ++k) {
      if (k + kAheadPass < n) __builtin_prefetch(&row_[size_t(lru_[k + kAheadPass].first)]);
      const std::pair<int32_t, int32_t> e = lru_[k];
      lru_[kept] = e;
      kept += size_t(evictable(e.first, e.second));
    }
    lru_.resize(kept);
    lru_head_ = 0;
  } else if (lru_head_ > 4096 && lru_head_ >= n - lru_head_) {
    drop_taken_lru();
  }
}

void RowCache::drop_taken_lru() {
  lru_.erase(lru_.begin(), lru_.begin() + std::ptrdiff_t(lru_head_));
  lru_head_ = 0;
}

void RowCache::forget_window() {
  if (window_.empty()) return;
  // Each forgotten announcement undone, the newest first: every row's last announced step
  // is again one that ran (or -1).
  for (auto st = window_.rbegin(); st != window_.rend(); ++st)
    for (size_t k = 0; k < st->rows.size(); ++k) row_[size_t(st->rows[k])].last_ann = st->prev[k];
  window_.clear();
  window_rows_ = 0;
  next_s_ = -1;
  lru_.clear();
  lru_head_ = 0;
  lru_live_ = false;  // rebuilt at the next retire, or when a slot is needed first
}

void RowCache::rebuild_lru() {
  // Every resident row outside the window, by (last use, row): the order retire() keeps.
  // Outside the window a row's last announced step is its last use. Only after a forgotten
  // window (a stopped run): retire() keeps the list from the first step.
  const int64_t lo = window_.empty() ? INT64_MAX : window_.front().s;
  std::vector<std::pair<int32_t, int32_t>> order;  // (last use, row)
  for (size_t slot = 0; slot < row_of_.size(); ++slot) {
    const int32_t r = row_of_[slot];
    if (r >= 0 && row_[size_t(r)].last_ann < lo) order.emplace_back(row_[size_t(r)].last_ann, r);
  }
  std::sort(order.begin(), order.end());
  lru_.clear();
  lru_head_ = 0;
  for (const auto& [last, r] : order) lru_.emplace_back(r, last);
  lru_live_ = true;
}

void RowCache::drop_all() {
  NCF_CHECK(window_.empty(), "row cache: dropped with ", window_.size(), " steps announced");
  for (RowState& x : row_) x.slot = -1;
  std::fill(row_of_.begin(), row_of_.end(), -1);
  const int64_t C = slots();
  free_.resize(size_t(C));
  for (int64_t k = 0; k < C; ++k) free_[size_t(k)] = int32_t(C - 1 - k);
  lru_.clear();
  lru_head_ = 0;
  lru_live_ = true;  // exact: nothing is resident
  resident_ = 0;
  next_s_ = -1;
}

void RowCache::resident(std::vector<int32_t>* rows, std::vector<int32_t>* slots) const {
  rows->clear();
  slots->clear();
  for (size_t r = 0; r < row_.size(); ++r)
    if (row_[r].slot >= 0) {
      rows->push_back(int32_t(r));
      slots->push_back(row_[r].slot);
    }
}

void sort_distinct(std::vector<int32_t>* v, int64_t bound, std::vector<uint64_t>* bits) {
  const int64_t words = (bound + 63) / 64;
  if (words > 8 * int64_t(v->size())) {
    std::sort(v->begin(), v->end());
    return;
  }
  if (int64_t(bits->size()) < words) bits->assign(size_t(words), 0);
  uint64_t* b = bits->data();
  for (int32_t x : *v) b[size_t(x) >> 6] |= uint64_t{1} << (x & 63);
  const size_t n = v->size();
  v->resize(n + 2);
  drain_bits(b, words, v->data());
  v->resize(n);
}

// v[0, n) (values in [base, base + bound)) without repeats, each at its first place, in
// order, through a bit set over the bound; the scratch all zero again. Returns the new
// length.
static int64_t keep_first_listings(int32_t* v, int64_t n, int64_t base, int64_t bound,
                                   std::vector<uint64_t>* bits) {
  const int64_t words = (bound + 63) / 64;
  if (int64_t(bits->size()) < words) bits->assign(size_t(words), 0);
  uint64_t* b = bits->data();
  int64_t j = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int32_t r = v[k];
    const uint64_t i = uint64_t(int64_t(r) - base);
    NCF_CHECK(i < uint64_t(bound), "row cache: row ", r, " outside [", base, ", ", base + bound,
              ")");
    const uint64_t bit = uint64_t{1} << (i & 63);
    uint64_t& word = b[i >> 6];
    v[j] = r;  // j <= k: a place already read
    j += (word & bit) == 0;
    word |= bit;
  }
  for (int64_t k = 0; k < j; ++k) b[uint64_t(int64_t(v[k]) - base) >> 6] = 0;
  return j;
}

void unique_in_order(std::vector<int32_t>* v, int64_t bound, std::vector<uint64_t>* bits) {
  if ((bound + 63) / 64 > 8 * int64_t(v->size())) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
    return;
  }
  v->resize(size_t(keep_first_listings(v->data(), int64_t(v->size()), 0, bound, bits)));
}

int64_t drop_repeats_where_dense(int32_t* v, int64_t n, int64_t base, int64_t rows,
                                 std::vector<uint64_t>* bits) {
  if (rows <= 0 || 4 * n < rows) return n;
  return keep_first_listings(v, n, base, rows, bits);
}

}  // namespace ncf
