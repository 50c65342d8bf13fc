// The epoch loop around train_step, evaluation, and the memory check: see trainer.h.
#include "train/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "comm/bootstrap.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/file_io.h"
#include "common/memory.h"
#include "common/philox.h"
#include "data/crc32c.h"
#include "data/negatives.h"
#include "embedding/exchange_model.h"
#include "model/metrics.h"
#include "model/ops.h"
#include "train/checkpoint.h"
#include "train/checkpoint_lock.h"
#include "train/memory_estimate.h"
#include "train/tensorboard.h"

namespace ncf {

namespace {

// Training steps of each route --exchange auto times (after one untimed of each).
constexpr int kRouteTrialRounds = 3;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

  // Memory (train/memory_estimate.h): tables and state, their exchange buffers,
  // the tower's step buffers and the eval buffers, and on a GPU the scratch arena at
  // its largest and the context's workspaces. On a GPU rank the limit is what
  // cudaMemGetInfo reports free, shared among the local ranks on that physical GPU.
  const int D = mc.embedding_width();
  const int64_t L = meta_.eval_negatives + 1;
  const int64_t eval_users = std::max<int64_t>(1, cfg.eval_batch_size / L);
  const MemoryEstimate est = estimate_rank_memory(cfg, meta_, plan_, r, ctx.device);
  const std::vector<int64_t>& tables = est.tables;
  memory_bytes_ = est.total();
  const MemoryInfo mem = device_memory(ctx, comm.local_world());
  const bool on_gpu = ctx.device == Device::kCuda;
  const int64_t limit = cfg.memory_limit_gb > 0
                            ? int64_t(cfg.memory_limit_gb * double(1ull << 30))
                            : mem.free / (on_gpu ? mem.sharing : std::max(1, comm.local_world()));
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
      const TableSpec& spec = plan_.tables[k];
      NCF_FAIL("rank ", r, " needs about ", gib(double(tables[k])), " for table ", spec.name,
               " alone (", spec.num_rows, " rows x ", D, ", ", placement_name(spec.placement),
               rows_only ? std::string(", rows only")
                         : std::string(", with ") + optimizer_name(trained_with) + " state",
               ") on its ", device_name(ctx.device), ", but ", where, " ", gib(double(limit)),
               advice);
    }
  if (memory_bytes_ > limit)
    NCF_FAIL("rank ", r, " needs about ", gib(double(memory_bytes_)), " on its ",
             device_name(ctx.device), " (user table ", gib(double(tables[0])), ", item table ",
             gib(double(tables[1])), ", exchange buffers ", gib(double(est.exchange)),
             ", step and eval buffers ", gib(double(est.step)), " for ", est.samples, " samples",
             on_gpu ? ", scratch and workspaces " + gib(double(est.scratch + est.workspaces))
                    : std::string(),
             "), but ", where, " ", gib(double(limit)), advice);

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

  tables_ = std::make_unique<EmbeddingCollection>(plan_, comm, ctx, eopt, plan_.dedup);
  tables_->set_exchange_dtype(parse_wire_dtype(cfg.exchange_dtype));
  choose_exchange_across_nodes();
  tables_->init(cfg.seed);
  tables_->set_chunk_bytes(cfg.checkpoint_chunk_kib * 1024);
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
  if (cfg.eval_users > 0) {
    // A fixed subset of exactly eval_users users (selection sampling over the
    // user ids in order, keyed by the seed): the same on every rank and any W.
    const uint64_t U = meta_.num_eval_users;
    const uint64_t want = std::min<uint64_t>(uint64_t(cfg.eval_users), U);
    const CounterRng rng{cfg.seed, kStreamEvalUsers, 0};
    eval_selected_.assign(U, 0);
    uint64_t chosen = 0;
    for (uint64_t u = 0; u < U && chosen < want; ++u)
      if (rng.uniform_double(u) * double(U - u) < double(want - chosen)) {
        eval_selected_[u] = 1;
        ++chosen;
      }
  }
  step_loss_ = Buffer<double>(ctx.device, 0);
  stager_ = std::make_unique<InputStager>(ctx);
  timer_ = std::make_unique<StepTimer>(ctx);
  if (cfg.cuda_graph == "on" && !rows_only) {
    const std::string why = step_graph_refusal(ctx.device, W, cfg.table_dtype == "bf16");
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

void Trainer::step(const TrainBatch& b, int64_t index, EpochResult* r) {
  timer_->begin(b.step);
  // The positives, staged on the device while the previous step ran.
  const InputStager::Staged in = stager_->acquire();
  const int64_t n = int64_t(b.users.size());
  NCF_CHECK(in.n == n, "staged batch has ", in.n, " positives, the step ", n);
  const StepBatch batch{in.users, in.items, n, b.slice_begin, b.epoch, b.step_count};
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
  // is enqueued.
  TrainBatch batches[2];
  auto fetch = [&](int64_t s) {
    NCF_CHECK(train_reader_->next(&batches[s % 2]), "train reader ended after ", s, " of ", steps,
              " steps");
    stager_->stage(batches[s % 2]);
  };
  if (first_step < steps) fetch(first_step);
  for (int64_t s = first_step; s < steps; ++s) {
    if (s + 1 < steps) fetch(s + 1);
    step(batches[s % 2], s, &r);
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
  if (tb_windows()) {
    // The training scalars' window goes on in the next epoch: this one's part of it.
    for (int64_t k = tb_window_.begin; k < steps; ++k) tb_window_.loss += shares[size_t(k)];
    tb_window_.seconds += seconds_since(tb_window_.since);
  }
  return r;
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

namespace {

// NCF_EVAL_PHASES=1: where one evaluation's time goes, for benchmarks. Each phase
// ends with a wait for the device, so its work is counted in it (and the waits slow
// the evaluation down); rank 0 prints the seconds per phase.
class EvalPhases {
 public:
  enum Phase { kPrepare, kRead, kUpload, kLookup, kScore, kMetrics, kFullRanking, kCount };
  EvalPhases(Device dev, bool lead) : dev_(dev), lead_(lead) {
    const char* e = std::getenv("NCF_EVAL_PHASES");
    on_ = e != nullptr && std::string(e) == "1";
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

}  // namespace

EvalResult Trainer::evaluate() {
  EvalResult res;
  auto t0 = Clock::now();
  EvalPhases phases(ctx_.device, comm_.rank() == 0);
  const int W = comm_.world();
  const int64_t L = meta_.eval_negatives + 1;
  const int D = model_->config().embedding_width();
  const Device dev = ctx_.device;
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
  std::vector<float> host_scores;
  std::vector<int32_t> test_items;
  std::vector<int64_t> excl_offsets;
  std::vector<int32_t> excluded;
  if (full) tile_item_table(group, &full_item_tile_);
  const bool by_items = eval_by_items();
  if (by_items) prepare_eval_items();
  phases.end(EvalPhases::kPrepare);
  // The lists move to the device through eval_stager_: batch k + 1 is read (host
  // threads), copied to a pinned slot and sent on the copy stream while the device
  // scores batch k, and the metrics add up on the device (hit_ndcg_accumulate), so
  // nothing waits for the device inside the pass except full ranking's scores.
  auto read = [&](EvalBatch* b) {
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
  };
  auto stage = [&](const EvalBatch& b) {
    const size_t n = size_t(b.num_users), nl = n * size_t(L);
    eval_stager_->stage({{b.users.data(), n * 4}, {b.items.data(), nl * 4}, {b.mask.data(), nl}});
  };
  eval_stager_->reset();  // an evaluation that threw may have left batches staged
  eval_sums_.reserve(2);
  eval_sums_.zero();
  EvalBatch batch[2];
  if (batches > 0 && !cached) {
    read(&batch[0]);
    phases.end(EvalPhases::kRead);
    stage(batch[0]);
    phases.end(EvalPhases::kUpload);
  }
  double sums[4] = {0, 0, 0, 0};
  for (int64_t k = 0; k < batches; ++k) {
    const EvalBatch& b = batch[k % 2];
    const int32_t* users = nullptr;
    const int32_t* items = nullptr;
    const uint8_t* mask = nullptr;
    int64_t n = 0;
    if (cached) {
      n = eval_cache_.n[size_t(k)];
      users = eval_cache_.users[size_t(k)].data();
      items = eval_cache_.items[size_t(k)].data();
      mask = eval_cache_.mask[size_t(k)].data();
    } else {
      n = b.num_users;
      const std::vector<const void*>& staged = eval_stager_->acquire();
      users = static_cast<const int32_t*>(staged[0]);
      items = static_cast<const int32_t*>(staged[1]);
      mask = static_cast<const uint8_t*>(staged[2]);
      if (keep) {  // this batch's lists, kept for the later evaluations
        const size_t nl = size_t(n * L);
        eval_cache_.n.push_back(n);
        eval_cache_.users.emplace_back(dev, size_t(n));
        eval_cache_.items.emplace_back(dev, nl);
        eval_cache_.mask.emplace_back(dev, nl);
        device_copy_async(ctx_, dev, eval_cache_.users.back().data(), dev, users, size_t(n) * 4);
        device_copy_async(ctx_, dev, eval_cache_.items.back().data(), dev, items, nl * 4);
        device_copy_async(ctx_, dev, eval_cache_.mask.back().data(), dev, mask, nl);
      }
    }
    scores_.reserve(n * L);
    if (by_items) {
      // The users' rows only; the candidates' GMF columns and layer-0 products are
      // read by id from the item table's copy here and the model's per-item table
      // (the ids were checked as the lists were read).
      tables_->lookup({{users, n}, {items, 0}});
      if (n > 0) {
        phases.end(EvalPhases::kLookup);
        model_->score_items(ctx_, tables_->rows(0), eval_gmf_, eval_gmf_ld_, items, n, int(L),
                            scores_.data());
      }
    } else {
      // One user row per user, shared by its L candidates; both tables in one
      // exchange, as in the training step.
      tables_->lookup({{users, n}, {items, n * L}});
      if (n > 0) {
        phases.end(EvalPhases::kLookup);
        model_->score(ctx_, tables_->rows(0), tables_->rows(1), n, int(L), scores_.data());
      }
    }
    if (n > 0) {
      phases.end(EvalPhases::kScore);
      hit_ndcg_accumulate(ctx_, scores_.data(), mask, n, int(L), cfg_.topk, eval_sums_.data());
      phases.end(EvalPhases::kMetrics);
    }
    if (!cached) eval_stager_->release();
    if (full && n > 0) {
      // The users' rows (still in tables_->rows(0)) against every item, a group
      // of users at a time; the ranks are counted on the host.
      for (int64_t a = 0; a < n; a += group) {
        const int64_t m = std::min(group, n - a);
        full_scores_.reserve(m * I);
        model_->score(ctx_, tables_->rows(0) + a * D, full_item_tile_.data(), m, int(I),
                      full_scores_.data());
        host_scores.resize(m * I);
        device_copy(Device::kCpu, host_scores.data(), dev, full_scores_.data(), size_t(m * I) * 4);
        test_items.resize(m);
        for (int64_t x = 0; x < m; ++x)
          test_items[x] = b.items[(a + x) * L];  // the list's first entry is the test item
        seen_items(b.users.data() + a, m, &excl_offsets, &excluded);
        double fh = 0, fn = 0;
        full_ranking_hit_ndcg(ctx_.threads, host_scores.data(), m, I, test_items.data(),
                              excl_offsets.data(), excluded.data(), cfg_.topk, &fh, &fn);
        sums[2] += fh;
        sums[3] += fn;
      }
      phases.end(EvalPhases::kFullRanking);
    }
    // The next batch is read and sent while the device works on this one. Its host
    // arrays replace batch k - 1's: staged (copied, on a GPU) before this batch was.
    if (k + 1 < batches && !cached) {
      read(&batch[(k + 1) % 2]);
      phases.end(EvalPhases::kRead);
      stage(batch[(k + 1) % 2]);
      phases.end(EvalPhases::kUpload);
    }
  }
  if (keep && !cached) {
    eval_cache_.complete = true;
    if (comm_.rank() == 0) {
      int64_t bytes = 0;
      for (int64_t n : eval_cache_.n) bytes += n * (4 + 5 * L);
      std::fprintf(stderr,
                   "ncf_dist: evaluation: the lists stay on the device after the first "
                   "(rank 0: %.1f MiB); later evaluations read no list\n",
                   double(bytes) / (1 << 20));
    }
  }
  // A kernel's bad-input record (hit_ndcg raised it per batch) surfaces here, once.
  check_device_errors(ctx_);
  device_copy(Device::kCpu, sums, dev, eval_sums_.data(), 2 * sizeof(double));
  phases.end(EvalPhases::kFullRanking);  // the batches' ends: no work, nothing to wait for
  all_reduce_sum_on(comm_, Device::kCpu, sums, 4, DType::kFloat64);
  phases.report();
  res.users = eval_selected_.empty() ? int64_t(meta_.num_eval_users)
                                     : std::min<int64_t>(cfg_.eval_users, meta_.num_eval_users);
  res.hr = sums[0] / double(res.users);
  res.ndcg = sums[1] / double(res.users);
  res.full = full;
  res.full_hr = sums[2] / double(res.users);
  res.full_ndcg = sums[3] / double(res.users);
  res.seconds = seconds_since(t0);
  return res;
}

bool Trainer::eval_lists_cached() const {
  const char* env = std::getenv("NCF_EVAL_CACHE");
  if (env != nullptr && std::string(env) == "0") return false;
  if (env != nullptr && std::string(env) == "1") return true;  // any device (tests)
  if (ctx_.device != Device::kCuda || cfg_.eval_only) return false;
  const int W = comm_.world();
  return eval_lists_cache_bytes(int64_t((meta_.num_eval_users + W - 1) / W),
                                meta_.eval_negatives + 1) > 0;
}

bool Trainer::eval_by_items() const {
  const char* env = std::getenv("NCF_EVAL_ITEMS");
  if (env != nullptr && std::string(env) == "0") return false;
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

std::vector<float> Trainer::gather_parameters() {
  std::vector<float> out(size_t(model_->num_params()));
  device_copy(Device::kCpu, out.data(), ctx_.device, model_->params().data(), out.size() * 4);
  for (int t = 0; t < tables_->num_tables(); ++t) {
    std::vector<float> rows = tables_->gather_table(t);
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

// ------------------------------------------------------------- checkpoints ---
//
// Files of a checkpoint (raw little-endian arrays, checkpoint.h):
//   tower.f32             [3 × params] the tower's parameters, Adam m, Adam v
//   loss.f64              [W × epoch_step] each rank's loss shares of the
//                         steps of the current epoch taken so far
//   <table>.<array>.f32   [N × D] in global row order, one per state array:
//                         rows, then the optimizer's (m and v, or accumulator;
//                         row-wise Adagrad's row_accumulator is [N × 1])

namespace {

std::vector<std::string> state_array_names(EmbeddingOptimizer o) {
  if (o == EmbeddingOptimizer::kRowwiseAdagrad) return {"rows", "row_accumulator"};
  switch (optimizer_state_arrays(o)) {
    case 0:
      return {"rows"};
    case 1:
      return {"rows", "accumulator"};
    default:
      return {"rows", "m", "v"};
  }
}

}  // namespace

std::string Trainer::save_checkpoint(int64_t epoch, int64_t epoch_step) {
  const auto t0 = Clock::now();
  const int W = comm_.world(), r = comm_.rank();
  // Rank 0 fails here, before anything is written, when another job took the
  // directory over; the ranks waiting in the writer's first barrier go down
  // with it (run_main).
  if (lock_ != nullptr && r == 0) lock_->check_held("checkpoint " + checkpoint_name(state_.t));
  CheckpointWriter w(comm_, cfg_.checkpoint_dir, state_.t);
  w.set_damaged(damaged_);
  // The tower and its Adam moments: rank 0 writes them (every rank holds them).
  const int64_t params = model_->num_params();
  {
    std::vector<float> tower(r == 0 ? size_t(3 * params) : 0);
    if (r == 0) {
      device_copy(Device::kCpu, tower.data(), ctx_.device, model_->params().data(), params * 4);
      device_copy(Device::kCpu, tower.data() + params, ctx_.device, state_.adam_m.data(),
                  params * 4);
      device_copy(Device::kCpu, tower.data() + 2 * params, ctx_.device, state_.adam_v.data(),
                  params * 4);
    }
    w.write("tower.f32", 3 * params * 4, 0, tower.data(), tower.size() * 4);
  }
  // Each rank's loss shares of this epoch so far.
  {
    std::vector<double> shares(static_cast<size_t>(epoch_step));
    device_copy(Device::kCpu, shares.data(), ctx_.device, step_loss_.data(), shares.size() * 8);
    w.write("loss.f64", int64_t(W) * epoch_step * 8, int64_t(r) * epoch_step * 8, shares.data(),
            shares.size() * 8);
  }
  // The tables, each rank writing its block of global rows, chunk by chunk.
  nlohmann::json tables = nlohmann::json::array();
  const std::vector<std::string> arrays = state_array_names(table_optimizer_);
  for (int t = 0; t < tables_->num_tables(); ++t) {
    const TableSpec& spec = plan_.tables[t];
    for (int a = 0; a < int(arrays.size()); ++a) {
      const int64_t row_bytes = int64_t(tables_->state_width(a)) * 4;
      int64_t first = 0, count = 0;
      block_range(spec.num_rows, W, r, &first, &count);
      w.begin_part(spec.name + "." + arrays[a] + ".f32", spec.num_rows * row_bytes,
                   first * row_bytes, count * row_bytes);
      for (int64_t c = 0; c < tables_->num_chunks(t); ++c) {
        int64_t rows = 0;
        const float* chunk = tables_->export_chunk(t, a, c, &rows);
        w.append(chunk, size_t(rows * row_bytes));
      }
      w.end_part();
    }
    tables.push_back(
        {{"name", spec.name}, {"rows", spec.num_rows}, {"width", plan_.D}, {"arrays", arrays}});
  }
  // A copy of the dataset's id maps, so that the checkpoint's rows can be
  // matched by original id without the dataset (--init_from, ncf_export
  // --since): rank 0 copies each file in 8 MiB pieces, checked against the
  // CRC metadata.json gives.
  for (const IdMapInfo& info : meta_.id_maps) {
    const int64_t bytes = int64_t(info.bytes);
    w.begin_part(info.name, bytes, r == 0 ? 0 : bytes, r == 0 ? bytes : 0);
    if (r == 0) {
      const std::string file = cfg_.data_dir + "/" + info.name;
      FileHandle f(file, O_RDONLY);
      std::vector<char> piece(size_t(std::min<int64_t>(bytes, int64_t(8) << 20)));
      uint32_t crc = 0;
      for (int64_t at = 0; at < bytes;) {
        const size_t n = size_t(std::min<int64_t>(bytes - at, int64_t(piece.size())));
        f.read_at(at, piece.data(), n);
        crc = crc32c_extend(crc, piece.data(), n);
        w.append(piece.data(), n);
        at += int64_t(n);
      }
      NCF_REQUIRE(crc == info.crc32c, file,
                  ": the id map changed while this run used it (its CRC-32C is no longer "
                  "metadata.json's); the checkpoint is not written");
    }
    w.end_part();
  }
  CheckpointManifest m;
  m.step = state_.t;
  m.epoch = epoch;
  m.epoch_step = epoch_step;
  m.world = W;
  m.dataset_id = meta_.dataset_id;
  m.config = trajectory_flags(cfg_);
  m.tables = tables;
  m.id_maps = meta_.id_maps;
  m.init_from = init_from_;
  const std::string path = w.commit(m, cfg_.keep_checkpoints);
  last_checkpoint_ = Clock::now();
  saved_step_ = state_.t;
  if (r == 0) {
    const double sec = seconds_since(t0);
    std::printf("ncf_dist: checkpoint %s: step %lld, %.1f MiB in %.2f s (%.0f MiB/s)\n",
                path.c_str(), (long long)state_.t, double(w.bytes_written()) / 1048576.0, sec,
                sec > 0 ? double(w.bytes_written()) / 1048576.0 / sec : 0.0);
    for (const std::string& note : w.retention_notes()) std::printf("ncf_dist: %s\n", note.c_str());
    std::fflush(stdout);
  }
  return path;
}

void Trainer::save_final_checkpoint() {
  if (checkpointing() && saved_step_ != state_.t)
    save_checkpoint(position_.epoch, position_.epoch_step);
}

Trainer::Position Trainer::resume() {
  std::vector<std::string> log;
  std::optional<CheckpointReader> ck =
      find_checkpoint(comm_, cfg_.resume, cfg_.checkpoint_dir, &log, &damaged_);
  if (comm_.rank() == 0) {
    if (checkpointing() && !cfg_.eval_only) {
      // What the directory holds, before anything is written or removed there.
      const CheckpointDirListing l = list_checkpoint_dir(cfg_.checkpoint_dir);
      std::string steps;
      for (const auto& [step, path] : l.sealed)
        steps += (steps.empty() ? " (steps " : ", ") + std::to_string(step);
      std::printf(
          "ncf_dist: checkpoint directory %s: %zu sealed checkpoint%s%s%s; retention keeps the "
          "newest %d that load (--keep_checkpoints)%s\n",
          cfg_.checkpoint_dir.c_str(), l.sealed.size(), l.sealed.size() == 1 ? "" : "s",
          steps.empty() ? "" : (steps + ")").c_str(),
          l.unsealed.empty() ? ""
                             : (", " + std::to_string(l.unsealed.size()) + " unsealed").c_str(),
          cfg_.keep_checkpoints,
          damaged_.empty() ? ""
          : damaged_.size() == 1
              ? " and leaves the one that does not load"
              : (" and leaves the " + std::to_string(damaged_.size()) + " that do not load")
                    .c_str());
    }
    for (const std::string& line : log) std::printf("ncf_dist: %s\n", line.c_str());
    std::fflush(stdout);
  }
  if (!ck) return {};
  load_checkpoint(*ck);
  position_ = {ck->manifest().epoch, ck->manifest().epoch_step};
  saved_step_ = ck->manifest().step;
  resumed_from_ = ck->path();
  return position_;
}

void Trainer::load_checkpoint(const CheckpointReader& ck) {
  const CheckpointManifest& m = ck.manifest();
  const std::string& path = ck.path();
  const int W = comm_.world(), r = comm_.rank();
  if (m.dataset_id != meta_.dataset_id)
    NCF_FAIL("checkpoint ", path, " belongs to dataset ", m.dataset_id, ", but --data_dir ",
             cfg_.data_dir, " holds dataset ", meta_.dataset_id);
  const nlohmann::json recorded = with_later_flags(m.config);
  // A run without --embedding_lr keeps the rate its checkpoint was written with:
  // the defaults may have changed since (one of sgd, adagrad or rowwise_adagrad
  // from before they had their own records -1, --learning_rate's).
  const bool lr_allowed = std::find(cfg_.allow_changed.begin(), cfg_.allow_changed.end(),
                                    "embedding_lr") != cfg_.allow_changed.end();
  if (!cfg_.embedding_lr_given && !lr_allowed && !cfg_.eval_only && recorded.is_object() &&
      recorded.contains("embedding_lr") &&
      recorded.at("embedding_lr") != nlohmann::json(cfg_.embedding_lr)) {
    const nlohmann::json& j = recorded.at("embedding_lr");
    if (!j.is_number() ||
        !(j.get<double>() < 0 || (j.get<double>() > 0 && j.get<double>() <= 1000)))
      NCF_FAIL("checkpoint ", path, " records --embedding_lr ", j.dump(),
               ", not negative or in (0, 1000]");
    const std::string instead = embedding_lr_description(cfg_);
    cfg_.embedding_lr = j.get<double>();
    cfg_.embedding_lr_from =
        (cfg_.embedding_lr < 0 ? "--learning_rate, as checkpoint " + path + " records"
                               : "checkpoint " + path + "'s");
    tables_->set_learning_rate(float(effective_embedding_lr(cfg_)));
    if (r == 0) {
      std::printf("ncf_dist: %s: kept, as no --embedding_lr was given (instead of %s)\n",
                  embedding_lr_description(cfg_).c_str(), instead.c_str());
      std::fflush(stdout);
    }
  }
  // Every flag the trajectory depends on must match, unless allowed to change.
  const nlohmann::json now = trajectory_flags(cfg_);
  for (auto it = now.begin(); it != now.end(); ++it) {
    // Evaluating needs only what fixes the shapes and the state arrays.
    const bool shape =
        it.key() == "num_factors" || it.key() == "layers" || it.key() == "embedding_optimizer";
    const bool allowed = (cfg_.eval_only && !shape) ||
                         std::find(cfg_.allow_changed.begin(), cfg_.allow_changed.end(),
                                   it.key()) != cfg_.allow_changed.end();
    if (!recorded.contains(it.key()))
      NCF_FAIL("checkpoint ", path, " does not record flag --", it.key());
    if (recorded.at(it.key()) != it.value() && !allowed)
      NCF_FAIL("checkpoint ", path, " was written with --", it.key(), " ",
               recorded.at(it.key()).dump(), ", this run has --", it.key(), " ", it.value().dump(),
               std::find(changeable_flags().begin(), changeable_flags().end(), it.key()) !=
                       changeable_flags().end()
                   ? " (pass --allow_changed_flags " + it.key() +
                         (it.key() == "table_dtype" ? " to convert the tables)" : " to change it)")
                   : " (a resumed run must keep it; start without --resume to change it)");
  }
  // The tower and its moments.
  const int64_t params = model_->num_params();
  NCF_REQUIRE(ck.bytes("tower.f32") == 3 * params * 4, "checkpoint ", path, ": tower.f32 has ",
              ck.bytes("tower.f32"), " bytes, this model (--num_factors, --layers) needs ",
              3 * params * 4);
  {
    std::vector<float> tower(static_cast<size_t>(3 * params));
    ck.read("tower.f32", 0, tower.data(), tower.size() * 4);
    device_copy(ctx_.device, model_->params().data(), Device::kCpu, tower.data(), params * 4);
    device_copy(ctx_.device, state_.adam_m.data(), Device::kCpu, tower.data() + params, params * 4);
    device_copy(ctx_.device, state_.adam_v.data(), Device::kCpu, tower.data() + 2 * params,
                params * 4);
  }
  if (recorded.at("table_dtype") != cfg_.table_dtype && comm_.rank() == 0) {
    std::printf("ncf_dist: checkpoint %s: table rows converted from %s to %s (%s)\n", path.c_str(),
                recorded.at("table_dtype").get<std::string>().c_str(), cfg_.table_dtype.c_str(),
                cfg_.table_dtype == "bf16" ? "rounded to nearest-even" : "widened, exact");
    std::fflush(stdout);
  }
  state_.t = m.step;
  // The tables: each rank reads its block of every array, chunk by chunk; the
  // collection sends the rows to the ranks this run's plan gives them.
  const std::vector<std::string> arrays = state_array_names(table_optimizer_);
  std::vector<float> chunk(static_cast<size_t>(tables_->chunk_rows() * plan_.D));
  for (int t = 0; t < tables_->num_tables(); ++t) {
    const TableSpec& spec = plan_.tables[t];
    for (int a = 0; a < int(arrays.size()); ++a) {
      const std::string name = spec.name + "." + arrays[a] + ".f32";
      const int64_t width = tables_->state_width(a);
      NCF_REQUIRE(ck.bytes(name) == spec.num_rows * width * 4, "checkpoint ", path, ": ", name,
                  " has ", ck.bytes(name), " bytes, table ", spec.name, " needs ", spec.num_rows,
                  " rows x ", width, " floats");
      for (int64_t c = 0; c < tables_->num_chunks(t); ++c) {
        int64_t lo = 0, rows = 0;
        tables_->chunk_range(t, r, c, &lo, &rows);
        ck.read(name, lo * width * 4, chunk.data(), size_t(rows * width) * 4);
        tables_->import_chunk(t, a, c, chunk.data());
      }
    }
  }
  // The loss shares of the resumed epoch: each rank its own when W is the
  // same; otherwise rank 0 takes each step's sum over the old ranks.
  const int64_t k = m.epoch_step;
  // Bounded before the product: a manifest's counters are only known to be
  // non-negative integers.
  NCF_REQUIRE(k <= std::numeric_limits<int64_t>::max() / 8 / m.world, "checkpoint ", path,
              ": epoch_step ", k, " of ", m.world, " ranks is beyond any loss.f64");
  NCF_REQUIRE(ck.bytes("loss.f64") == int64_t(m.world) * k * 8, "checkpoint ", path,
              ": loss.f64 has ", ck.bytes("loss.f64"), " bytes for ", m.world, " ranks x ", k,
              " steps");
  resumed_loss_.assign(size_t(k), 0.0);
  if (m.world == W) {
    ck.read("loss.f64", int64_t(r) * k * 8, resumed_loss_.data(), size_t(k) * 8);
  } else if (r == 0) {
    std::vector<double> all(static_cast<size_t>(m.world * k));
    ck.read("loss.f64", 0, all.data(), all.size() * 8);
    for (int p = 0; p < m.world; ++p)
      for (int64_t s = 0; s < k; ++s) resumed_loss_[size_t(s)] += all[size_t(p * k + s)];
  }
  last_checkpoint_ = Clock::now();
}

void Trainer::warm_start() {
  const int W = comm_.world(), r = comm_.rank();
  std::vector<std::string> log;
  const CheckpointReader ck = open_checkpoint(comm_, cfg_.init_from, &log, "--init_from");
  if (r == 0) {
    for (std::string line : log) {
      if (line.rfind("resuming from ", 0) == 0) line = "warm start from " + line.substr(14);
      std::printf("ncf_dist: --init_from: %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  const CheckpointManifest& m = ck.manifest();
  const std::string& path = ck.path();
  const std::vector<std::string> ancestors = meta_.ancestors();
  if (m.dataset_id != meta_.dataset_id &&
      std::find(ancestors.begin(), ancestors.end(), m.dataset_id) == ancestors.end()) {
    std::string line;
    for (const std::string& a : ancestors) line += (line.empty() ? "" : ", ") + a;
    NCF_FAIL("flag --init_from ", path, ": the checkpoint belongs to dataset ", m.dataset_id,
             ", which is neither --data_dir ", cfg_.data_dir, " (dataset ", meta_.dataset_id,
             ") nor one it extends (",
             line.empty() ? std::string("it was made from scratch") : "its ancestors: " + line,
             "); a warm start continues a model on a dataset made from its own with ncf_prep "
             "--extend");
  }
  const nlohmann::json recorded = with_later_flags(m.config);
  const bool keep = cfg_.init_optimizer_state == "keep" && !cfg_.eval_only;
  const nlohmann::json now = trajectory_flags(cfg_);
  for (const char* key : {"num_factors", "layers", "embedding_optimizer"}) {
    if (!recorded.contains(key))
      NCF_FAIL("flag --init_from ", path, ": the checkpoint does not record --", key);
    const bool state = std::string(key) == "embedding_optimizer";
    if (recorded.at(key) != now.at(key) && (!state || keep))
      NCF_FAIL("flag --init_from ", path, ": the checkpoint was trained with --", key, " ",
               recorded.at(key).dump(), ", this run has --", key, " ", now.at(key).dump(),
               state ? " (pass --init_optimizer_state reset to start the new optimizer's state "
                       "afresh)"
                     : " (a warm start keeps the model's shape)");
  }
  // The tower, and its Adam moments unless reset.
  const int64_t params = model_->num_params();
  NCF_REQUIRE(ck.bytes("tower.f32") == 3 * params * 4, "flag --init_from ", path,
              ": tower.f32 has ", ck.bytes("tower.f32"), " bytes, this model needs ",
              3 * params * 4);
  {
    std::vector<float> tower(static_cast<size_t>(3 * params));
    ck.read("tower.f32", 0, tower.data(), tower.size() * 4);
    if (!keep) std::fill(tower.begin() + params, tower.end(), 0.0f);
    device_copy(ctx_.device, model_->params().data(), Device::kCpu, tower.data(), params * 4);
    device_copy(ctx_.device, state_.adam_m.data(), Device::kCpu, tower.data() + params, params * 4);
    device_copy(ctx_.device, state_.adam_v.data(), Device::kCpu, tower.data() + 2 * params,
                params * 4);
  }
  state_.t = keep ? m.step : 0;
  // The tables: each rank maps the rows of its block to the checkpoint's by
  // original id, then the chunks go through the collection as in a resume,
  // the rows the checkpoint lacks keeping this run's initial values.
  const IdMaps old_maps = ck.id_maps();
  const IdMaps new_maps = load_id_maps(cfg_.data_dir, meta_);
  const std::vector<std::string> arrays = state_array_names(table_optimizer_);
  const size_t num_arrays = keep ? arrays.size() : 1;
  int64_t counts[4] = {0, 0, 0, 0};  // user rows found, new; item rows found, new
  for (int t = 0; t < tables_->num_tables(); ++t) {
    const TableSpec& spec = plan_.tables[t];
    const IdMap& now_map = spec.name == "user" ? new_maps.user : new_maps.item;
    const IdMap& old_map = spec.name == "user" ? old_maps.user : old_maps.item;
    const int64_t old_rows = checkpoint_table_rows(m, spec.name, path);
    int64_t first = 0, count = 0;
    block_range(spec.num_rows, W, r, &first, &count);
    std::vector<int64_t> source(static_cast<size_t>(count));
    try {
      for (int64_t k = 0; k < count; ++k) source[size_t(k)] = old_map.find_same(now_map, first + k);
    } catch (const Error& e) {
      NCF_RETHROW(e, "flag --init_from ", path, ": table ", spec.name, " of ", cfg_.data_dir);
    }
    for (int64_t s : source) ++counts[2 * (t == 0 ? 0 : 1) + (s < 0 ? 1 : 0)];
    for (size_t a = 0; a < num_arrays; ++a) {
      const std::string name = spec.name + "." + arrays[a] + ".f32";
      const int64_t width = tables_->state_width(int(a));
      NCF_REQUIRE(ck.bytes(name) == old_rows * width * 4, "flag --init_from ", path, ": ", name,
                  " has ", ck.bytes(name), " bytes for ", old_rows, " rows x ", width, " floats");
      std::vector<float> chunk;
      for (int64_t c = 0; c < tables_->num_chunks(t); ++c) {
        int64_t lo = 0, rows = 0;
        const float* now_rows = tables_->export_chunk(t, int(a), c, &rows);
        chunk.assign(now_rows, now_rows + rows * width);
        tables_->chunk_range(t, r, c, &lo, &rows);
        // Runs of rows whose sources are consecutive: one read each.
        for (int64_t k = 0; k < rows;) {
          const int64_t s = source[size_t(lo - first + k)];
          if (s < 0) {
            ++k;
            continue;
          }
          int64_t run = 1;
          while (k + run < rows && source[size_t(lo - first + k + run)] == s + run) ++run;
          ck.read(name, s * width * 4, chunk.data() + k * width, size_t(run * width) * 4);
          k += run;
        }
        tables_->import_chunk(t, int(a), c, chunk.data());
      }
    }
  }
  all_reduce_sum_on(comm_, Device::kCpu, counts, 4, DType::kInt64);
  init_from_ = {{"path", path},
                {"dataset_id", m.dataset_id},
                {"step", m.step},
                {"optimizer_state", keep ? "keep" : "reset"}};
  if (r == 0) {
    std::printf(
        "ncf_dist: warm start from %s (dataset %s, step %lld): users %lld from the checkpoint, "
        "%lld new; items %lld from the checkpoint, %lld new; tower carried over; optimizer "
        "state %s\n",
        path.c_str(), m.dataset_id.c_str(), (long long)m.step, (long long)counts[0],
        (long long)counts[1], (long long)counts[2], (long long)counts[3], keep ? "kept" : "reset");
    std::fflush(stdout);
  }
}

}  // namespace ncf
