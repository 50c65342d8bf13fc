// The host tier's residency plan: see row_cache.h.
#include "embedding/row_cache.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "common/check.h"
#include "common/parallel.h"

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

void RowCache::set_threads(int threads, int64_t grain, int from, int64_t spread) {
  NCF_CHECK(threads >= 1 && grain >= 1 && from >= 1 && spread >= 0, "row cache: ", threads,
            " threads, grain ", grain, ", from ", from, ", spread ", spread);
  threads_ = threads;
  grain_ = grain;
  from_ = from;
  spread_ = spread;
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
  // Fresh (see Step) where no earlier step of the window has rows left to load.
  st.fresh = true;
  for (const Step& e : window_) st.fresh = st.fresh && e.missing.empty();
  st.prev.resize(n);
  st.missing.resize(n);
  const size_t TW = window_.size() + 2;
  std::vector<int64_t>& tally = tally_;
  size_t j = 0, miss = 0;
  // A step whose pass is split keeps, where the cache evicts, the bit set of the rows whose
  // last announced step it is; a later step's pass on one thread does not keep it up to
  // date, so such a pass marks the earlier steps' sets stale (retire then finds the rows
  // leaving the window as it does without one).
  const bool split = parallel(int64_t(n));
  st.bits_live = split && !mirrors();
  if (st.bits_live) {
    const size_t words = (row_.size() + 63) / 64;
    if (st.last_bits.size() != words) st.last_bits.assign(words, 0);
  } else {
    for (Step& e : window_)
      if (e.bits_live) {
        e.bits_live = false;
        e.bits_stale = true;
      }
  }
  if (split) {
    announce_pass_parallel(s32, lo, &rows, &st);
    j = rows.size();
    miss = st.missing.size();
  } else {
    // One pass, without a branch on the data: each row's state says whether it enters the
    // window (tally[0]), passes from an earlier step a of the window to s (tally[1 + a - lo]:
    // a's count of rows it is the last to touch drops), or was listed before in this step
    // (last announced step s: tally[1 + s - lo], a repeat, dropped from the list in place).
    // Four tallies, taken in turn, so that runs of rows from the same step do not each wait
    // for the last increment of one counter.
    tally.assign(4 * TW, 0);
    const int64_t R = int64_t(row_.size());
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
  }
  window_rows_ += tally[0];
  for (size_t w = 0; w < window_.size(); ++w) window_[w].last_of -= tally[w + 1];
  st.last_of = int64_t(j);
  st.rows = std::move(rows);
  window_.push_back(std::move(st));
  note_window_size();
  load_pending(m);
}

void RowCache::announce_pass_parallel(int32_t s32, int64_t lo, std::vector<int32_t>* rows_in,
                                      Step* st) {
  ++counters_.parallel_passes;
  // The hot loops read and write through local pointers and bounds: a byte written through
  // a member vector may alias anything, and the compiler would reload them at every row.
  std::vector<int32_t>& rows = *rows_in;
  const int64_t n = int64_t(rows.size()), R = int64_t(row_.size());
  const int B = threads_;  // buckets of rows, and chunks of the list
  const size_t TW = window_.size() + 2;
  std::vector<int64_t> bound(size_t(B) + 1);  // chunk c of the list: [bound[c], bound[c + 1])
  for (int c = 0; c <= B; ++c) bound[size_t(c)] = n * c / B;
  const int32_t* in = rows.data();
  RowState* state = row_.data();
  // 1. Each chunk of the list counts its rows per bucket (and finds any row out of range).
  std::vector<int64_t>& counts = counts_;
  counts.assign(size_t(B) * size_t(B) + size_t(B), 0);
  int64_t* bad = counts.data() + size_t(B) * size_t(B);  // [chunk]: its first bad place + 1
  parallel_for(threads_, B, 1, [&](int64_t c0, int64_t c1) {
    std::vector<int64_t> mine(static_cast<size_t>(B));
    for (int64_t c = c0; c < c1; ++c) {
      std::fill(mine.begin(), mine.end(), 0);
      int64_t* m = mine.data();
      const int64_t k0 = bound[size_t(c)], k1 = bound[size_t(c) + 1];
      int64_t out_of_range = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const int32_t r = in[k];
        out_of_range |= int64_t(uint64_t(r) >= uint64_t(R));
        ++m[bucket_of(r, B)];
      }
      if (out_of_range)
        for (int64_t k = k0; k < k1 && bad[c] == 0; ++k)
          if (uint64_t(in[k]) >= uint64_t(R)) bad[c] = k + 1;
      std::copy(mine.begin(), mine.end(), counts.begin() + std::ptrdiff_t(c * B));
    }
  });
  for (int c = 0; c < B; ++c) {
    const int64_t k = bad[c] - 1;
    NCF_CHECK(k < 0, "row cache: step ", s32, " row[", k,
              "]=", rows[size_t(std::max<int64_t>(k, 0))], " outside [0, ", R, ")");
  }
  // 2. The places grouped by bucket, ascending within each: bucket b's run starts at
  // start[b]; chunk c writes its places of bucket b from counts[c][b] on.
  std::vector<int64_t> start(size_t(B) + 1, 0);
  {
    int64_t at = 0;
    for (int b = 0; b < B; ++b) {
      start[size_t(b)] = at;
      for (int c = 0; c < B; ++c) {
        const int64_t k = counts[size_t(c * B + b)];
        counts[size_t(c * B + b)] = at;
        at += k;
      }
    }
    start[size_t(B)] = at;
  }
  order_.resize(size_t(n));
  inv_.resize(size_t(n));
  prev_out_.resize(size_t(n));
  flag_.resize(size_t(n));
  int32_t* order = order_.data();
  int32_t* inv = inv_.data();
  int32_t* prev = prev_out_.data();
  uint8_t* flag = flag_.data();
  parallel_for(threads_, B, 1, [&](int64_t c0, int64_t c1) {
    std::vector<int64_t> mine(static_cast<size_t>(B));
    for (int64_t c = c0; c < c1; ++c) {
      std::copy(counts.begin() + std::ptrdiff_t(c * B), counts.begin() + std::ptrdiff_t(c * B + B),
                mine.begin());
      int64_t* at = mine.data();
      const int64_t k1 = bound[size_t(c) + 1];
      for (int64_t k = bound[size_t(c)]; k < k1; ++k) {
        const int64_t i = at[bucket_of(in[k], B)]++;
        order[i] = int32_t(k);
        inv[k] = int32_t(i);
      }
    }
  });
  // 3. Each bucket's rows in the order listed, as the one-thread pass reads them: the
  // row's state, its tally, whether it is a first listing (bit 0) and missing (bit 1),
  // written in the bucket's order (each thread its own lines; inv finds them by place).
  std::vector<int64_t>& tally = tally_;
  tally.assign(size_t(B) * TW, 0);
  // The step's own bit set, and the window's steps' (null where not kept): a bucket's rows
  // are whole cache lines of each, so that each thread writes its own words only.
  uint64_t* own_bits = st->bits_live ? st->last_bits.data() : nullptr;
  std::vector<uint64_t*> prev_bits(window_.size(), nullptr);
  for (size_t w = 0; w < window_.size(); ++w)
    if (window_[w].bits_live) prev_bits[w] = window_[w].last_bits.data();
  // Each bucket also counts its first listings and missing rows per chunk of the list
  // (its places ascend, so the chunk only moves on): [bucket][chunk].
  std::vector<int64_t> kept_in(size_t(B) * size_t(B), 0), missed_in(size_t(B) * size_t(B), 0);
  parallel_for(threads_, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> local(TW);  // not the shared array: its lines would bounce
    std::vector<int64_t> local_kept(static_cast<size_t>(B)), local_missed(static_cast<size_t>(B));
    int64_t* t = local.data();
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(local.begin(), local.end(), 0);
      std::fill(local_kept.begin(), local_kept.end(), 0);
      std::fill(local_missed.begin(), local_missed.end(), 0);
      int64_t c = 0, c_end = bound[1];
      const int64_t e = start[size_t(b) + 1];
      for (int64_t i = start[size_t(b)]; i < e; ++i) {
        if (i + int64_t(kAheadPass) < e)
          __builtin_prefetch(&state[in[order[i + int64_t(kAheadPass)]]]);
        const int32_t k = order[i];
        const int32_t r = in[k];
        RowState& x = state[r];
        const int32_t a = x.last_ann;
        const int first = a != s32;
        ++t[a >= lo ? size_t(a - lo) + 1 : 0];
        if (own_bits) {
          // The row's last announced step is s now, no longer a (in the window, or not).
          const uint64_t bit = uint64_t{1} << (r & 63);
          own_bits[size_t(r) >> 6] |= bit;
          if (a >= lo && a != s32 && prev_bits[size_t(a - lo)])
            prev_bits[size_t(a - lo)][size_t(r) >> 6] &= ~bit;
        }
        const int missing = first & int(x.slot < 0);
        prev[i] = a;
        flag[i] = uint8_t(first | (missing << 1));
        x.last_ann = s32;
        while (k >= c_end) c_end = bound[size_t(++c) + 1];
        local_kept[size_t(c)] += first;
        local_missed[size_t(c)] += missing;
      }
      std::copy(local.begin(), local.end(), tally.begin() + std::ptrdiff_t(size_t(b) * TW));
      std::copy(local_kept.begin(), local_kept.end(), kept_in.begin() + std::ptrdiff_t(b * B));
      std::copy(local_missed.begin(), local_missed.end(),
                missed_in.begin() + std::ptrdiff_t(b * B));
    }
  });
  for (int b = 1; b < B; ++b)
    for (size_t w = 0; w < TW; ++w) tally[w] += tally[size_t(b) * TW + w];
  // 4. The first listings and the missing rows, in the order listed: each chunk writes
  // them from its offsets (without a branch, as the one-thread pass).
  std::vector<int64_t> kept(size_t(B) + 1, 0), missed(size_t(B) + 1, 0);
  for (int c = 0; c < B; ++c)
    for (int q = 0; q < B; ++q) {
      kept[size_t(c) + 1] += kept_in[size_t(q * B + c)];
      missed[size_t(c) + 1] += missed_in[size_t(q * B + c)];
    }
  for (int c = 0; c < B; ++c) {
    kept[size_t(c) + 1] += kept[size_t(c)];
    missed[size_t(c) + 1] += missed[size_t(c)];
  }
  // As long as the list it replaces: the two change places, and the list goes back to the
  // caller for a later step's rows (a shorter one would be reallocated, its pages faulted).
  rows_out_.reserve(size_t(n));
  rows_out_.resize(size_t(kept[size_t(B)]));
  st->prev.resize(size_t(kept[size_t(B)]));
  st->missing.resize(size_t(missed[size_t(B)]));
  int32_t* out_rows = rows_out_.data();
  int32_t* out_prev = st->prev.data();
  int32_t* out_miss = st->missing.data();
  parallel_for(threads_, B, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // Each place is written whether its row is kept or not, and taken only where it is
      // (the next row overwrites it otherwise); a chunk writes only its own places.
      int64_t j = kept[size_t(c)], q = missed[size_t(c)];
      const int64_t j_end = kept[size_t(c) + 1], q_end = missed[size_t(c) + 1];
      const int64_t k1 = bound[size_t(c) + 1];
      for (int64_t k = bound[size_t(c)]; k < k1 && (j < j_end || q < q_end); ++k) {
        const int32_t i = inv[k];
        const uint8_t f = flag[i];
        const int32_t r = in[k];
        if (j < j_end) {
          out_rows[j] = r;
          out_prev[j] = prev[i];
        }
        j += f & 1;
        if (q < q_end) out_miss[q] = r;
        q += f >> 1;
      }
    }
  });
  std::swap(rows, rows_out_);  // the list's old memory kept for the next step's
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
  if (st.bits_live || st.bits_stale) {
    // Drained by retire where live; else some bits may be left: all cleared.
    if (st.bits_stale) std::fill(st.last_bits.begin(), st.last_bits.end(), 0);
    st.bits_live = st.bits_stale = false;
  }
  st.last_of = 0;
  st.begun = false;
  st.fresh = false;
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
    if (st.missing.empty()) continue;
    if (st.fresh && parallel(int64_t(st.missing.size()))) {
      load_fresh_parallel(st, m);
      if (!st.missing.empty()) return;  // the steps load in order
      continue;
    }
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

void RowCache::load_fresh_parallel(Step& st, Moves* m) {
  ++counters_.parallel_passes;
  const int64_t n = int64_t(st.missing.size());
  const int32_t C = int32_t(row_of_.size());
  const int32_t* miss = st.missing.data();
  if (mirrors()) {
    // Each row loads into its own slot, which no other row takes: in order, nothing
    // evicted, only the states to write.
    m->load_rows.insert(m->load_rows.end(), miss, miss + n);
    m->load_slots.insert(m->load_slots.end(), miss, miss + n);
    parallel_for(threads_, n, grain_ / 4, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        if (k + int64_t(kAhead) < k1) {
          __builtin_prefetch(&row_[size_t(miss[k + int64_t(kAhead)])], 1);
          __builtin_prefetch(&row_of_[size_t(miss[k + int64_t(kAhead)])], 1);
        }
        row_[size_t(miss[k])].slot = miss[k];
        row_of_[size_t(miss[k])] = miss[k];
      }
    });
    resident_ += n;
    counters_.loads += n;
    st.missing.clear();
    return;
  }
  // 1. Whether each row's own slot is free before the pass (the pass writes no state until
  // its end). A slot free then stays free until this pass takes it (an evicted row's slot
  // goes at once to the row that evicted it), which taken_bits_ records. The rows
  // themselves are not resident: a fresh step's missing rows were not when it was
  // announced, and no step loads any of them before it.
  flag_.resize(size_t(n));
  parallel_for(threads_, n, grain_ / 4, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (k + int64_t(kAhead) < k1 && miss[k + int64_t(kAhead)] < C)
        __builtin_prefetch(&row_of_[size_t(miss[k + int64_t(kAhead)])]);
      const int32_t r = miss[k];
      flag_[size_t(k)] = r < C && row_of_[size_t(r)] < 0;
    }
  });
  if (int64_t(taken_bits_.size()) * 64 < int64_t(C)) taken_bits_.assign(size_t((C + 63) / 64), 0);
  uint64_t* taken = taken_bits_.data();
  const auto take = [&](int32_t slot) {
    taken[size_t(slot) >> 6] |= uint64_t{1} << (slot & 63);
    taken_slots_.push_back(slot);
  };
  const auto is_taken = [&](int32_t slot) { return (taken[size_t(slot) >> 6] >> (slot & 63)) & 1; };
  // 2. The choices, in order. The list of evictable rows is read in blocks by all
  // threads: the entries that still stand for an evictable row, their rows, slots and
  // places in the list. Whether an entry stands does not change within the pass: a row it
  // evicts is not evicted again (its entry is the one that names its last step), and the
  // rows it loads are in the window (their entries name a step that retired, not their
  // last).
  const size_t l0 = m->load_rows.size(), e0 = m->evict_rows.size();
  m->load_rows.resize(l0 + size_t(n));
  m->load_slots.resize(l0 + size_t(n));
  m->evict_rows.resize(e0 + size_t(n));
  m->evict_slots.resize(e0 + size_t(n));
  int32_t* out_lr = m->load_rows.data() + l0;
  int32_t* out_ls = m->load_slots.data() + l0;
  int32_t* out_er = m->evict_rows.data() + e0;
  int32_t* out_es = m->evict_slots.data() + e0;
  int64_t nl = 0, ne = 0;
  int64_t v = 0, nv = 0;       // the victims read: [v, nv) not yet taken
  size_t scanned = lru_head_;  // the list read up to here
  const auto read_victims = [&](int64_t want) {
    // Entries [scanned, scanned + want) of the list, in chunks: each chunk's victims in
    // order, then gathered in the list's order.
    const size_t from = scanned, to = std::min(lru_.size(), scanned + size_t(want));
    scanned = to;
    const int64_t len = int64_t(to - from);
    const int C = threads_;
    std::vector<int64_t> found(size_t(C) + 1, 0);
    victim_entry_.resize(size_t(len));
    victim_slot_.resize(size_t(len));
    int64_t* entry = victim_entry_.data();
    int32_t* vslot = victim_slot_.data();
    const std::pair<int32_t, int32_t>* list = lru_.data();
    const RowState* state = row_.data();
    parallel_for(threads_, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i0 = len * c / C, i1 = len * (c + 1) / C;
        int64_t j = i0;  // this chunk's victims first gather at its own start
        for (int64_t i = i0; i < i1; ++i) {
          if (i + int64_t(kAheadPass) < i1)
            __builtin_prefetch(&state[list[from + size_t(i) + kAheadPass].first]);
          const auto [victim, step] = list[from + size_t(i)];
          const RowState x = state[victim];
          entry[j] = int64_t(from) + i;
          vslot[j] = x.slot;
          j += x.last_ann == step && x.slot >= 0;  // evictable()
        }
        found[size_t(c) + 1] = j - i0;
      }
    });
    // The chunks' victims moved together, in order (each to at most its own start).
    int64_t at = 0;
    for (int c = 0; c < C; ++c) {
      const int64_t i0 = len * c / C;
      std::memmove(entry + at, entry + i0, size_t(found[size_t(c) + 1]) * sizeof(int64_t));
      std::memmove(vslot + at, vslot + i0, size_t(found[size_t(c) + 1]) * sizeof(int32_t));
      at += found[size_t(c) + 1];
    }
    v = 0;
    nv = at;
  };
  int64_t k = 0;
  for (; k < n; ++k) {
    const int32_t r = miss[k];
    int32_t slot = -1;
    if (flag_[size_t(k)] && !is_taken(r)) {
      slot = r;
      take(slot);
    }
    while (slot < 0 && !free_.empty()) {
      const int32_t free_slot = free_.back();
      free_.pop_back();
      if (row_of_[size_t(free_slot)] < 0 && !is_taken(free_slot)) {
        slot = free_slot;
        take(slot);
      }
    }
    if (slot < 0) {
      if (!lru_live_) {
        rebuild_lru();  // from the states before the pass: the same list (see rebuild_lru)
        scanned = lru_head_;
        v = nv = 0;
      }
      while (v == nv && scanned < lru_.size())
        read_victims(std::max<int64_t>(n - k + int64_t(kAheadPass), 4096));
      if (v == nv) {
        lru_head_ = lru_.size();  // every entry read, none left standing
        break;                    // no slot: the rest waits
      }
      slot = victim_slot_[size_t(v)];
      out_er[ne] = lru_[size_t(victim_entry_[size_t(v)])].first;
      out_es[ne] = slot;
      ++ne;
      lru_head_ = size_t(victim_entry_[size_t(v)]) + 1;
      ++v;
    }
    out_lr[nl] = r;
    out_ls[nl] = slot;
    ++nl;
  }
  m->load_rows.resize(l0 + size_t(nl));
  m->load_slots.resize(l0 + size_t(nl));
  m->evict_rows.resize(e0 + size_t(ne));
  m->evict_slots.resize(e0 + size_t(ne));
  for (int32_t slot : taken_slots_) taken[size_t(slot) >> 6] = 0;
  taken_slots_.clear();
  // 3. The new states: the evicted rows leave their slots, the loaded rows take theirs (each
  // slot an evicted row left is the one the next load takes; no row is both).
  const int32_t* lr = m->load_rows.data() + l0;
  const int32_t* ls = m->load_slots.data() + l0;
  const int32_t* er = m->evict_rows.data() + e0;
  parallel_for(threads_, nl + ne, grain_ / 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (i < nl) {
        if (i + int64_t(kAhead) < std::min(i1, nl)) {
          __builtin_prefetch(&row_[size_t(lr[i + int64_t(kAhead)])], 1);
          __builtin_prefetch(&row_of_[size_t(ls[i + int64_t(kAhead)])], 1);
        }
        row_[size_t(lr[i])].slot = ls[i];
        row_of_[size_t(ls[i])] = lr[i];
      } else {
        const int64_t j = i - nl;
        if (i + int64_t(kAhead) < i1) __builtin_prefetch(&row_[size_t(er[j + int64_t(kAhead)])], 1);
        row_[size_t(er[j])].slot = -1;
      }
    }
  });
  resident_ += nl - ne;
  counters_.loads += nl;
  counters_.evictions += ne;
  st.missing.erase(st.missing.begin(), st.missing.begin() + std::ptrdiff_t(k));
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
      st.fresh = false;
    }
  }
  cur.begun = true;
  if (counters_.loads > loads_before) {
    ++counters_.waits;
    counters_.waited_loads += counters_.loads - loads_before;
  }
}

// The set bits of word b[w] as their indices (64 w + bit), ascending, into out; the word
// zeroed. Returns the end. Writes up to 2 places past it (out needs that room): the word's
// first two bits are written whether it has them or not, so that the mostly empty or
// single-bit words of a sparse set cost no mispredicted branch.
static inline int32_t* drain_word(uint64_t* b, int64_t w, int32_t* out) {
  constexpr uint64_t kTop = uint64_t{1} << 63;  // makes ctz of an empty word defined (63)
  const uint64_t x0 = b[w];
  b[w] = 0;
  const int32_t base = int32_t(w * 64);
  const uint64_t x1 = x0 & (x0 - 1), x2 = x1 & (x1 - 1);
  out[0] = base + __builtin_ctzll(x0 | kTop);
  out[1] = base + __builtin_ctzll(x1 | kTop);
  out += int(x0 != 0) + int(x1 != 0);
  for (uint64_t x = x2; x != 0; x &= x - 1) *out++ = base + __builtin_ctzll(x);
  return out;
}

// Every set bit of b[words], as drain_word does, word by word. Returns the end; writes up
// to 2 places past it.
static int32_t* drain_bits(uint64_t* b, int64_t words, int32_t* out) {
  for (int64_t w = 0; w < words; ++w) out = drain_word(b, w, out);
  return out;
}

// The set bits of x, without the library call the baseline x86-64 build makes of
// __builtin_popcountll.
static inline int64_t bit_count(uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return int64_t((x * 0x0101010101010101ull) >> 56);
}

// Words [w0, w1) of b drained as drain_bits does, into out[0, end - out): exactly as many
// places as their bits. Without a branch on the data while 66 places or more are left (a
// word's bits and the two writes past them), the last words bit by bit.
static void drain_bits_within(uint64_t* b, int64_t w0, int64_t w1, int32_t* out, int32_t* end) {
  int64_t w = w0;
  for (; w < w1 && end - out >= 66; ++w) out = drain_word(b, w, out);
  for (; w < w1; ++w) {
    const int32_t base = int32_t(w * 64);
    for (uint64_t x = b[w]; x != 0; x &= x - 1) *out++ = base + __builtin_ctzll(x);
    b[w] = 0;
  }
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

void RowCache::drain_last_bits(Step& st, std::vector<int32_t>* leaving) {
  // Chunks of words, each counted, then drained from the count before it (ascending), the
  // words zeroed for the step's next use.
  ++counters_.parallel_passes;
  uint64_t* b = st.last_bits.data();
  const int64_t words = int64_t(st.last_bits.size());
  const int C = threads_;
  std::vector<int64_t> at(size_t(C) + 1, 0);
  const auto chunk = [&](int64_t c) { return words * c / C; };
  parallel_for(threads_, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t bits = 0;
      const int64_t w1 = chunk(c + 1);
      for (int64_t w = chunk(c); w < w1; ++w) bits += bit_count(b[w]);
      at[size_t(c) + 1] = bits;
    }
  });
  for (int c = 0; c < C; ++c) at[size_t(c) + 1] += at[size_t(c)];
  leaving->resize(size_t(at[size_t(C)]));
  int32_t* out = leaving->data();
  parallel_for(threads_, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      drain_bits_within(b, chunk(c), chunk(c + 1), out + at[size_t(c)], out + at[size_t(c) + 1]);
  });
  st.bits_live = false;  // drained: all zero
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
    if (st.bits_live)
      drain_last_bits(window_.front(), &leaving_);
    else
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
