// Trainer's evaluation: HR@K / NDCG@K over each user's list of 1 + E items, or
// against the whole item table (--eval_full_ranking); see trainer.h.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/cuda_context.h"
#include "model/metrics.h"
#include "model/ops.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"
#include "train/trainer_clock.h"

namespace ncf {

namespace {

using trainer_detail::Clock;
using trainer_detail::seconds_since;

}  // namespace

// --eval_phases: where one evaluation's time goes, for benchmarks. Each phase
// ends with a wait for the device, so its work is counted in it (and the waits slow
// the evaluation down); rank 0 prints the seconds per phase.
class EvalPhases {
 public:
  enum Phase { kPrepare, kRead, kUpload, kLookup, kScore, kMetrics, kFullRanking, kCount };
  EvalPhases(Device dev, bool lead, bool on) : dev_(dev), lead_(lead), on_(on) {
    last_ = Clock::now();
  }
  // The time since the previous end (or the start) was spent in `p`.
  void end(Phase p) {
    if (!on_) return;
#ifdef NCF_WITH_CUDA
    if (dev_ == Device::kCuda) wait_device();
#endif
    const auto now = Clock::now();
    seconds_[p] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  void report() const {
    if (!on_ || !lead_) return;
    static const char* const kNames[kCount] = {"prepare", "read",    "upload",      "lookup",
                                               "score",   "metrics", "full ranking"};
    std::string line = "ncf_dist: eval phases (rank 0, device waited after each):";
    for (int p = 0; p < kCount; ++p) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s %.3f s%s", kNames[p], seconds_[p],
                    p + 1 < kCount ? "," : "");
      line += buf;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }

 private:
  Device dev_;
  bool lead_, on_ = false;
  Clock::time_point last_;
  double seconds_[kCount] = {};
};

EvalResult Trainer::evaluate() {
  auto t0 = Clock::now();
  EvalPhases phases(ctx_.device, comm_.rank() == 0, cfg_.eval_phases);
  const int W = comm_.world();
  const int64_t L = meta_.eval_negatives + 1;
  const int64_t per_batch = std::max<int64_t>(1, cfg_.eval_batch_size / L);
  // Every rank runs the same number of batches (the exchanges are collective).
  const int64_t most = int64_t((meta_.num_eval_users + W - 1) / W);
  const int64_t batches = (most + per_batch - 1) / per_batch;
  // Full ranking: every rank scores its users against the whole item table.
  const bool full = cfg_.eval_full_ranking;
  // The lists: kept on the device by the first evaluation where eval_lists_cached(), read
  // from there by the later ones (no file, no copy).
  const bool keep = !full && eval_lists_cached();
  const bool cached = keep && eval_cache_.complete;
  if (keep && !cached) eval_cache_ = EvalListsCache{};
  if (!cached) eval_reader_->start();
  const int64_t I = int64_t(meta_.num_items);
  const int64_t group = std::max<int64_t>(1, cfg_.eval_batch_size / I);  // users scored at once
  if (full) tile_item_table(group, &full_item_tile_);
  const bool by_items = eval_by_items();
  if (by_items) prepare_eval_items();
  phases.end(EvalPhases::kPrepare);
  // The lists move to the device through eval_stager_: batch k + 1 is read (host
  // threads), copied to a pinned slot and sent on the copy stream while the device
  // scores batch k, and the metrics add up on the device (hit_ndcg_accumulate), so
  // nothing waits for the device inside the pass except full ranking's scores.
  eval_stager_->reset();  // an evaluation that threw may have left batches staged
  eval_sums_.reserve(2);
  eval_sums_.zero();
  EvalBatch batch[2];
  if (batches > 0 && !cached) {
    read_eval_batch(&batch[0]);
    phases.end(EvalPhases::kRead);
    stage_eval_batch(batch[0]);
    phases.end(EvalPhases::kUpload);
  }
  double sums[4] = {0, 0, 0, 0};
  for (int64_t k = 0; k < batches; ++k) {
    const EvalBatch& b = batch[k % 2];
    const EvalLists x = cached ? cached_eval_lists(k) : staged_eval_lists(b.num_users, keep);
    score_eval_lists(x, by_items, &phases);
    if (!cached) eval_stager_->release();
    if (full && x.n > 0) {
      rank_full_catalogue(b, group, sums + 2);
      phases.end(EvalPhases::kFullRanking);
    }
    // The next batch is read and sent while the device works on this one. Its host
    // arrays replace batch k - 1's: staged (copied, on a GPU) before this batch was.
    if (k + 1 < batches && !cached) {
      read_eval_batch(&batch[(k + 1) % 2]);
      phases.end(EvalPhases::kRead);
      stage_eval_batch(batch[(k + 1) % 2]);
      phases.end(EvalPhases::kUpload);
    }
  }
  if (keep && !cached) {
    eval_cache_.complete = true;
    report_eval_cache();
  }
  // A kernel's bad-input record (hit_ndcg raised it per batch) surfaces here, once.
  check_device_errors(ctx_);
  device_copy(Device::kCpu, sums, ctx_.device, eval_sums_.data(), 2 * sizeof(double));
  phases.end(EvalPhases::kFullRanking);  // the batches' ends: no work, nothing to wait for
  all_reduce_sum_on(comm_, Device::kCpu, sums, 4, DType::kFloat64);
  phases.report();
  EvalResult res = eval_result(sums, full);
  res.seconds = seconds_since(t0);
  return res;
}

void Trainer::read_eval_batch(EvalBatch* b) {
  const int64_t L = meta_.eval_negatives + 1;
  if (!eval_reader_->next(b)) *b = EvalBatch{};
  if (eval_selected_.empty()) return;
  // Keep the selected users of the batch (their lists move up in place).
  int64_t kept = 0;
  for (int64_t u = 0; u < b->num_users; ++u) {
    if (!eval_selected_[size_t(b->first_record + u)]) continue;
    b->users[size_t(kept)] = b->users[size_t(u)];
    std::copy_n(&b->items[u * L], L, &b->items[kept * L]);
    std::copy_n(&b->mask[u * L], L, &b->mask[kept * L]);
    ++kept;
  }
  b->num_users = kept;
}

void Trainer::stage_eval_batch(const EvalBatch& b) {
  const size_t n = size_t(b.num_users), nl = n * size_t(meta_.eval_negatives + 1);
  eval_stager_->stage({{b.users.data(), n * 4}, {b.items.data(), nl * 4}, {b.mask.data(), nl}});
}

Trainer::EvalLists Trainer::cached_eval_lists(int64_t k) const {
  EvalLists x;
  x.n = eval_cache_.n[size_t(k)];
  x.users = eval_cache_.users[size_t(k)].data();
  x.items = eval_cache_.items[size_t(k)].data();
  x.mask = eval_cache_.mask[size_t(k)].data();
  return x;
}

Trainer::EvalLists Trainer::staged_eval_lists(int64_t n, bool keep) {
  EvalLists x;
  x.n = n;
  const std::vector<const void*>& staged = eval_stager_->acquire();
  x.users = static_cast<const int32_t*>(staged[0]);
  x.items = static_cast<const int32_t*>(staged[1]);
  x.mask = static_cast<const uint8_t*>(staged[2]);
  if (keep) {  // this batch's lists, kept for the later evaluations
    const Device dev = ctx_.device;
    const size_t nl = size_t(n * (meta_.eval_negatives + 1));
    eval_cache_.n.push_back(n);
    eval_cache_.users.emplace_back(dev, size_t(n));
    eval_cache_.items.emplace_back(dev, nl);
    eval_cache_.mask.emplace_back(dev, nl);
    device_copy_async(ctx_, dev, eval_cache_.users.back().data(), dev, x.users, size_t(n) * 4);
    device_copy_async(ctx_, dev, eval_cache_.items.back().data(), dev, x.items, nl * 4);
    device_copy_async(ctx_, dev, eval_cache_.mask.back().data(), dev, x.mask, nl);
  }
  return x;
}

void Trainer::score_eval_lists(const EvalLists& x, bool by_items, EvalPhases* phases) {
  const int64_t L = meta_.eval_negatives + 1, n = x.n;
  scores_.reserve(n * L);
  if (by_items) {
    // The users' rows only; the candidates' GMF columns and layer-0 products are
    // read by id from the item table's copy here and the model's per-item table
    // (the ids were checked as the lists were read).
    tables_->lookup({{x.users, n}, {x.items, 0}});
    if (n > 0) {
      phases->end(EvalPhases::kLookup);
      model_->score_items(ctx_, tables_->rows(0), eval_gmf_, eval_gmf_ld_, x.items, n, int(L),
                          scores_.data());
    }
  } else {
    // One user row per user, shared by its L candidates; both tables in one
    // exchange, as in the training step.
    tables_->lookup({{x.users, n}, {x.items, n * L}});
    if (n > 0) {
      phases->end(EvalPhases::kLookup);
      model_->score(ctx_, tables_->rows(0), tables_->rows(1), n, int(L), scores_.data());
    }
  }
  if (n > 0) {
    phases->end(EvalPhases::kScore);
    hit_ndcg_accumulate(ctx_, scores_.data(), x.mask, n, int(L), cfg_.topk, eval_sums_.data());
    phases->end(EvalPhases::kMetrics);
  }
}

void Trainer::rank_full_catalogue(const EvalBatch& b, int64_t group, double* full) {
  const int64_t L = meta_.eval_negatives + 1, n = b.num_users;
  const int64_t I = int64_t(meta_.num_items);
  const int D = model_->config().embedding_width();
  std::vector<float> host_scores;
  std::vector<int32_t> test_items;
  std::vector<int64_t> excl_offsets;
  std::vector<int32_t> excluded;
  // The users' rows (still in tables_->rows(0)) against every item, a group
  // of users at a time; the ranks are counted on the host.
  for (int64_t a = 0; a < n; a += group) {
    const int64_t m = std::min(group, n - a);
    full_scores_.reserve(m * I);
    model_->score(ctx_, tables_->rows(0) + a * D, full_item_tile_.data(), m, int(I),
                  full_scores_.data());
    host_scores.resize(m * I);
    device_copy(Device::kCpu, host_scores.data(), ctx_.device, full_scores_.data(),
                size_t(m * I) * 4);
    test_items.resize(m);
    for (int64_t x = 0; x < m; ++x)
      test_items[x] = b.items[(a + x) * L];  // the list's first entry is the test item
    seen_items(b.users.data() + a, m, &excl_offsets, &excluded);
    double fh = 0, fn = 0;
    full_ranking_hit_ndcg(ctx_.threads, host_scores.data(), m, I, test_items.data(),
                          excl_offsets.data(), excluded.data(), cfg_.topk, &fh, &fn);
    full[0] += fh;
    full[1] += fn;
  }
}

void Trainer::report_eval_cache() const {
  if (comm_.rank() != 0) return;
  const int64_t L = meta_.eval_negatives + 1;
  int64_t bytes = 0;
  for (int64_t n : eval_cache_.n) bytes += n * (4 + 5 * L);
  std::fprintf(stderr,
               "ncf_dist: evaluation: the lists stay on the device after the first "
               "(rank 0: %.1f MiB); later evaluations read no list\n",
               double(bytes) / (1 << 20));
}

EvalResult Trainer::eval_result(const double* sums, bool full) const {
  EvalResult res;
  res.users = eval_selected_.empty() ? int64_t(meta_.num_eval_users)
                                     : std::min<int64_t>(cfg_.eval_users, meta_.num_eval_users);
  res.hr = sums[0] / double(res.users);
  res.ndcg = sums[1] / double(res.users);
  res.full = full;
  res.full_hr = sums[2] / double(res.users);
  res.full_ndcg = sums[3] / double(res.users);
  return res;
}

bool Trainer::eval_lists_cached() const {
  if (cfg_.eval_lists_cache == "off") return false;
  if (cfg_.eval_lists_cache == "on") return true;  // any device
  if (ctx_.device != Device::kCuda || cfg_.eval_only) return false;
  const int W = comm_.world();
  return eval_lists_cache_bytes(int64_t((meta_.num_eval_users + W - 1) / W),
                                meta_.eval_negatives + 1) > 0;
}

bool Trainer::eval_by_items() const {
  if (cfg_.eval_scoring == "per_sample") return false;
  if (!model_->can_score_items()) return false;
  if (parse_wire_dtype(cfg_.exchange_dtype) != WireDType::kFloat32) return false;
  const NeuMFConfig& mc = model_->config();
  const int64_t L = meta_.eval_negatives + 1;
  return eval_items_fit(int64_t(meta_.num_items), mc.mf_dim, mc.mlp_half(), mc.layers.at(1),
                        std::max<int64_t>(1, cfg_.eval_batch_size / L) * L);
}

void Trainer::prepare_eval_items() {
  const NeuMFConfig& mc = model_->config();
  const int D = mc.embedding_width(), mf = mc.mf_dim, h = mc.mlp_half();
  const int64_t I = int64_t(meta_.num_items);
  // local_rows is the same answer on every rank (W = 1 and the wire's type), so either
  // every rank joins gather_table's collective or none.
  if (const float* own = tables_->local_rows(1)) {
    eval_gmf_ = own;
    eval_gmf_ld_ = D;
    model_->prepare_items(ctx_, own + mf, D, I);
    return;
  }
  const std::vector<float> rows = tables_->gather_table(1);  // collective
  NCF_CHECK(int64_t(rows.size()) == I * D, "item table of ", rows.size(), " floats, expected ",
            I * D);
  // The whole table and its MLP columns only while the products are made (a
  // device buffer's free waits for the device).
  Buffer<float> table(ctx_.device, rows.size()), mlp(ctx_.device, size_t(I) * h);
  eval_item_gmf_.reserve(size_t(I) * mf);
  device_copy(ctx_.device, table.data(), Device::kCpu, rows.data(), rows.size() * 4);
  split_cols(ctx_, table.data(), mf, h, eval_item_gmf_.data(), mf, mlp.data(), h, I);
  eval_gmf_ = eval_item_gmf_.data();
  eval_gmf_ld_ = mf;
  model_->prepare_items(ctx_, mlp.data(), h, I);
}

void Trainer::tile_item_table(int64_t copies, Buffer<float>* tile) {
  const std::vector<float> item_rows = tables_->gather_table(1);  // collective
  const size_t bytes = item_rows.size() * sizeof(float);
  tile->reserve(size_t(copies) * item_rows.size());
  for (int64_t g = 0; g < copies; ++g)
    device_copy(ctx_.device, tile->data() + size_t(g) * item_rows.size(), Device::kCpu,
                item_rows.data(), bytes);
}

void Trainer::seen_items(const int32_t* users, int64_t m, std::vector<int64_t>* offsets,
                         std::vector<int32_t>* items) const {
  offsets->assign(1, 0);
  items->clear();
  for (int64_t x = 0; x < m; ++x) {
    const uint64_t u = uint64_t(users[x]);
    items->insert(items->end(), positives_->begin(u), positives_->end(u));
    offsets->push_back(int64_t(items->size()));
  }
}
}  // namespace ncf
