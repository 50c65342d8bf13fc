// The host tier's residency plan (--device_table_budget, docs/distributed.md): which of a
// rank's flat rows sit in which of C cache slots on the device, decided from the rows
// every step will touch, which the trainer announces k steps ahead (exact lookahead).
// Pure host bookkeeping, no device and no clock: the cache's contents after any sequence
// of calls are a function of the announced rows and C only.
//
// The rules:
// - A row is "in the window" while some announced step that has not retired touches it:
//   while the last announced step that touched it has not retired. Each row keeps that
//   step's number only; a retiring step's rows that leave the window are its rows less
//   those of the later announced steps.
// - announce(s) loads the rows of step s that are not resident, in the order the step
//   lists them (each row at its first listing), into free slots (a row's own slot, the
//   one of its number, where that is free; else the lowest free one), then into the slots
//   of evictable rows: resident rows outside the window, least recently used first (the
//   step that last touched them), then the lowest row. Where step s's rows do not all fit
//   now, what is left waits, and no later step loads anything before it (the steps load
//   in order).
// - begin(s), before step s runs, loads what is still missing of step s's rows, first as
//   announce does and then, only where the budget does not hold the window, by evicting
//   rows of later steps: the row whose next use is farthest, then the least recently
//   used, then the lowest row. Those later steps load them again, after their other
//   missing rows. A step that had to load anything in begin() counts as a wait; each
//   such eviction counts as one evicted inside its window (0 whenever the budget holds
//   every window's rows).
// - retire(s) after step s ran: its rows leave the window where no later announced step
//   needs them; they stay resident until evicted.
// The loads and evictions of a call come back as Moves for the caller to carry out, the
// write-backs first (a slot's old row goes home before the new one arrives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace ncf {

class RowCache {
 public:
  // rows: the rank's flat rows (ids in [0, rows)); slots: the cache's capacity.
  RowCache(int64_t rows, int64_t slots);

  struct Moves {
    std::vector<int32_t> evict_slots, evict_rows;  // write slot -> home row, first
    std::vector<int32_t> load_rows, load_slots;    // then home row -> slot
    bool empty() const { return evict_slots.empty() && load_rows.empty(); }
    void clear();
  };
  struct Counters {
    int64_t steps = 0;              // steps begun
    int64_t waits = 0;              // steps that had to load rows in begin()
    int64_t loads = 0;              // rows loaded (announce and begin)
    int64_t waited_loads = 0;       // of them, loaded in begin()
    int64_t evictions = 0;          // rows written back to make room
    int64_t evicted_in_window = 0;  // of them, rows a later announced step needed
    int64_t most_window_rows = 0;   // the largest number of distinct rows in the window
    int64_t most_step_rows = 0;     // the most rows one step touched: the smallest budget
    int64_t parallel_passes = 0;    // passes split over threads (set_threads)
  };

  // Splits the passes of the larger calls (announce, the loads of a step announced when no
  // earlier one had rows left to load, retire) over `threads` threads of the process's
  // pool (common/parallel.h), where there are at least `from` of them, the pass has at
  // least `grain` rows and the rank has at least `spread` times as many rows as the pass:
  // rows far apart, whose states miss the caches, which several cores wait for together
  // (a pass over rows packed close, as a step's over ml-20m's 165,237, stays on one core,
  // where threads would write the same cache lines). The rows are dealt to the threads by
  // blocks, each row's listings to one thread, read in order, and the choices of slots
  // stay on the caller: what the cache does is the same at every thread count. Split, a
  // step's rows are read in more passes than on one thread (announce and the loads about
  // 1.4 times the work, measured on one thread; retire less, from bits the split passes
  // keep per step), so they split from 4 threads on; tests and bench_row_cache lower these.
  void set_threads(int threads, int64_t grain = kParallelGrain, int from = kParallelFrom,
                   int64_t spread = kParallelSpread);
  static constexpr int64_t kParallelGrain = 32768;
  static constexpr int kParallelFrom = 4;
  static constexpr int64_t kParallelSpread = 16;

  // Step s touches `rows` (each in [0, rows), in any order, repeats allowed: a row counts at
  // its first listing); s is one past the last announced step (the first call, and the
  // first after forget_window or drop_all, may start at any step after the last retired
  // one). Appends what it loads to *m.
  void announce(int64_t s, std::vector<int32_t> rows, Moves* m);
  // An empty list whose memory a retired step held (or a new one), for the caller to fill
  // with a later step's rows: a step's lists are large, and fresh ones would fault their
  // pages in at every step.
  std::vector<int32_t> spare_rows();
  // Step s, the oldest announced and not retired, is about to run: every one of its rows
  // becomes resident (appended to *m). Fails, naming the sizes, where step s's own rows
  // outnumber the slots.
  void begin(int64_t s, Moves* m);
  // Step s (begun, the oldest not retired) has run.
  void retire(int64_t s);
  // Forgets every announced step that has not run (a stopped epoch); rows stay resident.
  void forget_window();
  // Nothing resident any more (after the home rows were replaced, e.g. by a checkpoint).
  void drop_all();

  int32_t slot_of(int32_t row) const { return row_[size_t(row)].slot; }
  // Every resident row and its slot, ascending by row (a flush writes them home).
  void resident(std::vector<int32_t>* rows, std::vector<int32_t>* slots) const;
  int64_t num_resident() const { return resident_; }
  // Whether the slots mirror the rows: as many slots as rows, so every row's own slot is
  // free when it first loads (no other row takes it) and a row's slot is its number,
  // without looking it up.
  bool mirrors() const { return slots() >= int64_t(row_.size()); }
  int64_t slots() const { return int64_t(row_of_.size()); }
  int64_t window_steps() const { return int64_t(window_.size()); }
  int64_t window_rows() const { return window_rows_; }  // distinct rows the window touches
  bool announced(int64_t s) const;
  // The last step s such that every row of every announced step up to s is resident (the
  // step before the oldest one still missing rows; the last announced one where none is).
  int64_t loaded_through() const;
  const Counters& counters() const { return counters_; }

 private:
  struct Step {
    int64_t s = 0;
    std::vector<int32_t> rows;     // distinct, in the order listed
    std::vector<int32_t> prev;     // [rows]: each row's last announced step before s, or -1
    std::vector<int32_t> missing;  // to load, in order (may hold rows since loaded, repeats)
    int64_t last_of = 0;           // rows whose last announced step is s
    bool begun = false;
    // missing holds distinct rows that no other step will load before this one: announced
    // when no earlier step had rows to load, and nothing appended since.
    bool fresh = false;
    // Where its pass was split and the cache evicts: the rows whose last announced step is
    // this one (the rows that leave the window when it retires), a bit each, kept by the
    // later steps' split passes; stale where a later pass ran on one thread (then zeroed
    // before reuse). All zero whenever neither flag is set.
    std::vector<uint64_t> last_bits;
    bool bits_live = false, bits_stale = false;
    // (row, its index in rows), ascending: made only when asked (forced evictions).
    mutable std::vector<std::pair<int32_t, int32_t>> by_row;
  };
  // Where `row` is in st.rows, or -1.
  static int64_t index_in(const Step& st, int32_t row);
  // Loads the missing rows of the window's steps in order into free or evictable slots;
  // stops at the first step that cannot be completed.
  void load_pending(Moves* m);
  // load_pending for a fresh step (the first with rows to load) in three passes: whether
  // its rows' own slots are free and which entries of the list of evictable rows still
  // stand, read by all threads; the slots chosen in order on the caller, from those reads
  // and sequential arrays only; the new states written by all threads. The same choices as
  // take_slot() makes one row at a time.
  void load_fresh_parallel(Step& st, Moves* m);
  // announce()'s pass over the rows on all threads (see announce()); returns the rows kept
  // and the missing ones' count through st, the tally into tally_.
  void announce_pass_parallel(int32_t s32, int64_t lo, std::vector<int32_t>* rows, Step* st);
  // The rows' thread: blocks of 512 rows dealt out by a multiplicative hash (each row's
  // listings on one thread; neighbouring rows, which share cache lines, on the same one;
  // no division, which would cost more than the row's own work).
  static int bucket_of(int32_t r, int buckets) {
    const uint32_t h = (uint32_t(r) >> 9) * 0x9E3779B1u;
    return int((uint64_t(h) * uint64_t(buckets)) >> 32);
  }
  bool parallel(int64_t n) const {
    return threads_ >= from_ && n >= grain_ && int64_t(row_.size()) >= spread_ * n;
  }
  // A slot for `row`: a free one or an evictable row's (written back into *m); -1 if none.
  int32_t take_slot(int32_t row, Moves* m);
  // Whether lru_'s entry (row, step) still stands for an evictable row: its last announced
  // step is still `step`, which retired (so the row is outside the window), and it is
  // resident.
  bool evictable(int32_t row, int32_t step) const {
    const RowState& x = row_[size_t(row)];
    return x.last_ann == step && x.slot >= 0;
  }
  // The last step that retired with `row`, or -1: its last announced step, or, while that
  // one is in the window, the announcements before it (each step keeps them).
  int64_t last_use(int32_t row) const;
  void place(int32_t row, int32_t slot, Moves* m);
  void evict(int32_t row, int32_t slot, Moves* m);  // row_of_[slot] is row
  // begin()'s last resort: the resident rows of later steps outside step `cur`, the one
  // whose next use is farthest first (then the least recently used, then the lowest row).
  std::vector<int32_t> forced_victims(const Step& cur) const;
  // The rows of st (the window's oldest step) that leave the window when it retires (no
  // later announced step touches them), ascending.
  void leaving_rows(const Step& st, std::vector<int32_t>* leaving);
  // The rows of st's bit set (bits_live), ascending, on all threads; the set left zero.
  void drain_last_bits(Step& st, std::vector<int32_t>* leaving);
  void note_window_size();
  // lru_ from scratch, from every resident row outside the window; lru_live_ from then on.
  void rebuild_lru();
  void drop_taken_lru();  // the entries before lru_head_ gone
  // A retired step kept in spare_ (its lists emptied, their memory kept), up to a few.
  void recycle(Step&& st);

  // What the cache knows of one row, in one place: a step's rows are read and written
  // together, at random rows.
  struct RowState {
    int32_t last_ann = -1;  // the last announced step touching the row (forgotten ones undone)
    int32_t slot = -1;      // its slot, or -1
  };
  std::vector<RowState> row_;    // [rows]
  std::vector<int32_t> row_of_;  // [slots] row or -1
  std::vector<int32_t> free_;    // free slots, the lowest at the back (taken ones skipped)
  // Evictable rows (outside the window, resident) as (row, last use), in that order of
  // (last use, row); stale entries skipped. Kept by retire() from the start, except where
  // the slots mirror the rows (nothing is ever evicted); rebuilt after forget_window
  // (lru_live_ false until then).
  // Taken from lru_head_ on, appended at the back: one array, its memory kept.
  std::vector<std::pair<int32_t, int32_t>> lru_;
  size_t lru_head_ = 0;
  bool lru_live_ = true;
  std::deque<Step> window_;
  std::vector<Step> spare_;  // retired steps, emptied, their memory kept for the next ones
  // Scratch: announce()'s tally [window steps + 2], retire()'s rows leaving the window and
  // the rows later steps took from it, and a bit set over the rows (all zero between calls).
  std::vector<int64_t> tally_;
  std::vector<int32_t> leaving_, taken_;
  std::vector<uint64_t> bits_;
  // The split passes' scratch: a step's places grouped by bucket and back, their results,
  // per-chunk counts, the kept rows of a step, the loads' own-slot reads (flag_), the
  // standing entries of the evictable list read ahead, and the slots a pass took.
  int threads_ = 1, from_ = kParallelFrom;
  int64_t grain_ = kParallelGrain, spread_ = kParallelSpread;
  std::vector<int32_t> order_, inv_, prev_out_, rows_out_;
  std::vector<uint8_t> flag_;
  std::vector<int64_t> counts_;
  std::vector<int32_t> victim_slot_, taken_slots_;
  std::vector<int64_t> victim_entry_;
  std::vector<uint64_t> taken_bits_;
  int64_t next_s_ = -1;   // the next step announce() accepts (-1: any above retired_)
  int64_t retired_ = -1;  // the last step retired: no step is numbered at or below it again
  int64_t resident_ = 0;
  int64_t window_rows_ = 0;  // distinct rows in the window
  Counters counters_;
};

// v (distinct values in [0, bound)) sorted ascending: a bit set scanned once where the
// bound is small beside v, else a sort. bits: scratch, all zero before and after.
void sort_distinct(std::vector<int32_t>* v, int64_t bound, std::vector<uint64_t>* bits);
// v (values in [0, bound)) without repeats: each value at its first place, in order, by a
// bit set where the bound is small beside v; else (a bit set would be mostly empty)
// sorted ascending. Either way a function of v and bound only. bits: as above.
void unique_in_order(std::vector<int32_t>* v, int64_t bound, std::vector<uint64_t>* bits);
// One table's part of a step's list for RowCache::announce, v[0, n) (values in
// [base, base + rows)), without its repeats where they abound: where the table has at
// most 4 n rows (an item table, whose rows a step touches many times over), each at its
// first place, in order, through a bit set over the table's rows (at most an eighth of
// the list's bytes, so it stays in the core's caches); else (a user table of many more
// rows than a step lists) left as it is. The cache keeps each row at its first listing,
// so what it does is the same either way: this only spares it a pass over the repeats'
// states, at random among all rows. Returns the new length. bits: as above.
int64_t drop_repeats_where_dense(int32_t* v, int64_t n, int64_t base, int64_t rows,
                                 std::vector<uint64_t>* bits);

}  // namespace ncf
