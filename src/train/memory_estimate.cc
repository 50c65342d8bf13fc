// The memory guard's estimate: see memory_estimate.h. The scratch bounds follow the
// carves of the CUDA ops one by one (embedding/table_ops.cu, embedding_kernels.cu,
// model/ops_*.cu, metrics.cu, topk.cu), array by array.
#include "train/memory_estimate.h"

#include <algorithm>

#include "common/check.h"
#include "embedding/table_ops.h"
#include "model/ops.h"

namespace ncf {
namespace {

using cuda::col_chunks;
using cuda::kTopKBlockElements;
using cuda::sum_chunks;

// ScratchLayout's arithmetic (common/cuda_util.cuh): arrays one after another,
// each starting on a kScratchAlign boundary.
class Carve {
 public:
  Carve& take(int64_t bytes) {
    constexpr int64_t a = int64_t(cuda::kScratchAlign);
    used_ = (used_ + a - 1) / a * a + bytes;
    return *this;
  }
  // `count` arrays of `bytes` each.
  Carve& take(int count, int64_t bytes) {
    for (int k = 0; k < count; ++k) take(bytes);
    return *this;
  }
  int64_t used() const { return std::max<int64_t>(used_, 1); }

 private:
  int64_t used_ = 0;
};

// Bytes of the BF16 copy of a rows × cols matrix with stride ld (model/ops_gemm.cu).
int64_t bf16_copy_bytes(int64_t rows, int64_t cols, int64_t ld) {
  return rows > 0 && cols > 0 ? ((rows - 1) * ld + cols) * 2 : 0;
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// The largest carve of each op family; `keep` takes the maximum.
class Peak {
 public:
  explicit Peak(const ScratchShapes& s) : s_(s) {}
  int64_t value() const { return peak_; }

  // EmbeddingCollection::lookup_start / lookup_finish over ids[t] per table.
  void lookup(const std::vector<int64_t>& ids) {
    if (s_.W == 1) return;  // gathers only
    const int64_t n = routed_ids(ids);
    if (n == 0) return;
    // unique_ids: sorted ids, positions in and sorted, heads, runs; the CUB temporary.
    if (s_.dedup)
      keep(Carve()
               .take(5, 4 * n)
               .take(std::max(cub_sort_pairs_bytes(n, 4, 4), cub_scan_bytes(n)))
               .used());
    // bucketize_by_owner: owners, rows, sorted owners, positions in and sorted; [W]
    // counts; the sort.
    keep(Carve().take(5, 4 * n).take(8 * int64_t(s_.W)).take(cub_sort_pairs_bytes(n, 4, 4)).used());
    keep(Carve().take(4 * n).used());  // unpermute_rows: the marks
  }

  // gradients_start / gradients_finish / update_replicated: the owners' fused
  // update, the dedup sums, the replicated tables' sums and dense optimizer.
  void embedding_backward(const std::vector<int64_t>& ids, const std::vector<int64_t>& received) {
    const int64_t map = s_.dense_adam ? s_.routed_rows : 0;
    if (s_.W == 1) {
      fused_update(sum_of(ids), map);
      return;
    }
    const int64_t n = routed_ids(ids);
    if (s_.dedup && n > 0) keep(sort_runs_scratch_bytes(n, s_.D, false, 0));
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t N = s_.replicated_rows[t];
      if (N == 0) continue;
      if (ids[t] > 0) keep(sort_runs_scratch_bytes(ids[t], s_.D, false, 0));
      // compact_touched_rows: flags, their scan, the CUB temporary.
      keep(Carve().take(4 * N).take(4 * N).take(std::max<int64_t>(cub_scan_bytes(N), 1)).used());
      if (s_.dense_adam) keep(Carve().take(4 * N).used());  // embedding_dense_adam's row map
    }
    if (any_routed()) fused_update(sum_of(received), map);
  }

  // item_runs over B samples (layer 0 by item): sorted ids, positions, run heads, their
  // scan; the CUB temporary.
  void item_runs(int64_t B) {
    if (B == 0 || !tower()) return;
    keep(Carve()
             .take(4, 4 * B)
             .take(std::max(cub_sort_pairs_bytes(B, 4, 4), cub_scan_bytes(B)))
             .used());
  }

  // NeuMF::forward over n users of S samples each (B = n·S rows).
  void tower_forward(int64_t n, int64_t S) {
    const int64_t B = n * S;
    if (B == 0 || !tower() || !s_.bf16) return;  // only the BF16 copies carve here
    const int64_t h = s_.layers[0] / 2, in0 = s_.layers[0], out0 = s_.layers[1];
    keep(gemm_copies(bf16_copy_bytes(n, h, s_.D), bf16_copy_bytes(out0, h, in0)));
    keep(gemm_copies(bf16_copy_bytes(B, h, s_.D), bf16_copy_bytes(out0, h, in0)));
    for (size_t l = 1; l + 1 < s_.layers.size(); ++l) {
      const int64_t in = s_.layers[l], out = s_.layers[l + 1];
      keep(gemm_copies(B * in * 2, out * in * 2));  // linear_forward
    }
    // BF16 storage (the *_bf16 ops): each layer's FP32 product before its epilogue.
    for (size_t l = 0; l + 1 < s_.layers.size(); ++l)
      keep(Carve().take(B * s_.layers[l + 1] * 4).used());
  }

  // The loss and NeuMF::backward of a training step.
  void tower_backward(int64_t n, int64_t S) {
    const int64_t B = n * S;
    if (B == 0) return;
    keep(Carve().take(sum_chunks(B) * 8).used());  // bce_with_logits_forward
    const int64_t F = s_.mf + s_.layers.back();
    keep(Carve().take(col_chunks(B) * (F + 1) * 8).used());                   // head_backward
    if (s_.mf <= kNeumfTopMaxWidth && s_.layers.back() <= kNeumfTopMaxWidth)  // the fused top
      keep(Carve()
               .take(std::max<int64_t>(cuda::neumf_top_chunks(n), 1) *
                     cuda::neumf_top_partial_cols(s_.mf, s_.layers.back()) * 8)
               .used());
    if (!tower()) return;
    for (size_t l = 1; l + 1 < s_.layers.size(); ++l) {  // linear_backward
      const int64_t in = s_.layers[l], out = s_.layers[l + 1];
      Carve c;
      c.take(col_chunks(B) * out * 8);
      if (s_.bf16) c.take(B * out * 2).take(out * in * 2).take(B * in * 2);
      keep(c.used());
    }
    const int64_t h = s_.layers[0] / 2, in0 = s_.layers[0], out0 = s_.layers[1];
    keep(Carve().take(col_chunks(n) * out0 * 8).used());  // group_sum_backward, bias sums
    if (!s_.bf16) return;
    // Layer 0's four GEMMs: dW0 (users, items), then the rows' gradients.
    keep(gemm_copies(bf16_copy_bytes(n, out0, out0), bf16_copy_bytes(n, h, s_.D)));
    keep(gemm_copies(bf16_copy_bytes(B, out0, out0), bf16_copy_bytes(B, h, s_.D)));
    keep(gemm_copies(bf16_copy_bytes(n, out0, out0), bf16_copy_bytes(out0, h, in0)));
    keep(gemm_copies(bf16_copy_bytes(B, out0, out0), bf16_copy_bytes(out0, h, in0)));
  }

  // hit_ndcg over U users: per-user sums, chunk partials, totals.
  void metrics(int64_t U) { keep(Carve().take(U * 16).take(sum_chunks(U) * 16).take(16).used()); }

  // top_k over users × I scores, a block of rows × I keys per CUB call.
  void top_k(int64_t users, int64_t I) {
    if (users == 0 || I == 0) return;
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(users, kTopKBlockElements / I));
    const int64_t keys = rows * I;
    keep(Carve()
             .take(8 * keys)
             .take(8 * keys)
             .take(4 * (rows + 1))
             .take(cub_segmented_sort_keys_bytes(keys, 8))
             .used());
  }

 private:
  void keep(int64_t bytes) { peak_ = std::max(peak_, bytes); }
  bool tower() const { return s_.layers.size() > 1; }
  bool any_routed() const {
    return std::find(s_.routed.begin(), s_.routed.end(), true) != s_.routed.end();
  }
  int64_t routed_ids(const std::vector<int64_t>& ids) const {
    int64_t n = 0;
    for (size_t t = 0; t < ids.size(); ++t)
      if (s_.routed[t]) n += ids[t];
    return n;
  }
  // reduce_update_rows: the sort with its own unique ids, and the dense row map;
  // with no ids only the map.
  void fused_update(int64_t n, int64_t map) {
    if (n > 0)
      keep(sort_runs_scratch_bytes(n, s_.D, true, map));
    else if (map > 0)
      keep(Carve().take(4 * map).used());
  }
  static int64_t gemm_copies(int64_t a, int64_t b) { return Carve().take(a).take(b).used(); }

  const ScratchShapes& s_;
  int64_t peak_ = 1;
};

}  // namespace

int64_t cub_sort_pairs_bytes(int64_t n, int key_bytes, int value_bytes) {
  return n * (key_bytes + value_bytes) + n / 4 + (int64_t{256} << 10);
}

int64_t cub_scan_bytes(int64_t n) { return n / 4 + 4096; }

int64_t cub_segmented_sort_keys_bytes(int64_t n, int key_bytes) { return n * key_bytes + 512; }

int64_t sort_runs_scratch_bytes(int64_t n, int D, bool own_unique, int64_t map_rows) {
  const int64_t max_partials = 2 * n / kSubRun + 1;
  const int64_t temp = std::max({cub_sort_pairs_bytes(n, 4, 4), cub_scan_bytes(n + 1), int64_t{1}});
  Carve c;
  c.take(4 * n)                    // sorted ids
      .take(4 * n)                 // positions 0..n-1
      .take(4 * n)                 // positions in id order
      .take(4 * n)                 // run lengths
      .take(4 * n)                 // run starts
      .take(4 * (n + 1))           // sub-runs per run
      .take(4 * (n + 1))           // first partial per run
      .take(4 * max_partials)      // owner run of each partial
      .take(4 * max_partials * D)  // partial sums
      .take(4)                     // the run count
      .take(temp);
  if (own_unique) c.take(4 * n);
  if (map_rows > 0) c.take(4 * map_rows);
  return c.used();
}

ScratchShapes scratch_shapes(const TrainConfig& cfg, const DatasetMeta& meta,
                             const EmbeddingPlan& plan, int rank) {
  NCF_CHECK(plan.tables.size() == 2, "memory estimate: the plan has ", plan.tables.size(),
            " tables, expected user and item");
  ScratchShapes s;
  s.W = plan.W;
  s.D = plan.D;
  s.mf = cfg.num_factors;
  s.layers = cfg.layers;
  s.dedup = plan.dedup;
  s.bf16 = parse_math_mode(cfg.precision) == MathMode::kBf16;
  s.train = !cfg.eval_only;
  s.dense_adam = s.train && parse_embedding_optimizer(cfg.embedding_optimizer) ==
                                EmbeddingOptimizer::kDenseAdam;
  s.S = cfg.num_neg + 1;
  const int64_t P = cfg.batch_size / s.S;  // positives per global step
  s.positives = s.train ? P / s.W + 1 : 0;
  s.train_lookups = {s.positives, s.positives * s.S};
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const TableSpec& spec = plan.tables[t];
    const bool replicated = spec.placement == Placement::kReplicated;
    s.routed.push_back(s.W > 1 && !replicated);
    s.replicated_rows.push_back(s.W > 1 && replicated ? spec.num_rows : 0);
    if (s.W == 1)
      s.routed_rows += spec.num_rows;
    else if (!replicated)
      s.routed_rows += table_rank_rows(spec, rank, s.W);
    int64_t received = 0;
    if (s.W > 1 && spec.placement == Placement::kRowWise) received = s.train_lookups[t];
    if (s.W > 1 && spec.placement == Placement::kTableWise && spec.owner == rank)
      received = s.W * s.train_lookups[t];
    s.train_received.push_back(received);
  }
  s.eval_list = int64_t(meta.eval_negatives) + 1;
  // A batch holds at most the dataset's eval users (a GPU rank's default batch of a
  // million samples is more than a small dataset has).
  s.eval_users = std::min<int64_t>(std::max<int64_t>(1, cfg.eval_batch_size / s.eval_list),
                                   std::max<int64_t>(1, int64_t(meta.num_eval_users)));
  s.eval_lookups = {s.eval_users, s.eval_users * s.eval_list};
  // Full ranking and ncf_recommend score a group of users against every item.
  if (cfg.eval_full_ranking || cfg.eval_only) {
    s.score_items = int64_t(meta.num_items);
    s.score_users = std::max<int64_t>(1, cfg.eval_batch_size / std::max<int64_t>(1, s.score_items));
  }
  s.top_k = cfg.eval_only;
  if (cfg.eval_only) s.pairs = std::max<int64_t>(1, cfg.eval_batch_size);
  return s;
}

int64_t cuda_scratch_peak_bytes(const ScratchShapes& s) {
  NCF_CHECK(
      s.routed.size() == s.replicated_rows.size() && s.routed.size() == s.train_lookups.size() &&
          s.routed.size() == s.train_received.size() && s.routed.size() == s.eval_lookups.size(),
      "cuda_scratch_peak_bytes: per-table sizes of different lengths");
  Peak p(s);
  if (s.train) {
    p.lookup(s.train_lookups);
    p.item_runs(s.positives * s.S);
    p.tower_forward(s.positives, s.S);
    p.tower_backward(s.positives, s.S);
    p.embedding_backward(s.train_lookups, s.train_received);
  }
  p.lookup(s.eval_lookups);
  p.tower_forward(s.eval_users, s.eval_list);
  p.metrics(s.eval_users);
  if (s.score_users > 0) {
    std::vector<int64_t> users_only(s.routed.size(), 0);
    users_only[0] = s.score_users;
    p.lookup(users_only);
    p.tower_forward(s.score_users, s.score_items);
    if (s.top_k) p.top_k(s.score_users, s.score_items);
  }
  if (s.pairs > 0) {
    p.lookup(std::vector<int64_t>(s.routed.size(), s.pairs));
    p.tower_forward(s.pairs, 1);
  }
  return p.value();
}

int64_t eval_lists_cache_bytes(int64_t users, int64_t list) {
  const int64_t bytes = users * (4 + 5 * list);
  return bytes <= kEvalListsCacheMaxBytes ? bytes : 0;
}

bool eval_items_fit(int64_t items, int mf, int h, int out0, int64_t batch) {
  return items * (int64_t(mf) + out0) <= batch * h;
}

int64_t MemoryEstimate::total() const {
  int64_t t = exchange + step + scratch + workspaces;
  for (int64_t x : tables) t += x;
  return t;
}

MemoryEstimate estimate_rank_memory(const TrainConfig& cfg, const DatasetMeta& meta,
                                    const EmbeddingPlan& plan, int rank, Device device) {
  // Evaluating a checkpoint and serving hold the tables' rows only.
  const bool rows_only = cfg.eval_only;
  const EmbeddingOptimizer opt =
      rows_only ? EmbeddingOptimizer::kSgd : parse_embedding_optimizer(cfg.embedding_optimizer);
  const int W = plan.W, D = plan.D;
  const int64_t S = cfg.num_neg + 1;
  const int64_t P = cfg.batch_size / S;
  const int64_t local_samples = (P / W + 1) * S;
  const int64_t L = int64_t(meta.eval_negatives) + 1;
  const int64_t eval_users = std::max<int64_t>(1, cfg.eval_batch_size / L);
  int64_t widest = 0;
  for (int w : cfg.layers) widest += w;

  MemoryEstimate e;
  for (const TableSpec& t : plan.tables)
    e.tables.push_back(table_rank_bytes(t, D, rank, W, opt, plan.table_elem_bytes));
  // The exchange buffers are grow-only, sized by the larger of the training and the
  // eval lookups; without training the largest lookups are --eval_batch_size ids a
  // table (eval lists, or ncf_recommend's rounds of pairs).
  const int64_t most_lookups = rows_only ? std::max<int64_t>(1, cfg.eval_batch_size) : 0;
  e.exchange = exchange_buffer_bytes(
      plan,
      rows_only ? std::vector<int64_t>{most_lookups, most_lookups}
                : std::vector<int64_t>{std::max(local_samples, eval_users),
                                       std::max(local_samples, eval_users * L)},
      plan.dedup);
  // Per sample: the gathered rows, two activations of the widest layer, and layer 0's
  // ReLU bit mask (16 bytes per 128 columns, ops.h relu_mask_words); per eval candidate
  // also 16 bytes of lists and score, and its id and duplicate flag (5 bytes) in the
  // second slot the lists are staged through.
  const int64_t mask_bytes = cfg.layers.size() > 1 ? relu_mask_words(cfg.layers[1]) * 4 : 0;
  e.step =
      (rows_only ? 0 : local_samples * (2 * int64_t(D) * 4 + 2 * widest * 4 + 64 + mask_bytes)) +
      eval_users * L * (int64_t(D) * 4 + 2 * widest * 4 + 16 + 5 + mask_bytes);
  // Evaluation by items: its per-item arrays, and the table while they are made.
  const int64_t I = int64_t(meta.num_items);
  const int mf = cfg.num_factors, h = cfg.layers.empty() ? 0 : cfg.layers[0] / 2;
  if (cfg.layers.size() > 1 && eval_items_fit(I, mf, h, cfg.layers[1], eval_users * L))
    e.step += I * (mf + cfg.layers[1] + int64_t(D) + h) * 4;
  // Layer 0 by item in training: each sample's place in the sort and its run (8 bytes), and
  // per run its MLP columns, their product, its gradient sum in parts and the rows'
  // gradient from them (and their BF16 copies); on one rank, the items' MLP gradient by
  // item (train/step.h narrow_item_lookups).
  if (!rows_only && cfg.layers.size() > 1) {
    const int64_t runs = std::min(I, local_samples), out0 = cfg.layers[1];
    e.step += local_samples * 8 + runs * ((4 * h + 4 * out0) * 4 + 2 * (h + out0) * 2 + 8);
    if (W == 1) e.step += I * h * 4;
  }
  e.samples = local_samples;
  if (device == Device::kCuda) {
    if (!rows_only && !cfg.eval_full_ranking)  // the evaluation's lists, kept after the first
      e.step += eval_lists_cache_bytes((int64_t(meta.num_eval_users) + W - 1) / W, L);
    e.scratch =
        cuda_scratch_arena_bytes(cuda_scratch_peak_bytes(scratch_shapes(cfg, meta, plan, rank)));
    e.workspaces = cuda_fixed_bytes();
  }
  return e;
}

}  // namespace ncf
