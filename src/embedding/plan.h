// Which rank holds which rows: the table specs, the shard planner with its
// cost model, the per-rank memory estimate, and the plan printout. Pure
// functions of sizes and flags, so every rank computes the same plan and the
// tests check a plan in-process. docs/comm_cost_model.md derives the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "embedding/embedding_kernels.h"  // Placement, KeyLayout
#include "embedding/table_ops.h"          // EmbeddingOptimizer

namespace ncf {

const char* placement_name(Placement p);
Placement parse_placement(const std::string& s);  // "row", "table", "replicated"

struct TableSpec {
  std::string name;      // "user", "item"
  int64_t num_rows = 0;  // N: global rows
  Placement placement = Placement::kRowWise;
  int owner = 0;          // table-wise: the rank holding it
  uint32_t init_tag = 0;  // separates the init streams of tables
  float init_stddev = 0.01f;
};

// Every table of the collection, one width D for all, over W ranks.
struct EmbeddingPlan {
  int D = 0;
  int W = 1;
  std::vector<TableSpec> tables;
  bool dedup = false;  // routed ids are de-duplicated before the exchange
  // --dedup node: also across the ranks of a node, on the two-hop exchange
  // (the trainer turns it off, saying why, where the exchange stays flat).
  bool node_dedup = false;
  // Bytes per vector element on the wire (--exchange_dtype: 4 fp32, 2 bf16).
  int payload_bytes = 4;
  // Bytes per stored row element (--table_dtype: 4 fp32, 2 bf16 rows).
  int table_elem_bytes = 4;
  std::string reason;  // one clause per table: why it got its placement; then dedup's
};

// What the planner decides from.
struct PlanRequest {
  std::vector<TableSpec> tables;  // names, rows, init tags (placements are decided)
  int D = 0;
  int W = 1;
  int64_t lookups_per_rank = 0;  // ids each table looks up per step on one rank
  EmbeddingOptimizer optimizer = EmbeddingOptimizer::kDenseAdam;
  // --shard_plan: "auto", one placement for all ("row"), or "user=row,item=replicated".
  std::string forced = "auto";
  int64_t replicated_limit_bytes = int64_t{256} << 20;  // the most a replicated table may hold
  // --dedup: "on", "off", "node" (on, and across a node's ranks), or "auto":
  // on when the routed tables' lookups of a step are expected to hold at most
  // kDedupAutoShare unique ids.
  std::string dedup = "auto";
  int payload_bytes = 4;     // bytes per vector element exchanged (4 fp32, 2 bf16)
  int table_elem_bytes = 4;  // bytes per stored row element (4 fp32, 2 bf16)
};
constexpr double kDedupAutoShare = 0.5;

// Expected distinct rows among n uniform draws from N rows: N·(1 − (1 − 1/N)^n).
// (Real popularity is skewed, so real batches hold fewer; the estimate errs
// towards leaving dedup off.)
double expected_unique(int64_t N, int64_t n);

// The cost model: bytes per step on the busiest link of a rank for one table
// under a placement. Row- and table-wise move ids out and vectors back in the
// forward and gradients out in the backward (a table-wise owner receives
// every rank's share), payload_bytes per vector element; replicated
// allreduces the dense FP32 [N×(D+1)] gradient.
double step_exchange_bytes(Placement p, int64_t N, int D, int64_t lookups_per_rank, int W,
                           int payload_bytes = 4);

// Placements: forced ones as given (bad names end with a message naming
// --shard_plan and the value); otherwise replicated where its allreduce moves
// fewer bytes than the exchange and the table fits replicated_limit_bytes,
// row-wise elsewhere. Table-wise owners: table t on rank t mod W. Then dedup
// (only where some table is routed, W > 1).
EmbeddingPlan plan_tables(const PlanRequest& req);

// The key layout of a plan: routed (row- and table-wise) tables first, then
// the replicated ones, so a rank's routed rows are one leading range of its
// flat rows. layout_index[t] = the layout's index of plan table t.
KeyLayout make_key_layout(const EmbeddingPlan& plan, std::vector<int>* layout_index);

// Rows of a table a rank holds, and their bytes with optimizer state (plus,
// for a replicated table at W > 1, its dense gradient in the allreduce), rows
// stored with elem_bytes per element.
int64_t table_rank_rows(const TableSpec& t, int rank, int W);
int64_t table_rank_bytes(const TableSpec& t, int D, int rank, int W, EmbeddingOptimizer o,
                         int elem_bytes = 4);

// Bytes of the collection's grow-only step buffers on a rank whose tables look
// up lookups[t] ids per step (the received ids are taken as balanced: the
// rank's own count). collection.h's step_buffer_bytes() reports what it holds.
int64_t exchange_buffer_bytes(const EmbeddingPlan& plan, const std::vector<int64_t>& lookups,
                              bool dedup);

// "user table row (2.8 MiB), item table replicated (1.7 MiB)" for one rank.
std::string describe_rank_tables(const EmbeddingPlan& plan, const std::vector<int64_t>& bytes);

}  // namespace ncf
