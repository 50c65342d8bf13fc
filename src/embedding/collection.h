// Every embedding table of the model in one collection (docs/design.md,
// steps 3 and 6): one flat parameter buffer and one optimizer-state buffer per
// rank holding the rows the plan gives it (plan.h's key layout: routed tables
// first, then replicated ones), and one exchange per phase for all tables.
//
// Forward (lookup_start → lookup_gather → lookup_finish, each collective):
// every routed table's ids become keys in one array, optionally de-duplicated
// across the collection, bucketized by owner together; one counts exchange,
// one row exchange, one gather at the owners, one vector exchange back, then
// the rows go to batch order. Replicated tables are read locally.
// Backward (gradients_start → gradients_finish): the gradient rows take the
// reverse path in one exchange; the owner sorts what it received and applies
// the optimizer to each row as it reduces it (table_ops.h reduce_update_rows).
// A replicated table's dense gradient is written into the caller's allreduce
// buffer (the tower's), and update_replicated applies the reduced result.
// With W = 1 nothing is routed: the lookup is one gather from the flat
// buffer, the backward one fused update over it.
// Node-level de-duplication (set_node_dedup, on a two-hop communicator): the
// rank's unique keys go in owner order through hop 1 to the local rank that
// carries its node's traffic for their owners' local index; that rank takes the
// unique keys of everything it received (all of its node's ranks), asks each
// owner once over hop 2, and hands each source its rows back through hop 1.
// Backward, the gradients take the same way and the carrying rank sums those of
// a shared key in sort_reduce_rows' fixed order (its input is source rank by
// source rank) before they cross nodes.
// Payloads (set_exchange_dtype): FP32, or BF16 on the wire — the vectors and
// gradient rows of every routed table's all-to-all (both hops, node dedup
// included) are rounded to BF16 by the sender and widened by the receiver,
// the block a rank sends itself too; at W = 1 the rows and gradients of the
// tables a larger W would route are rounded in place, so W = 1 computes what a
// larger W does. Ids and counts, the owners' sums and every update stay FP32.
// Rows (plan.table_elem_bytes 2, --table_dtype bf16) may be stored as BF16:
// lookups widen them to FP32, the optimizers update them in FP32 (state stays
// FP32) and write them back with stochastic rounding keyed by (seed, step,
// table, global row, column) (table_ops.h RowRounding), so the result does not
// depend on W, threads or device; checkpoints hold them widened to FP32.
// Initial values depend on the table and global row only, so every W starts alike.
// The host tier (cache_slots > 0, --device_table_budget): the rank's rows and optimizer
// state live in host memory (the home arrays), and the device holds at most cache_slots
// of them in a cache whose contents row_cache.h decides from the steps' rows, announced
// ahead (announce). Every op that reads or updates rows goes through the cache's slots;
// the values, and so every bit of the run, are those of the all-on-device collection.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/device.h"
#include "embedding/embedding_kernels.h"
#include "embedding/plan.h"
#include "embedding/row_cache.h"
#include "embedding/table_ops.h"
#include "embedding/tier_stream.h"

namespace ncf {

// One table's ids of a step, on the context's device. width (0: all D columns): the
// columns of each row the lookup writes, the first ones, the rest left as they were
// (only where narrow_lookups() says so).
struct TableIds {
  const int32_t* ids = nullptr;
  int64_t n = 0;
  int width = 0;
};

// What the exchanges carry per vector element (--exchange_dtype).
enum class WireDType { kFloat32, kBFloat16 };
const char* wire_dtype_name(WireDType d);  // "fp32" | "bf16"
WireDType parse_wire_dtype(const std::string& s);
int wire_dtype_bytes(WireDType d);  // 4 | 2

class EmbeddingCollection {
 public:
  // cache_slots > 0: the host tier with a device cache of that many rows (dense Adam,
  // which updates every row every step, is refused).
  EmbeddingCollection(const EmbeddingPlan& plan, Communicator& comm, const ExecContext& ctx,
                      const EmbeddingOptimizerConfig& opt, bool dedup, int64_t cache_slots = 0);
  ~EmbeddingCollection();

  const EmbeddingPlan& plan() const { return plan_; }
  // The optimizer's rate from the next update on (a resumed run keeping the rate its
  // checkpoint was written with, Trainer::load_checkpoint).
  void set_learning_rate(float lr) { opt_.adam.lr = opt_.adagrad.lr = opt_.sgd.lr = lr; }
  int num_tables() const { return int(plan_.tables.size()); }
  // Node-level de-duplication on or off (needs dedup and the communicator's
  // two-hop exchange when on); every rank the same, before the first lookup.
  void set_node_dedup(bool on);
  bool node_dedup() const { return node_dedup_; }
  // The payload of the row exchanges; every rank the same, before a lookup.
  void set_exchange_dtype(WireDType d) { wire_ = d; }
  WireDType exchange_dtype() const { return wire_; }

  // Fills this rank's rows with N(0, stddev²) keyed by (seed, table, global row).
  void init(uint64_t seed);

  // rows(t)[k, :] = row ids[t].ids[k] of table t, for every table t. Collective:
  // every rank calls it, any n may be 0. ids must stay unchanged until
  // lookup_finish. The three phases let a stream-ordered communicator overlap
  // the transfers with other work.
  void lookup(const std::vector<TableIds>& ids);
  void lookup_start(const std::vector<TableIds>& ids);
  void lookup_gather();
  void lookup_finish();
  // [n_t × D] on the context's device: the rows of the last lookup (valid
  // until the next lookup), and the buffer the caller fills with d loss / d rows
  // before gradients_start.
  const float* rows(int t) const;
  float* row_grads(int t);
  // Whether a lookup may write fewer columns than D (TableIds::width): W = 1, FP32 rows and
  // an FP32 wire, where the lookup is one gather from this rank's own rows. With a host
  // tier, only from a step's stage_step to the end of its update, and only where the
  // cache's slots mirror the rows (a budget of every row): then a step's rows are read
  // where they are.
  bool narrow_lookups() const;
  // Table t's rows (global row order, row stride D) on the context's device where
  // narrow_lookups(), else null: in the cache with a host tier, where only the rows of the
  // step staged or running are sure to be.
  const float* local_rows(int t) const;

  // Floats of the replicated tables' dense gradient ([N×(D+1)] each: D columns
  // and a touch count) that gradients_start writes for the allreduce; 0 when no
  // table is replicated or W = 1.
  int64_t replicated_grad_floats() const { return rep_floats_; }
  // Sends the routed tables' gradient rows to their owners and writes the
  // replicated tables' dense gradient to replicated_grads (replicated_grad_floats()
  // floats on the context's device; may be null when that is 0). Collective.
  void gradients_start(float* replicated_grads);
  // The owners' fused reduce-and-update of the routed rows (step t ≥ 1).
  void gradients_finish(int64_t t);
  // For the next gradients_finish only, until the next lookup (where given_columns_ok():
  // narrow_lookups() and dense Adam): table t's rows take columns [col, D) of their summed
  // gradient from rows [N_t × (D − col)] (row i for the table's row i; only the batch's
  // rows are read) instead of from the gradient rows, whose columns there are not read
  // (table_ops.h GivenColumns).
  bool given_columns_ok() const;
  void give_columns(int t, int col, const float* rows);
  // After the caller's allreduce of replicated_grads: every rank applies the
  // same update to the replicated tables' touched rows.
  void update_replicated(const float* replicated_grads, int64_t t);

  // Table t in global row order, gathered on every rank into host memory.
  std::vector<float> gather_table(int t);

  // ---- the host tier ----
  bool host_tier() const { return cache_ != nullptr; }
  int64_t cache_slots() const { return cache_ ? cache_->slots() : 0; }
  // Device bytes per cached row: the row, its optimizer state and its slot map entry.
  int64_t cached_row_bytes() const {
    return cache_row_bytes(plan_.D, plan_.table_elem_bytes, opt_.kind);
  }
  static int64_t cache_row_bytes(int D, int elem_bytes, EmbeddingOptimizer o);
  // The ids of a later step, in the form lookup takes but in host memory: each call
  // announces the next step (the first lookup not yet announced), whose rows the owners
  // start loading now. Collective (one exchange of ids). Without the tier, nothing.
  // A lookup that was not announced (evaluation, tests) and its update work on the home
  // arrays directly, the cache written home and emptied first.
  void announce(const std::vector<TableIds>& host_ids);
  // Steps announced and not yet looked up.
  int64_t announced_ahead() const { return announced_ - looked_; }
  // The next announced step's rows made resident now, its step-time loads (a wait) queued
  // here instead of inside its lookup, so the caller can time them apart. Without the tier
  // or an announced step, nothing. True where it had rows to load, and always on a GPU,
  // whose step stream waits there for the side stream's loads of the step's rows.
  bool stage_step();
  // Forgets the announced steps that will not run (a stopped epoch).
  void forget_announced();
  // Writes every cached row home (checkpoints and gather_table do it themselves).
  void flush_cache();
  // Distinct rows of this rank the announced, unfinished steps touch (0 without the tier).
  int64_t window_rows() const { return cache_ ? cache_->window_rows() : 0; }
  // The copy rate between the home arrays and the cache, in GB/s (1e9 bytes) of rows with
  // their optimizer state, to the cache (*in) and home (*out): up to 2^20 rows (256 MiB)
  // each way, the fastest of three. Only while nothing is cached or announced (start-up):
  // the rows go to the cache's slots and back unchanged. Without the tier, nothing.
  void probe_copies(double* in, double* out);
  // What the cache did so far (null without the tier).
  const RowCache::Counters* cache_counters() const {
    return cache_ ? &cache_->counters() : nullptr;
  }

  // Checkpoint I/O (collection_io.cc). A table's state is num_state_arrays()
  // [N×state_width(a)] arrays: 0 the rows, then the optimizer's (1: Adam's
  // first moment or an Adagrad accumulator, 2: Adam's second moment). Rank r's block of a table
  // is the rows common/partition.h's block_range gives it, in global row
  // order, cut into num_chunks(t) chunks of chunk_rows() rows (the last ones
  // shorter or empty; the same count on every rank). export_chunk returns this
  // rank's chunk c of array `array` of table t and its row count, valid until
  // the next export or import (on a CPU rank it may point into the table);
  // import_chunk stores such a chunk. Both collective, host memory; call the
  // chunks of one array in order, 0 first.
  int num_state_arrays() const;
  // Floats per row of state array `array`: D, or 1 for row-wise Adagrad's
  // accumulator (array 1), whose chunks are [rows × 1].
  int state_width(int array) const;
  // Bytes of rows per chunk (default 64 MiB): what each staging buffer holds.
  void set_chunk_bytes(int64_t bytes);
  int64_t chunk_rows() const;
  int64_t num_chunks(int t) const;
  void chunk_range(int t, int rank, int64_t c, int64_t* first, int64_t* rows) const;
  const float* export_chunk(int t, int array, int64_t c, int64_t* rows);
  void import_chunk(int t, int array, int64_t c, const float* rows);

  // Bytes of this rank's rows and optimizer state.
  int64_t bytes_on_rank() const;
  // Bytes held now by the grow-only step buffers (what plan.h's
  // exchange_buffer_bytes estimates, less the sort scratch the ops own).
  int64_t step_buffer_bytes() const;

 private:
  struct RowBlock {  // rows [src, src + rows) go to [dst, dst + rows)
    int64_t dst, src, rows;
  };
  bool is_routed(int t) const;
  float* state_array(int array);  // params_, m_ or v_ on home_
  // The host tier's parts (collection_tier.cc).
  void allocate_cache(int64_t slots);
  // This rank's flat rows that a step reads or updates, in a fixed order, with repeats (a
  // row asked by several ranks or listed twice): the cache counts each once. Those of its
  // routed tables that any rank's ids ask of it, and of its replicated copies the rows of
  // every rank's ids (the allreduced gradient updates each copy at all of them). Collective.
  std::vector<int32_t> owner_rows(const std::vector<TableIds>& host_ids);
  // A step's routed keys as its lookup exchanges them: the keys of every table in batch
  // order, with --dedup the distinct ones and each batch position's index among them, their
  // owner order and flat rows, and the flat rows each rank asks of this one. On CPU ranks
  // (routes_ahead) a step's announcement works them out and sends them to the owners, and
  // the step's lookup takes them instead of bucketing and exchanging its keys again: one
  // exchange of keys per step, not two.
  struct Routing {
    Buffer<int32_t> keys, unique, send_rows, recv_rows;
    Buffer<int64_t> inverse, perm;
    std::vector<int64_t> send_counts, recv_counts;
    int64_t n_total = 0, n_routed = 0, nu = 0, nr = 0;
  };
  bool routes_ahead() const;
  // Table t (replicated) of an announcement, its rows *keys: this rank's copy's rows into
  // *mine, and the distinct ones (left in *keys) kept in ann_shared_ for every other rank.
  void share_replicated(int t, std::vector<int32_t>* keys, std::vector<int32_t>* mine);
  // An announcement's exchange: to each rank p its counts[p] flat rows of owned (rank order),
  // behind a one-int header saying how many where `header`, then (to other ranks) the
  // replicated tables' rows in ann_shared_ as that rank's flat rows. What arrives is in
  // ann_recv_, (*rc)[p] entries from rank p at (*rd)[p]. Collective.
  void send_to_owners(const int32_t* owned, const int64_t* counts, bool header,
                      std::vector<int64_t>* rc, std::vector<int64_t>* rd);
  // owner_rows where routes_ahead(): the step's Routing kept for its lookup, the rows for
  // the cache appended to *mine.
  void route_ahead(const std::vector<TableIds>& host_ids, std::vector<int32_t>* mine);
  // The lookup of an announced step takes its Routing (its keys_ already made): the ids
  // must be those announced.
  void take_routing();
  void retire_looked();
  void begin_lookup();
  // The moves on the side stream (an announcement's) or on the compute stream (a step's own).
  void apply_moves(const RowCache::Moves& m, bool side);
  // Copies rows between the home arrays and the cache's slots (to_home: cache -> home), on
  // c's stream.
  void move_rows(const ExecContext& c, const int32_t* slots, const int32_t* rows, int64_t n,
                 bool to_home);
  void tier_gather(const RowId* ids, int64_t first, int64_t R, int64_t n, float* out);
  void tier_update_fp32(const RowId* rows, const float* grads, int64_t n, int64_t first,
                        int64_t count, int64_t t);
  void drop_cache();
  ExecContext home_ctx() const;  // where the home arrays are worked on by the host
  // Rows ids[n] of this rank's flat rows from `first` on (R of them) into out[n×D], FP32.
  void gather_own(const RowId* ids, int64_t first, int64_t R, int64_t n, float* out);
  // The optimizer on flat rows [first, first + count): gradient rows grads[n×D]
  // of rows[n] (relative to first), summed per row first unless `unique` (then
  // strictly increasing, one per row). BF16 rows go through FP32 copies.
  void update_rows(const RowId* rows, const float* grads, int64_t n, int64_t first, int64_t count,
                   bool unique, int64_t t);
  RowRounding rounding(int64_t first, int64_t t) const;
  // W > 1 and some table is row- or table-wise: the exchanges run (on every
  // rank, also one that holds none of those rows).
  bool any_routed() const { return !local_ && layout_.placement[0] != Placement::kReplicated; }
  // Rows [first, first + count) of the parameter (FP32 rows only) and state arrays p, m, v:
  // the home arrays (all_rows) or the cache's.
  TableRows rows_of(Buffer<float>& p, Buffer<float>& m, Buffer<float>& v, int64_t first,
                    int64_t count);
  TableRows all_rows(int64_t first, int64_t count);
  // The step's rows are in a cache whose slots mirror the rows (RowCache::mirrors: a budget
  // of every row): gathers and updates work on the cache's arrays as on the home arrays,
  // at their rows, without the slot map.
  bool mirrored() const { return cache_ && !home_mode_ && cache_->mirrors(); }
  // all_rows, or its rows in the cache where mirrored().
  TableRows step_rows(int64_t first, int64_t count);
  void init_rows(uint64_t seed, int64_t k0, int64_t k1, float* dst) const;
  // The node-level de-duplication path of the phases.
  void node_lookup_start();
  void node_lookup_gather();
  void node_lookup_finish();
  void node_gradients_start();
  // Copies blocks of rows of row_bytes each between buffers on the context's
  // device; `reverse` swaps each block's source and destination.
  void copy_blocks(void* dst, const void* src, const std::vector<RowBlock>& blocks,
                   size_t row_bytes, bool reverse);
  // all_to_all_v of rows of D floats (counts and displacements in floats)
  // started on the world, in the wire dtype: with BF16 the send rows are packed
  // into wsend_ and arrive in wrecv_, and finish_rows widens them into recv
  // after the join.
  void start_rows(const float* send, float* recv);
  // BF16: sizes wsend_ and wrecv_ to the layout (counts and displacements in
  // elements) and packs send into wsend_; returns the elements wrecv_ receives.
  int64_t pack_wire(const float* send, const std::vector<int64_t>& sc,
                    const std::vector<int64_t>& sd, const std::vector<int64_t>& rc,
                    const std::vector<int64_t>& rd);
  void finish_rows(float* recv);
  // In place at W = 1 with BF16: the rows of the tables a larger W routes.
  void round_kept_rows(float* rows);
  // group_all_to_all_v of rows of D floats: counts and offsets given in rows.
  void exchange_rows(CommGroup g, const float* send, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& send_at, float* recv,
                     const std::vector<int64_t>& recv_rows, const std::vector<int64_t>& recv_at);
  // Rows of the routed tables that `rank` holds: the leading flat rows there.
  int64_t routed_rows_on(int rank) const;

  EmbeddingPlan plan_;
  Communicator& comm_;
  ExecContext ctx_;
  EmbeddingOptimizerConfig opt_;
  bool dedup_;
  int W_, rank_;
  bool local_;  // W = 1: no routing, no exchange
  KeyLayout layout_;
  std::vector<int> lt_;   // plan table t -> layout table
  int64_t R_ = 0;         // flat rows on this rank
  int64_t R_routed_ = 0;  // the leading flat rows of routed tables
  int64_t rep_floats_ = 0;
  std::vector<int64_t> rep_offset_;  // plan table t -> its floats in replicated_grads

  // On home_ (ctx_.device, or host memory with the tier): [R × D] parameters and
  // optimizer state (m_ is also Adagrad's accumulator; row-wise Adagrad's is [R]).
  Device home_ = Device::kCpu;
  Buffer<float> params_, m_, v_;
  bool bf16_rows_ = false;
  Buffer<uint16_t> rows16_;  // [R × D] the rows as BF16 (params_ is then empty)
  uint64_t seed_ = 0;        // init's seed, which keys the rounding too
  // BF16 rows' update: unique rows and summed gradients, a row offset list, FP32
  // copies of rows and state (grow-only), and the unique rows on the host.
  Buffer<int32_t> bur_, brow_;
  Buffer<float> bug_, bw_, bm_, bv_;
  std::vector<int32_t> host_ur_;
  std::vector<uint16_t> io16_;  // checkpoint staging of BF16 rows

  // The last lookup: batch order is the routed tables, then the replicated
  // ones; table t's n_[t] ids start at off_[t]. n_routed_ ids are routed,
  // nu_ travel (unique with dedup), nr_ arrive at this rank as owner.
  std::vector<int64_t> n_, off_;
  std::vector<int> width_;  // the last lookup's columns per table (0: D)
  GivenColumns given_;      // give_columns, for the next gradients_finish
  int64_t n_total_ = 0, n_routed_ = 0, nu_ = 0, nr_ = 0;
  CommTicket ticket_ = 0;
  Buffer<int32_t> keys_;        // [n_total] routed: keys; replicated: table rows; W=1: flat rows
  Buffer<float> rows_, grads_;  // [n_total × D] lookup result, its gradient
  Buffer<int32_t> unique_;      // [nu] ascending unique keys (dedup)
  Buffer<int64_t> inverse_;     // [n_routed] batch position -> index in unique_
  Buffer<int64_t> perm_;        // [nu] owner order -> index among the travelling keys
  Buffer<int32_t> send_rows_;   // [nu] flat rows asked of each owner, owner order
  Buffer<int32_t> recv_rows_;   // [nr] flat rows other ranks ask of this rank
  Buffer<float> send_vec_, recv_vec_, uvec_;  // [nr×D], [nu×D], [nu×D] exchanged rows
  Buffer<int32_t> reduced_rows_;              // dedup / replicated: the unique rows of a reduction
  Buffer<float> reduced_grads_;               // and their summed gradient rows
  WireDType wire_ = WireDType::kFloat32;
  Buffer<uint16_t> wsend_, wrecv_;  // BF16 payloads of the row exchanges
  int64_t widen_ = 0;               // floats start_rows left in wrecv_ for finish_rows
  std::vector<int64_t> send_counts_, send_displs_, recv_counts_, recv_displs_;  // [W] rows
  std::vector<int64_t> sc_, sd_, rc_, rd_;  // the same, in floats (× D)
  // Node-level de-duplication (N nodes of L ranks; this rank (n, l)). Hop-1
  // counts (Communicator::hop1_counts): h1r_[i·N + m] keys that (n, i) asks of
  // (m, l), which this rank carries. Layouts of hop 1: "A"
  // [local peer j][node m] on the source (ac_/ad_ per peer), "B" [source i][node
  // m] on the carrying rank (bc_/bd_ per source), and "K" [node m][source i],
  // each node's nb keys contiguous from kd_[m] (kc_[m] of them). uc_[m] unique
  // keys go to node m's owner from kd_[m]; urc_/urd_ [N] arrive from each node.
  bool node_dedup_ = false;
  int N_ = 1, L_ = 1;
  int64_t nb_ = 0;
  std::vector<int64_t> h1r_, ac_, ad_, bc_, bd_, kc_, kd_, uc_, urc_, urd_;
  std::vector<int64_t> x1_, x2_, x3_, x4_;  // exchange_rows' counts and displacements × D
  std::vector<RowBlock> pack_, regroup_;    // owner order -> A; B -> K
  Buffer<int32_t> akeys_, bkeys_, kkeys_, nunique_, nrows_;
  Buffer<int64_t> ninv_;
  Buffer<float> avec_, bvec_, kvec_, nvec_;
  // Checkpoint I/O staging, grow-only (host memory).
  std::vector<float> io_mine_, io_send_, io_recv_, io_block_;
  const float* io_rows_ = nullptr;  // the exported array's rows on the host
  int64_t chunk_bytes_ = int64_t{64} << 20;

  // The host tier: the residency plan, the cache's [C × ...] arrays on ctx_.device, the
  // map flat row -> slot (-1: not cached) on ctx_.device, the slots of one op's rows,
  // the moves' index lists on the device, and the home arrays registered with the GPU.
  std::unique_ptr<RowCache> cache_;
  std::unique_ptr<TierStream> tier_stream_;  // where announcements' moves run
  Buffer<float> cparams_, cm_, cv_;
  Buffer<uint16_t> crows16_;
  // The moves' index lists: a step's own (compute stream), an announcement's (side stream).
  Buffer<int32_t> slot_map_, tslot_, moves_dev_, side_moves_dev_;
  PinnedBuffer<int32_t> moves_host_;  // flush_cache's lists on their way up
  std::vector<void*> registered_;
  int64_t announced_ = 0, looked_ = 0;  // steps announced, lookups begun
  bool retire_due_ = false;             // the last lookup's step has not retired yet
  bool cache_dirty_ = false;            // rows updated since the last flush
  bool home_mode_ = false;  // the last lookup was not announced: it works on the home arrays
  bool staged_ = false;     // stage_step began step looked_; its lookup has not come
  bool step_open_ = false;  // a step's announced lookup came; its update has not ended
  // announce's host scratch (kept: fresh large vectors would fault their pages in each step)
  // and unique_in_order's bit set over the keys.
  std::vector<int32_t> ann_keys_, ann_routed_, ann_owned_, ann_send_, ann_recv_, ann_shared_;
  std::vector<int64_t> ann_shared_n_;
  std::vector<int64_t> ann_perm_;
  std::vector<uint64_t> ann_bits_;
  RowCache::Moves moves_;         // announce's and stage_step's, refilled at each call (kept alike)
  std::deque<Routing> routings_;  // the announced steps' not yet looked up, in order
  std::vector<Routing> spare_routings_;  // their buffers, once a lookup has swapped them out
};

}  // namespace ncf
