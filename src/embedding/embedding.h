// Embedding tables sharded across ranks (shared/DESIGN.md steps 3 and 6).
//
// Placements:
//   row-wise    owner(id) = id mod W, local row = id div W (default);
//   table-wise  the whole table on one rank; every lookup goes there;
//   replicated  every rank holds the table; lookups are local; the gradient is
//               allreduced as a dense [N×D] buffer and every rank applies the
//               same update (data parallel).
// Forward (row/table-wise): optional de-duplication, bucketize ids by owner,
// exchange counts, exchange ids (all-to-all-v), owners gather rows, exchange
// vectors back, un-permute to batch order. Backward: gradient rows take the
// reverse path; owners sort by row, sum duplicates and apply the optimizer.
// With W = 1 every placement holds the whole table and none of that routing
// exists: the lookup gathers the rows straight into batch order, the backward
// sorts and sums the batch's gradient rows and updates them in place — the same
// numbers as the routed path (its permutations are identities at W = 1).
// Initial values depend on the global row id only, so every W starts alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/device.h"
#include "embedding/embedding_kernels.h"
#include "model/optim.h"

namespace ncf {

enum class Placement { kRowWise, kTableWise, kReplicated };
const char* placement_name(Placement p);
Placement parse_placement(const std::string& s);  // "row", "table", "replicated"

enum class EmbeddingOptimizer { kDenseAdam, kLazyAdam, kSgd, kAdagrad };
const char* optimizer_name(EmbeddingOptimizer o);
EmbeddingOptimizer parse_embedding_optimizer(const std::string& s);
// Optimizer state floats per table element (Adam 2, Adagrad 1, SGD 0).
int optimizer_state_per_element(EmbeddingOptimizer o);

struct EmbeddingOptimizerConfig {
  EmbeddingOptimizer kind = EmbeddingOptimizer::kDenseAdam;
  AdamHyper adam;
  AdagradHyper adagrad;
  SgdHyper sgd;
};

struct TableSpec {
  std::string name;        // "user", "item"
  int64_t num_rows = 0;    // N: global rows
  int D = 0;               // width
  Placement placement = Placement::kRowWise;
  int owner = 0;           // table-wise: the rank holding it
  uint32_t init_tag = 0;   // separates the init streams of tables
  float init_stddev = 0.01f;
};

// Bytes a table of this spec needs on `rank` of W (parameters + optimizer state).
int64_t table_rank_rows(const TableSpec& t, int rank, int W);
int64_t table_rank_bytes(const TableSpec& t, int rank, int W, EmbeddingOptimizer o);

// Bytes of the grow-only step buffers a table holds on a rank that looks up n
// ids per step: the ids and their routing, the exchanged rows and gradients,
// the owner's reduced rows and the sort-reduce scratch (nr, the ids a rank
// receives, is taken as n: the balanced case). The memory guard adds these to
// table_rank_bytes.
int64_t table_exchange_bytes(const TableSpec& t, int64_t n, int W, bool dedup);

// Per-step traffic of one table on this rank, for the log.
struct ExchangeStats {
  int64_t ids_sent = 0;      // ids leaving this rank (to other ranks)
  int64_t bytes_sent = 0;    // all payload bytes to other ranks (ids, vectors, gradients)
  int64_t unique_ids = 0;    // after de-duplication
};

class ShardedEmbedding {
 public:
  ShardedEmbedding(const TableSpec& spec, Communicator& comm, const ExecContext& ctx,
                   const EmbeddingOptimizerConfig& opt, bool dedup);

  const TableSpec& spec() const { return spec_; }
  int64_t local_rows() const { return local_rows_; }
  // Global row id of local row k on this rank.
  int64_t global_row(int64_t k) const;

  // Fills this rank's rows with N(0, stddev²) keyed by (seed, table, global row).
  void init(uint64_t seed);

  // out[k, :] = row ids[k] for k < n; ids and out live on the context's device.
  // Collective: every rank calls it, n may be 0. Remembers the routing for the
  // following apply_gradients.
  void lookup(const int32_t* ids, int64_t n, float* out);

  // lookup() in three phases, each collective, so that one table's transfers
  // overlap another table's kernels on a stream-ordered communicator (start both
  // tables, gather both, finish both):
  //   lookup_start   de-duplicate, bucketize, exchange counts, send the ids;
  //   lookup_gather  owners gather the asked rows and send them back;
  //   lookup_finish  rows into batch order at out.
  // ids must stay unchanged until lookup_finish.
  void lookup_start(const int32_t* ids, int64_t n);
  void lookup_gather();
  void lookup_finish(float* out);

  // grads[n×D] (context's device): d loss / d out of the last lookup. Collective. Sends rows to
  // their owners, which reduce duplicates and apply the optimizer (step t ≥ 1).
  void apply_gradients(const float* grads, int64_t t);
  // apply_gradients() in two collective phases: send the gradient rows to their
  // owners, then the owners' reduction and update. grads must stay unchanged
  // until gradients_finish.
  void gradients_start(const float* grads);
  void gradients_finish(int64_t t);

  // The whole table in global row order, gathered on every rank into host memory
  // (tests, checkpoints).
  std::vector<float> gather_full();

  const ExchangeStats& last_stats() const { return stats_; }
  int64_t bytes_on_rank() const;
  // Bytes held now by the grow-only step buffers (what table_exchange_bytes
  // estimates, less the sort-reduce scratch, which the kernels own).
  int64_t step_buffer_bytes() const;

 private:
  void apply_optimizer(const int32_t* rows, const float* grads, int64_t n, int64_t t);
  void apply_replicated(const float* grads, int64_t t);
  // W = 1 (local_): sum the batch's gradient rows per id and update in place.
  void apply_local(const float* grads, int64_t t);
  // Fills the rows [k0, k1) of this rank's shard into host memory at dst.
  void init_rows(uint64_t seed, int64_t k0, int64_t k1, float* dst) const;

  TableSpec spec_;
  Communicator& comm_;
  ExecContext ctx_;
  EmbeddingOptimizerConfig opt_;
  bool dedup_;
  int W_, rank_;
  bool local_ = false;  // W = 1: no routing, no exchange (see the top of this file)
  int64_t local_rows_ = 0;
  OwnerRule rule_;

  // On ctx_.device: [local_rows × D] parameters and optimizer state (m_ is also
  // Adagrad's accumulator).
  Buffer<float> table_, m_, v_;

  // Routing of the last lookup (n batch ids, nu unique ids, nr ids received).
  int64_t n_ = 0, nu_ = 0, nr_ = 0;
  CommTicket ticket_ = 0;             // the exchange in flight between two phases
  const float* pending_grads_ = nullptr;  // replicated or local: gradients_start → gradients_finish
  Buffer<int32_t> ids_;          // [n] the batch ids (the backward sums duplicates by id)
  Buffer<int32_t> unique_;       // [nu] ascending unique ids (dedup)
  Buffer<int64_t> inverse_;      // [n] batch position -> index in unique_ (dedup)
  Buffer<int64_t> perm_;         // [nu] owner order -> index among the (unique) ids
  Buffer<int32_t> send_local_;   // [nu] local rows asked of each owner, owner order
  Buffer<int32_t> recv_local_;   // [nr] local rows other ranks ask of this rank
  Buffer<float> send_vec_, recv_vec_, uvec_;  // row buffers of the exchanges
  Buffer<int32_t> reduced_rows_;
  Buffer<float> reduced_grads_;
  Buffer<float> dense_;          // replicated: [N×(D+1)] gradient and touch counts
  std::vector<int64_t> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<int64_t> sc_, sd_, rc_, rd_;     // the same, in floats (× D)
  ExchangeStats stats_;
};

}  // namespace ncf
