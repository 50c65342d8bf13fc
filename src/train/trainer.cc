// The epoch loop around train_step and the memory check: see trainer.h. Evaluation
// is in trainer_eval.cc, checkpoints and the warm start in trainer_checkpoint.cc.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "comm/bootstrap.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/memory.h"
#include "common/philox.h"
#include "data/negatives.h"
#include "embedding/exchange_model.h"
#include "model/ops.h"
#include "train/checkpoint.h"
#include "train/memory_estimate.h"
#include "train/tensorboard.h"
#include "train/trainer_clock.h"

namespace ncf {

namespace {

// Training steps of each route --exchange auto times (after one untimed of each).
constexpr int kRouteTrialRounds = 3;

using trainer_detail::Clock;
using trainer_detail::seconds_since;

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", b / double(1ull << 30));
  return buf;
}

}  // namespace

namespace {
// Samples one rank looks up per step (rounded up): the planners' lookup count.
int64_t samples_per_rank(const TrainConfig& cfg, int W) {
  const int S = cfg.num_neg + 1;
  return (cfg.batch_size / S) * S / std::max(1, W) + 1;
}
}  // namespace

EmbeddingPlan plan_for_job(const TrainConfig& cfg, const DatasetMeta& meta, int W) {
  PlanRequest req;
  req.D = cfg.num_factors + cfg.layers[0] / 2;
  req.W = W;
  req.tables = {{"user", int64_t(meta.num_users), Placement::kRowWise, 0, 1, 0.01f},
                {"item", int64_t(meta.num_items), Placement::kRowWise, 0, 2, 0.01f}};
  req.lookups_per_rank = samples_per_rank(cfg, W);
  req.optimizer = parse_embedding_optimizer(cfg.embedding_optimizer);
  req.forced = cfg.shard_plan;
  req.dedup = cfg.dedup;
  req.payload_bytes = wire_dtype_bytes(parse_wire_dtype(cfg.exchange_dtype));
  req.table_elem_bytes = cfg.table_dtype == "bf16" ? 2 : 4;
  return plan_tables(req);
}

namespace {

// Memory (train/memory_estimate.h): tables and state, their exchange buffers,
// the tower's step buffers and the eval buffers, and on a GPU the scratch arena at
// its largest and the context's workspaces. On a GPU rank the limit is what
// cudaMemGetInfo reports free, shared among the local ranks on that physical GPU.
// Returns the rank's estimate; fails, naming where the memory goes, when a table
// alone or the whole does not fit.
// The host tier's decision (--device_table_budget) for this rank: its cache in rows (0:
// every row on the device) and the start-up line saying why. auto keeps the rows on the
// device where the whole estimate fits the limit, and on a GPU otherwise gives the cache
// what the rest of the estimate leaves of the limit.
int64_t decide_cache_slots(const TrainConfig& cfg, const EmbeddingPlan& plan, int rank,
                           EmbeddingOptimizer kind, const MemoryEstimate& est, int64_t limit,
                           bool on_gpu, std::string* reason) {
  int64_t rows = 0, table_bytes = 0;
  for (const TableSpec& t : plan.tables) rows += table_rank_rows(t, rank, plan.W);
  for (int64_t b : est.tables) table_bytes += b;
  const int64_t row_bytes =
      EmbeddingCollection::cache_row_bytes(plan.D, plan.table_elem_bytes, kind);
  const TableBudget budget = parse_table_budget(cfg.device_table_budget);
  int64_t slots = 0;
  if (budget.kind == TableBudget::kAuto) {
    if (!on_gpu || est.total() <= limit) {
      *reason = "all rows on the " + std::string(on_gpu ? "GPU" : "host") + " (" +
                gib(double(table_bytes)) + " of tables per rank)";
      return 0;
    }
    const int64_t left = limit - (est.total() - table_bytes);
    NCF_REQUIRE(kind != EmbeddingOptimizer::kDenseAdam && left > row_bytes, "rank ", rank,
                " needs about ", gib(double(est.total())), " on its GPU with ",
                gib(double(table_bytes)), " of tables, more than the ", gib(double(limit)),
                " it may use; ",
                kind == EmbeddingOptimizer::kDenseAdam
                    ? "a host tier (--device_table_budget) would hold them in host memory, but "
                      "dense Adam updates every row every step: use --embedding_optimizer "
                      "rowwise_adagrad, adagrad, sgd or lazy_adam, or more ranks"
                    : "even without the tables the rest does not fit: use more ranks or a "
                      "smaller --batch_size");
    slots = left * 9 / 10 / row_bytes;  // a tenth kept for what the estimate misses
  } else if (budget.kind == TableBudget::kPercent) {
    slots = std::max<int64_t>(1, int64_t(std::ceil(double(rows) * budget.value / 100.0)));
  } else {
    slots = int64_t(budget.value) / row_bytes;
    NCF_REQUIRE(slots >= 1, "flag --device_table_budget ", cfg.device_table_budget,
                " holds no row: one row with its ", optimizer_name(kind), " state takes ",
                row_bytes, " bytes");
  }
  NCF_REQUIRE(kind != EmbeddingOptimizer::kDenseAdam, "flag --device_table_budget ",
              cfg.device_table_budget,
              ": the host tier keeps only the rows a step touches on the device, and dense "
              "Adam updates every row every step; use --embedding_optimizer sgd, adagrad, "
              "rowwise_adagrad or lazy_adam with it");
  slots = std::max<int64_t>(1, std::min(slots, std::max<int64_t>(rows, 1)));
  char line[256];
  std::snprintf(line, sizeof line,
                "host tier: %lld of rank 0's %lld rows (%.1f%%, %.1f MiB) cached on the %s, the "
                "rest in host memory; ids announced %s steps ahead",
                (long long)slots, (long long)rows, rows ? 100.0 * double(slots) / double(rows) : 0,
                double(slots * row_bytes) / double(1 << 20), on_gpu ? "GPU" : "host (an arena)",
                cfg.lookahead_steps < 0 ? "auto (decided at the first step)"
                                        : std::to_string(cfg.lookahead_steps).c_str());
  *reason = std::string(line) +
            (budget.kind == TableBudget::kAuto
                 ? " (--device_table_budget auto: " + gib(double(table_bytes)) +
                       " of tables do not fit the " + gib(double(limit)) + " this rank may use)"
                 : "");
  return slots;
}

int64_t check_rank_memory(const TrainConfig& cfg, const DatasetMeta& meta,
                          const EmbeddingPlan& plan, Communicator& comm, const ExecContext& ctx,
                          const NeuMFConfig& mc, bool rows_only, EmbeddingOptimizer trained_with,
                          EmbeddingOptimizer kind, int64_t* cache_slots, std::string* tier) {
  const int r = comm.rank();
  const int D = mc.embedding_width();
  MemoryEstimate est = estimate_rank_memory(cfg, meta, plan, r, ctx.device);
  const MemoryInfo mem = device_memory(ctx, comm.local_world());
  const bool on_gpu = ctx.device == Device::kCuda;
  const int64_t limit = cfg.memory_limit_gb > 0
                            ? int64_t(cfg.memory_limit_gb * double(1ull << 30))
                            : mem.free / (on_gpu ? mem.sharing : std::max(1, comm.local_world()));
  const int64_t own = decide_cache_slots(cfg, plan, r, kind, est, limit, on_gpu, tier);
  int64_t rows = 0;
  for (const TableSpec& t : plan.tables) rows += table_rank_rows(t, r, plan.W);
  *cache_slots = agreed_cache_slots(gather_all<int64_t>(comm, {own}), r, rows);
  if (*cache_slots != own)
    *tier = "host tier: every one of rank " + std::to_string(r) + "'s " + std::to_string(rows) +
            " rows cached on the GPU, whose tables fit, because another rank's do not "
            "(--device_table_budget auto; the host tier is on every rank or none)";
  if (*cache_slots > 0 && on_gpu) {
    // The device holds the cache instead of the tables (the home arrays are host memory).
    const double share = rows ? std::min(1.0, double(*cache_slots) / double(rows)) : 1.0;
    for (int64_t& b : est.tables) b = int64_t(double(b) * share);
  }
  const std::vector<int64_t>& tables = est.tables;
  const int64_t total = est.total();
  const std::string gpu_name =
      "GPU " + std::to_string(mem.gpu) + (mem.gpu_id.empty() ? "" : " (PCI " + mem.gpu_id + ")");
  const std::string where =
      cfg.memory_limit_gb > 0 ? std::string("--memory_limit_gb says it may use")
      : on_gpu ? gpu_name + " has " + gib(double(mem.free)) + " free of " + gib(double(mem.total)) +
                     " for " + std::to_string(mem.sharing) + " rank(s), so it may use"
               : "the host has " + gib(double(mem.free)) + " available for " +
                     std::to_string(comm.local_world()) + " local rank(s), so it may use";
  const std::string advice =
      ": use more ranks, a row-wise --shard_plan, a smaller --batch_size or "
      "--eval_batch_size, or raise --memory_limit_gb";
  for (size_t k = 0; k < tables.size(); ++k)
    if (tables[k] > limit) {
      const TableSpec& spec = plan.tables[k];
      NCF_FAIL("rank ", r, " needs about ", gib(double(tables[k])), " for table ", spec.name,
               " alone (", spec.num_rows, " rows x ", D, ", ", placement_name(spec.placement),
               rows_only ? std::string(", rows only")
                         : std::string(", with ") + optimizer_name(trained_with) + " state",
               ") on its ", device_name(ctx.device), ", but ", where, " ", gib(double(limit)),
               advice);
    }
  if (total > limit)
    NCF_FAIL("rank ", r, " needs about ", gib(double(total)), " on its ", device_name(ctx.device),
             " (user table ", gib(double(tables[0])), ", item table ", gib(double(tables[1])),
             ", exchange buffers ", gib(double(est.exchange)), ", step and eval buffers ",
             gib(double(est.step)), " for ", est.samples, " samples",
             on_gpu ? ", scratch and workspaces " + gib(double(est.scratch + est.workspaces))
                    : std::string(),
             "), but ", where, " ", gib(double(limit)), advice);
  return total;
}

// --eval_users: 1 for each user evaluated, in user id order.
std::vector<uint8_t> select_eval_users(const TrainConfig& cfg, const DatasetMeta& meta) {
  // A fixed subset of exactly eval_users users (selection sampling over the
  // user ids in order, keyed by the seed): the same on every rank and any W.
  const uint64_t U = meta.num_eval_users;
  const uint64_t want = std::min<uint64_t>(uint64_t(cfg.eval_users), U);
  const CounterRng rng{cfg.seed, kStreamEvalUsers, 0};
  std::vector<uint8_t> selected(U, 0);
  uint64_t chosen = 0;
  for (uint64_t u = 0; u < U && chosen < want; ++u)
    if (rng.uniform_double(u) * double(U - u) < double(want - chosen)) {
      selected[u] = 1;
      ++chosen;
    }
  return selected;
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, const ExecContext& ctx)
    : cfg_(cfg), comm_(comm), ctx_(ctx) {
  meta_ = DatasetMeta::load(cfg.data_dir);
  const int W = comm.world(), r = comm.rank();
  if (r == 0 && !meta_.unsealed_warning.empty())
    std::fprintf(stderr, "warning: %s\n", meta_.unsealed_warning.c_str());
  const int S = cfg.num_neg + 1;
  P_ = cfg.batch_size / S;
  if (P_ > int64_t(meta_.num_train))
    NCF_FAIL("flag --batch_size ", cfg.batch_size, " asks for ", P_, " positives per step but ",
             cfg.data_dir, " holds only ", meta_.num_train, " training positives");
  if (P_ < W)
    NCF_FAIL("flag --batch_size ", cfg.batch_size, " gives ", P_,
             " positives per step, fewer "
             "than the ",
             W, " ranks");

  EmbeddingOptimizerConfig eopt;
  eopt.kind = parse_embedding_optimizer(cfg.embedding_optimizer);
  const float elr = float(effective_embedding_lr(cfg));
  eopt.adam = {elr, float(cfg.beta1), float(cfg.beta2), float(cfg.epsilon),
               float(cfg.l2_embedding)};
  // Adagrad's accumulators start at Keras's 0.1, row-wise Adagrad's at FBGEMM's 0
  // (its first step then has the size of the learning rate, as Adam's has),
  // unless --adagrad_init says otherwise.
  const double acc0 = cfg.adagrad_init >= 0                              ? cfg.adagrad_init
                      : eopt.kind == EmbeddingOptimizer::kRowwiseAdagrad ? 0.0
                                                                         : 0.1;
  eopt.adagrad = {elr, float(acc0), 1e-7f, float(cfg.l2_embedding)};
  eopt.sgd = {elr, float(cfg.l2_embedding)};
  state_.dense_hyper = {float(cfg.learning_rate), float(cfg.beta1), float(cfg.beta2),
                        float(cfg.epsilon), float(cfg.l2_dense)};

  // Evaluating a checkpoint and serving (--eval_only, ncf_recommend) need the
  // tables' rows only: their optimizer state is neither allocated nor read,
  // which divides the tables' memory by 3 with Adam (by 2 with Adagrad). The
  // plan stays the training one.
  const bool rows_only = cfg.eval_only;
  const EmbeddingOptimizer trained_with = eopt.kind;
  if (rows_only) eopt.kind = EmbeddingOptimizer::kSgd;  // no state arrays
  table_optimizer_ = eopt.kind;
  plan_ = plan_for_job(cfg, meta_, W);

  NeuMFConfig mc;
  mc.mf_dim = cfg.num_factors;
  mc.layers = cfg.layers;
  mc.validate();

  memory_bytes_ = check_rank_memory(cfg, meta_, plan_, comm, ctx, mc, rows_only, trained_with,
                                    eopt.kind, &cache_slots_, &tier_reason_);
  const int64_t L = meta_.eval_negatives + 1;
  const int64_t eval_users = std::max<int64_t>(1, cfg.eval_batch_size / L);

  if (!rows_only)
    train_reader_ =
        std::make_unique<TrainReader>(cfg.data_dir, meta_, r, W, P_, cfg.seed, cfg.shuffle_records);
  // GPU ranks leave their cores idle while the device scores: the eval lists
  // (decoded and checked on the host) are read by all of them, or a host thread's
  // pace (about 175k lists of 1,000 a second) would set the evaluation's. CPU ranks'
  // threads are scoring then, so their reader stays on its one thread.
  eval_reader_ = std::make_unique<EvalReader>(cfg.data_dir, meta_, r, W, eval_users, 4,
                                              ctx.device == Device::kCpu ? 1 : ctx.threads);
  positives_ = std::make_unique<PositiveLists>(cfg.data_dir, meta_);
  if (ctx.device != Device::kCpu)
    device_positives_ = std::make_unique<DevicePositiveLists>(*positives_, ctx.device);

  tables_ =
      std::make_unique<EmbeddingCollection>(plan_, comm, ctx, eopt, plan_.dedup, cache_slots_);
  tables_->set_exchange_dtype(parse_wire_dtype(cfg.exchange_dtype));
  choose_exchange_across_nodes();
  tables_->init(cfg.seed);
  tables_->set_chunk_bytes(cfg.checkpoint_chunk_kib * 1024);
  if (tables_->host_tier()) {
    lookahead_ = cfg.lookahead_steps;
    tables_->probe_copies(&copy_in_gbps_, &copy_out_gbps_);
    char line[160];
    std::snprintf(line, sizeof line,
                  "; rows with their state copy at %.2f GB/s to the cache and %.2f GB/s home "
                  "(rank 0, measured at start-up)",
                  copy_in_gbps_, copy_out_gbps_);
    tier_reason_ += line;
  }
  model_ = std::make_unique<NeuMF>(mc, ctx.device);
  model_->init(cfg.seed);
  state_.positives = positives_.get();
  state_.device_positives = device_positives_.get();
  state_.num_items = int64_t(meta_.num_items);
  state_.num_neg = cfg.num_neg;
  state_.seed = cfg.seed;
  state_.tables = tables_.get();
  state_.model = model_.get();
  state_.allocate(ctx);
  eval_stager_ = std::make_unique<ArrayStager>(ctx, 3);  // users, candidates, masks
  eval_sums_ = Buffer<double>(ctx.device, 0);
  scores_ = Buffer<float>(ctx.device, 0);
  for (Buffer<float>* b : {&full_item_tile_, &full_scores_, &eval_item_gmf_})
    *b = Buffer<float>(ctx.device, 0);
  if (cfg.eval_users > 0) eval_selected_ = select_eval_users(cfg, meta_);
  step_loss_ = Buffer<double>(ctx.device, 0);
  stager_ = std::make_unique<InputStager>(ctx);
  timer_ = std::make_unique<StepTimer>(ctx);
  if (cfg.cuda_graph == "on" && !rows_only) {
    std::string why = step_graph_refusal(ctx.device, W, cfg.table_dtype == "bf16");
    if (why.empty() && cache_slots_ > 0)
      why =
          "the host tier loads rows between steps on the host's orders, which a graph cannot "
          "hold";
    if (why.empty()) {
      graph_ = std::make_unique<StepGraph>(ctx);
      graph_reason_ = "on (each step after the first of its size captured and launched whole)";
    } else {
      graph_reason_ = "off (" + why + ")";
    }
  }
  last_checkpoint_ = Clock::now();
}

Trainer::~Trainer() = default;

std::vector<int64_t> Trainer::table_bytes() const {
  std::vector<int64_t> b;
  for (const TableSpec& t : plan_.tables)
    b.push_back(table_rank_bytes(t, plan_.D, comm_.rank(), comm_.world(), table_optimizer_,
                                 plan_.table_elem_bytes));
  return b;
}

void Trainer::step(const TrainBatch& b, int64_t index, EpochResult* r, const Drawn* drawn) {
  timer_->begin(b.step);
  if (tables_->host_tier()) {
    // The rows the lookahead did not load in time, loaded now, and on a GPU the wait for
    // the side stream's loads: the step's wait (on a CPU rank without loads, the
    // bookkeeping's moment counts as compute).
    const bool waited = tables_->stage_step();
    timer_->mark(waited ? StepPhase::kTierWait : StepPhase::kCompute);
  }
  // The positives, staged on the device while the previous step ran.
  const InputStager::Staged in = stager_->acquire();
  const int64_t n = int64_t(b.users.size());
  NCF_CHECK(in.n == n, "staged batch has ", in.n, " positives, the step ", n);
  StepBatch batch{in.users, in.items, n, b.slice_begin, b.epoch, b.step_count};
  if (drawn && ctx_.device == Device::kCpu) {
    batch.drawn_users = drawn->users.data();
    batch.drawn_items = drawn->items.data();
    batch.drawn_labels = drawn->labels.data();
  }
  // The stager's slot is released once the negatives are sampled from it; the
  // step enqueues its work in order, so releasing after the call is as safe.
  // The requests of this step: a stop (signal), and rank 0's clock saying a
  // timed checkpoint is due. Their sums over the ranks come back with the step.
  if (checkpointing()) {
    control_.requests[kRequestStop] = stop_flag_ && *stop_flag_ ? 1.0f : 0.0f;
    const double minutes =
        std::chrono::duration<double>(Clock::now() - last_checkpoint_).count() / 60.0;
    control_.requests[kRequestCheckpoint] = comm_.rank() == 0 &&
                                                    cfg_.checkpoint_every_minutes > 0 &&
                                                    minutes >= cfg_.checkpoint_every_minutes
                                                ? 1.0f
                                                : 0.0f;
  }
  if (trial_.active) route_trial_before_step(b.step);
  StepReport rep;
  const bool graphed = graph_ && graph_->capture_next(n);
  auto enqueue = [&] {
    rep = train_step(state_, batch, comm_, ctx_, step_loss_.data() + index,
                     graphed ? nullptr : timer_.get(), checkpointing() ? &control_ : nullptr);
  };
  if (graphed) {
    // One launch: the step's time is all compute (no phase marks inside a graph).
    graph_->launch(enqueue);
    timer_->mark(StepPhase::kCompute);
  } else {
    enqueue();
  }
  stager_->release();
  timer_->end();
  r->bytes_sent += rep.bytes_sent;
  r->intra_msgs += rep.intra_msgs;
  r->intra_bytes += rep.intra_bytes;
  r->inter_msgs += rep.inter_msgs;
  r->inter_bytes += rep.inter_bytes;
  r->samples += rep.samples;
  ++tb_window_.steps;
  tb_window_.samples += rep.samples;
  pending_logs_.push_back({b.step, rep.samples, rep.bytes_sent, rep.collectives, rep.intra_msgs,
                           rep.intra_bytes, rep.inter_msgs, rep.inter_bytes});
  account_step_times(false, r);
  if (trial_.active) route_trial_after_step(r);
}

void Trainer::route_trial_before_step(int64_t step) {
  // 0: flat and 1: two-hop untimed, then alternating, timed.
  const int route = trial_.issued % 2;
  comm_.set_exchange(route ? ExchangeKind::kTwoHop : ExchangeKind::kFlat);
  if (trial_.issued >= 2) trial_.route[step] = route;
}

void Trainer::route_trial_after_step(EpochResult* r) {
  if (++trial_.issued < 2 * (1 + kRouteTrialRounds)) return;
  account_step_times(true, r);  // every trial step's time is in trial_.seconds now
  double sums[2] = {trial_.seconds[0], trial_.seconds[1]};
  all_reduce_sum_on(comm_, Device::kCpu, sums, 2, DType::kFloat64);
  ExchangeTiming t;
  t.rounds = kRouteTrialRounds;
  t.flat_s = sums[0] / comm_.world() / kRouteTrialRounds;
  t.two_hop_s = sums[1] / comm_.world() / kRouteTrialRounds;
  const ExchangeChoice c = choose_exchange(trial_.shape, trial_.links, "auto", cfg_.dedup, &t);
  comm_.set_exchange(c.two_hop ? ExchangeKind::kTwoHop : ExchangeKind::kFlat);
  trial_.active = false;
  exchange_reason_ = c.reason.rfind("exchange ", 0) == 0 ? c.reason.substr(9) : c.reason;
  if (comm_.rank() == 0) {
    std::printf("ncf_dist: exchange: %s\n", exchange_reason_.c_str());
    std::fflush(stdout);
  }
}

void Trainer::account_step_times(bool wait_all, EpochResult* r) {
  for (const StepTimes& st : timer_->take_finished(wait_all)) {
    const double x = st.seconds[int(StepPhase::kExchange)];
    const auto timed = trial_.route.find(st.step);
    if (timed != trial_.route.end()) {
      trial_.seconds[timed->second] += x;
      trial_.route.erase(timed);
    }
    const double c = st.seconds[int(StepPhase::kCompute)];
    const double a = st.seconds[int(StepPhase::kAllreduce)];
    r->exchange_seconds += x;
    r->compute_seconds += c;
    r->allreduce_seconds += a;
    tier_wait_seconds_ += st.seconds[int(StepPhase::kTierWait)];
    for (int k = 0; k < kStepPhases; ++k) tb_window_.phase[k] += st.seconds[k];
    NCF_CHECK(!pending_logs_.empty() && pending_logs_.front().step == st.step,
              "step timer returned step ", st.step, " out of order");
    const PendingLog l = pending_logs_.front();
    pending_logs_.pop_front();
    if (cfg_.step_log && comm_.rank() == 0)
      std::printf(
          "step %lld: %lld samples, exchange %.2f ms, compute %.2f ms, allreduce %.2f ms, "
          "%lld collectives, %lld bytes sent by rank 0 (exchanges: intra-node %lld msgs %lld "
          "bytes, inter-node %lld msgs %lld bytes)\n",
          (long long)l.step, (long long)l.samples, x * 1e3, c * 1e3, a * 1e3,
          (long long)l.collectives, (long long)l.bytes, (long long)l.intra_msgs,
          (long long)l.intra_bytes, (long long)l.inter_msgs, (long long)l.inter_bytes);
  }
}

void Trainer::choose_exchange_across_nodes() {
  const int W = comm_.world();
  const int S = cfg_.num_neg + 1;
  // Lookups per rank and step: one user row per positive, one item row per sample.
  const int64_t samples = samples_per_rank(cfg_, W);
  bool routed = false;
  std::vector<std::pair<int64_t, int64_t>> tables;  // rows, lookups of the routed tables
  for (const TableSpec& t : plan_.tables)
    if (W > 1 && t.placement != Placement::kReplicated) {
      routed = true;
      tables.push_back({t.num_rows, t.name == "user" ? samples / S + 1 : samples});
    }
  if (!routed) {
    exchange_reason_ = W > 1 ? "none (every table replicated)" : "";
    return;
  }
  const NodeMap& nodes = comm_.node_map();
  const std::string unavailable = nodes.two_hop_unavailable();
  if (!unavailable.empty()) {
    // Every rank sees the same map, so every rank stays flat.
    exchange_reason_ = std::string("flat (") +
                       (cfg_.exchange == "two_hop" ? "two_hop asked, " : "") +
                       "two-hop impossible: " + unavailable +
                       (plan_.node_dedup ? "; node dedup off with it, rank dedup on" : "") + ")";
    return;
  }
  ExchangeShape shape;
  shape.nodes = nodes.nodes();
  shape.per_node = W / shape.nodes;
  shape.D = plan_.D;
  shape.payload_bytes = plan_.payload_bytes;
  // Keys a rank sends (after rank dedup) and the share a node's dedup keeps.
  double keys = 0, rank_unique = 0, node_unique = 0;
  for (const auto& [rows, n] : tables) {
    const double u = expected_unique(rows, n);
    keys += plan_.dedup ? u : double(n);
    rank_unique += shape.per_node * u;
    node_unique += expected_node_unique_share(rows, n, shape.per_node) * shape.per_node * u;
  }
  shape.keys_per_rank = int64_t(keys);
  shape.node_unique_share = rank_unique > 0 ? node_unique / rank_unique : 1.0;
  const LinkLevels links = parse_topology(cfg_.topology, ctx_.device == Device::kCuda);
  const ExchangeChoice c = choose_exchange(shape, links, cfg_.exchange, cfg_.dedup);
  if (exchange_is_measured(shape, cfg_.exchange, cfg_.dedup)) {
    // auto times the run's own first steps on both routes and keeps the faster
    // (route_trial_after_step); the routes deliver the same bytes.
    trial_.active = true;
    trial_.shape = shape;
    trial_.links = links;
    comm_.set_exchange(ExchangeKind::kFlat);
    tables_->set_node_dedup(false);
    const size_t at = c.reason.find("predicted");
    exchange_reason_ = "flat, then the faster route (auto: the first " +
                       std::to_string(2 * (1 + kRouteTrialRounds)) +
                       " training steps alternate flat and two-hop, and their exchange times "
                       "decide)" +
                       (at == std::string::npos ? std::string() : "; " + c.reason.substr(at));
    return;
  }
  comm_.set_exchange(c.two_hop ? ExchangeKind::kTwoHop : ExchangeKind::kFlat);
  tables_->set_node_dedup(c.two_hop && c.node_dedup && plan_.node_dedup);
  // The model's line begins "exchange <what> (...)"; the startup prefix says "exchange:".
  exchange_reason_ = c.reason.rfind("exchange ", 0) == 0 ? c.reason.substr(9) : c.reason;
}

EpochResult Trainer::train_epoch(int64_t epoch, int64_t first_step) {
  EpochResult r;
  r.epoch = epoch;
  // mpirun hands rank 0 a pseudo-terminal, so "auto" stays quiet under a launcher.
  const bool launched = !detect_launcher().empty() || std::getenv("SLURM_STEP_ID");
  const bool show = comm_.rank() == 0 &&
                    (cfg_.progress == "on" || (cfg_.progress == "auto" && isatty(1) && !launched));
  NCF_CHECK(train_reader_, "train_epoch: this trainer was built to evaluate only (--eval_only)");
  int64_t steps = train_reader_->steps_per_epoch();
  if (cfg_.max_steps > 0) steps = std::min(steps, cfg_.max_steps);
  auto t0 = Clock::now();
  auto last_print = t0;
  tb_window_.begin = first_step;
  tb_window_.since = t0;
  train_reader_->start_epoch(epoch);
  stager_->reset();  // nothing survives an epoch that ended in an error
  tables_->forget_announced();
  timer_->reset();
  pending_logs_.clear();
  step_loss_.reserve(size_t(std::max<int64_t>(steps, 1)));
  step_loss_.zero();
  NCF_CHECK(first_step >= 0, "epoch ", epoch + 1, " cannot start at step ", first_step);
  // Only a resumed epoch starts past step 0, where the checkpoint's manifest said so.
  NCF_REQUIRE(first_step <= steps, "checkpoint ", resumed_from_, " was taken ", first_step,
              " steps into epoch ", epoch + 1, ", which has ", steps,
              " steps with this dataset and these flags: its manifest does not belong to them");
  if (first_step > 0) {
    // A resumed epoch: the loss shares of the steps taken before the
    // checkpoint, and the reader moved past their records.
    NCF_CHECK(int64_t(resumed_loss_.size()) == first_step, "resumed epoch: ", resumed_loss_.size(),
              " loss shares for ", first_step, " steps");
    device_copy(ctx_.device, step_loss_.data(), Device::kCpu, resumed_loss_.data(),
                resumed_loss_.size() * 8);
    TrainBatch skipped;
    for (int64_t s = 0; s < first_step; ++s)
      NCF_CHECK(train_reader_->next(&skipped), "train reader ended after ", s, " of ", steps,
                " steps");
  }
  // Step s + 1 is read and staged (its copy to the device issued) before step s
  // is enqueued. With a host tier, step s + k (k = --lookahead_steps) is read too and its
  // ids announced to the rows' owners, which start loading its rows.
  int64_t ahead = tables_->host_tier() ? lookahead_ : 0;
  const bool decide = ahead < 0;  // --lookahead_steps auto, at the first step
  if (decide) ahead = 0;
  const int64_t depth = (decide ? kMaxAutoLookahead : ahead) + 2;
  std::vector<TrainBatch> batches(static_cast<size_t>(depth));
  drawn_.resize(static_cast<size_t>(depth));
  int64_t read = first_step, announced = first_step;
  auto read_upto = [&](int64_t last) {
    for (; read <= std::min(last, steps - 1); ++read)
      NCF_CHECK(train_reader_->next(&batches[size_t(read % depth)]), "train reader ended after ",
                read, " of ", steps, " steps");
  };
  auto announce_upto = [&](int64_t last) {
    if (!tables_->host_tier()) return;
    read_upto(last);
    for (; announced <= std::min(last, steps - 1); ++announced)
      announce_step(batches[size_t(announced % depth)], &drawn_[size_t(announced % depth)]);
  };
  read_upto(first_step);
  if (first_step < steps) stager_->stage(batches[size_t(first_step % depth)]);
  for (int64_t s = first_step; s < steps; ++s) {
    if (s + 1 < steps) {
      read_upto(s + 1);
      stager_->stage(batches[size_t((s + 1) % depth)]);
    }
    if (decide && s == first_step) {
      announce_upto(s);
      ahead = choose_lookahead();
    }
    announce_upto(s + ahead);
    step(batches[size_t(s % depth)], s, &r,
         tables_->host_tier() ? &drawn_[size_t(s % depth)] : nullptr);
    ++r.steps;
    position_ = {epoch, s + 1};
    if (tb_windows() && state_.t % cfg_.tensorboard_every_steps == 0) log_train_window(s, &r);
    if (checkpointing()) {
      const bool stop = control_.sums[kRequestStop] > 0;
      const bool due =
          control_.sums[kRequestCheckpoint] > 0 ||
          (cfg_.checkpoint_every_steps > 0 && state_.t % cfg_.checkpoint_every_steps == 0);
      if (stop || due) save_checkpoint(epoch, s + 1);
      if (stop) {
        tables_->forget_announced();  // the steps read ahead will not run
        account_step_times(true, &r);
        r.stopped = true;
        r.train_seconds = seconds_since(t0);
        return r;
      }
    }
    if (show && seconds_since(last_print) > 0.5) {
      last_print = Clock::now();
      double el = seconds_since(t0);
      std::printf("\r  epoch %lld: step %lld/%lld  %.2fM samples/s  ", (long long)epoch + 1,
                  (long long)s + 1, (long long)steps, double(r.samples) / el / 1e6);
      std::fflush(stdout);
    }
  }
  if (show) std::printf("\r%70s\r", "");
  // Bad input a kernel met in the last steps, if any, is reported first. Its wait
  // for the compute stream (interruptible, like every host wait) also passes every
  // step's timing events, so reading the times below waits no more.
  check_device_errors(ctx_);
  account_step_times(true, &r);
  // The loss shares come back once per epoch; summed over ranks, each step's
  // shares give that step's mean loss over its global batch, and the epoch loss
  // is the mean of the step losses.
  std::vector<double> shares(static_cast<size_t>(steps));  // every step's, resumed ones too
  device_copy(Device::kCpu, shares.data(), ctx_.device, step_loss_.data(), shares.size() * 8);
  double loss_sum = 0;
  for (double x : shares) loss_sum += x;
  double sums[1] = {loss_sum};
  all_reduce_sum_on(comm_, Device::kCpu, sums, 1, DType::kFloat64);
  r.train_seconds = seconds_since(t0);
  r.loss = steps ? sums[0] / double(steps) : 0;
  if (tables_->host_tier()) tier_counters_over_ranks(&r);
  if (tb_windows()) {
    // The training scalars' window goes on in the next epoch: this one's part of it.
    for (int64_t k = tb_window_.begin; k < steps; ++k) tb_window_.loss += shares[size_t(k)];
    tb_window_.seconds += seconds_since(tb_window_.since);
  }
  return r;
}

void Trainer::tier_counters_over_ranks(EpochResult* r) {
  // Each counter's largest value over the ranks.
  const RowCache::Counters& c = *tables_->cache_counters();
  const std::vector<double> all = gather_all<double>(
      comm_, {double(c.steps), double(c.waits), double(c.loads), double(c.waited_loads),
              double(c.evictions), double(c.evicted_in_window), double(c.most_window_rows),
              double(c.most_step_rows), double(c.parallel_passes), tier_wait_seconds_,
              tier_host_seconds_});
  const size_t K = all.size() / size_t(comm_.world());
  std::vector<double> most(K, 0.0);
  for (size_t p = 0; p < size_t(comm_.world()); ++p)
    for (size_t k = 0; k < K; ++k) most[k] = std::max(most[k], all[p * K + k]);
  auto n = [&](int k) { return int64_t(most[size_t(k)]); };
  r->host_tier = true;
  r->tier = {n(0), n(1), n(2), n(3), n(4), n(5), n(6), n(7), n(8)};
  r->tier_wait_seconds = most[9];
  r->tier_host_seconds = most[10];
}

int64_t Trainer::choose_lookahead() {
  // The most step rows and the least cache of any rank.
  const std::vector<int64_t> v =
      gather_all<int64_t>(comm_, {tables_->window_rows(), tables_->cache_slots()});
  int64_t rows = 0, cache = INT64_MAX;
  for (size_t p = 0; p < size_t(comm_.world()); ++p) {
    rows = std::max(rows, v[2 * p]);
    cache = std::min(cache, v[2 * p + 1]);
  }
  int64_t k = 0;
  while (k < kMaxAutoLookahead && (k + 2) * rows <= cache / 10 * 9) ++k;
  lookahead_ = k;
  if (comm_.rank() == 0) {
    std::printf(
        "ncf_dist: host tier: ids announced %lld steps ahead (--lookahead_steps auto: the "
        "first step touched at most %lld rows of a rank, the smallest cache holds %lld; the "
        "largest k up to %lld with (k + 1) x %lld <= 90%% of %lld, else 0)\n",
        (long long)k, (long long)rows, (long long)cache, (long long)kMaxAutoLookahead,
        (long long)rows, (long long)cache);
    std::fflush(stdout);
  }
  return k;
}

void Trainer::announce_step(const TrainBatch& b, Drawn* d) {
  const Clock::time_point t0 = Clock::now();
  const int64_t n = int64_t(b.users.size());
  const int64_t B = n * (cfg_.num_neg + 1);
  d->users.resize(static_cast<size_t>(B));
  d->items.resize(static_cast<size_t>(B));
  d->labels.resize(static_cast<size_t>(B));
  ExecContext host;
  host.threads = ctx_.threads;
  // The draw train_step makes on this rank's device: keyed by (seed, epoch, sample). A CPU
  // rank's step takes these samples instead of drawing them again.
  sample_negatives(host, *positives_, meta_.num_items, b.users.data(), b.items.data(),
                   b.slice_begin, n, cfg_.num_neg, cfg_.seed, b.epoch, d->users.data(),
                   d->items.data(), d->labels.data());
  tables_->announce({{b.users.data(), n}, {d->items.data(), B}});
  tier_host_seconds_ += seconds_since(t0);
}

void Trainer::log_train_window(int64_t last, EpochResult* r) {
  // Every rank: the window's step times, read once the device has passed them
  // (the interruptible wait first, as at the end of an epoch), and its loss
  // shares, summed over the ranks. A host wait every N steps on GPU ranks.
  check_device_errors(ctx_);
  account_step_times(true, r);
  std::vector<double> shares(static_cast<size_t>(last + 1 - tb_window_.begin));
  device_copy(Device::kCpu, shares.data(), ctx_.device, step_loss_.data() + tb_window_.begin,
              shares.size() * 8);
  double sums[1] = {tb_window_.loss};
  for (double x : shares) sums[0] += x;
  all_reduce_sum_on(comm_, Device::kCpu, sums, 1, DType::kFloat64);
  const double seconds = tb_window_.seconds + seconds_since(tb_window_.since);
  const double n = double(tb_window_.steps);
  if (tb_ != nullptr && tb_window_.steps > 0) {
    const int64_t t = state_.t;
    const double* phase = tb_window_.phase;
    tb_->scalar(kTbTrainLoss, t, sums[0] / n);
    tb_->scalar(kTbTrainSamplesPerSecond, t,
                seconds > 0 ? double(tb_window_.samples) / seconds : 0.0);
    tb_->scalar(kTbTrainExchangeMs, t, 1e3 * phase[int(StepPhase::kExchange)] / n);
    tb_->scalar(kTbTrainComputeMs, t, 1e3 * phase[int(StepPhase::kCompute)] / n);
    tb_->scalar(kTbTrainAllreduceMs, t, 1e3 * phase[int(StepPhase::kAllreduce)] / n);
    tb_->flush();
  }
  tb_window_ = TbWindow{};
  tb_window_.begin = last + 1;
  tb_window_.since = Clock::now();
}

}  // namespace ncf
