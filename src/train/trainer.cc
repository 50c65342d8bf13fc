// The epoch loop around train_step, evaluation, and the memory check: see trainer.h.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "comm/bootstrap.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/memory.h"
#include "data/negatives.h"
#include "embedding/embedding_kernels.h"
#include "model/metrics.h"
#include "model/ops.h"

namespace ncf {

namespace {

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

EmbeddingPlan plan_for_job(const TrainConfig& cfg, const DatasetMeta& meta, int W) {
  PlanRequest req;
  req.D = cfg.num_factors + cfg.layers[0] / 2;
  req.W = W;
  req.tables = {{"user", int64_t(meta.num_users), Placement::kRowWise, 0, 1, 0.01f},
                {"item", int64_t(meta.num_items), Placement::kRowWise, 0, 2, 0.01f}};
  req.lookups_per_rank = (cfg.batch_size / (cfg.num_neg + 1)) * (cfg.num_neg + 1) / W + 1;
  req.optimizer = parse_embedding_optimizer(cfg.embedding_optimizer);
  req.forced = cfg.shard_plan;
  return plan_tables(req);
}

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, const ExecContext& ctx)
    : cfg_(cfg), comm_(comm), ctx_(ctx) {
  meta_ = DatasetMeta::load(cfg.data_dir);
  const int W = comm.world(), r = comm.rank();
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
  const float elr = float(cfg.embedding_lr > 0 ? cfg.embedding_lr : cfg.learning_rate);
  eopt.adam = {elr, float(cfg.beta1), float(cfg.beta2), float(cfg.epsilon),
               float(cfg.l2_embedding)};
  eopt.adagrad = {elr, float(cfg.adagrad_init), 1e-7f, float(cfg.l2_embedding)};
  eopt.sgd = {elr, float(cfg.l2_embedding)};
  state_.dense_hyper = {float(cfg.learning_rate), float(cfg.beta1), float(cfg.beta2),
                        float(cfg.epsilon), float(cfg.l2_dense)};

  table_optimizer_ = eopt.kind;
  plan_ = plan_for_job(cfg, meta_, W);

  NeuMFConfig mc;
  mc.mf_dim = cfg.num_factors;
  mc.layers = cfg.layers;
  mc.validate();

  // Memory: tables and state, their exchange buffers (grow-only, sized by the
  // larger of the training and the eval lookups), the tower's step buffers, and
  // the eval buffers. On a GPU rank the limit is what cudaMemGetInfo reports
  // free, shared among the local ranks mapped to that GPU.
  const int D = mc.embedding_width();
  const int64_t local_samples = (P_ / W + 1) * S;
  const int64_t L = meta_.eval_negatives + 1;
  const int64_t eval_users = std::max<int64_t>(1, cfg.eval_batch_size / L);
  int64_t widest = 0;
  for (int w : cfg.layers) widest += w;
  const std::vector<int64_t> tables = table_bytes();
  int64_t tables_bytes = 0;
  for (int64_t x : tables) tables_bytes += x;
  const int64_t exchange_bytes = exchange_buffer_bytes(
      plan_, {std::max(local_samples, eval_users), std::max(local_samples, eval_users * L)},
      cfg.dedup);
  const int64_t step_bytes = local_samples * (2 * int64_t(D) * 4 + 2 * widest * 4 + 64) +
                             eval_users * L * (int64_t(D) * 4 + 2 * widest * 4 + 16);
  memory_bytes_ = tables_bytes + exchange_bytes + step_bytes;
  const MemoryInfo mem = device_memory(ctx, comm.local_world());
  const bool on_gpu = ctx.device == Device::kCuda;
  const int64_t limit = cfg.memory_limit_gb > 0
                            ? int64_t(cfg.memory_limit_gb * double(1ull << 30))
                            : mem.free / (on_gpu ? mem.sharing : std::max(1, comm.local_world()));
  const std::string where =
      cfg.memory_limit_gb > 0 ? std::string("--memory_limit_gb says it may use")
      : on_gpu ? "GPU " + std::to_string(mem.gpu) + " has " + gib(double(mem.free)) + " free of " +
                     gib(double(mem.total)) + " for " + std::to_string(mem.sharing) +
                     " rank(s), so it may use"
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
               ", with ", optimizer_name(eopt.kind), " state) on its ", device_name(ctx.device),
               ", but ", where, " ", gib(double(limit)), advice);
    }
  if (memory_bytes_ > limit)
    NCF_FAIL("rank ", r, " needs about ", gib(double(memory_bytes_)), " on its ",
             device_name(ctx.device), " (user table ", gib(double(tables[0])), ", item table ",
             gib(double(tables[1])), ", exchange buffers ", gib(double(exchange_bytes)),
             ", step and eval buffers ", gib(double(step_bytes)), " for ", local_samples,
             " samples), but ", where, " ", gib(double(limit)), advice);

  train_reader_ =
      std::make_unique<TrainReader>(cfg.data_dir, meta_, r, W, P_, cfg.seed, cfg.shuffle_records);
  eval_reader_ = std::make_unique<EvalReader>(cfg.data_dir, meta_, r, W, eval_users);
  positives_ = std::make_unique<PositiveLists>(cfg.data_dir, meta_);
  if (ctx.device != Device::kCpu)
    device_positives_ = std::make_unique<DevicePositiveLists>(*positives_, ctx.device);

  tables_ = std::make_unique<EmbeddingCollection>(plan_, comm, ctx, eopt, cfg.dedup);
  tables_->init(cfg.seed);
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
  for (Buffer<int32_t>* b : {&eval_users_, &eval_items_}) *b = Buffer<int32_t>(ctx.device, 0);
  for (Buffer<float>* b : {&eval_rows_, &scores_}) *b = Buffer<float>(ctx.device, 0);
  eval_mask_ = Buffer<uint8_t>(ctx.device, 0);
  eval_expand_ = Buffer<int64_t>(ctx.device, 0);
  step_loss_ = Buffer<double>(ctx.device, 0);
  stager_ = std::make_unique<InputStager>(ctx);
  timer_ = std::make_unique<StepTimer>(ctx);
}

Trainer::~Trainer() = default;

std::vector<int64_t> Trainer::table_bytes() const {
  std::vector<int64_t> b;
  for (const TableSpec& t : plan_.tables)
    b.push_back(table_rank_bytes(t, plan_.D, comm_.rank(), comm_.world(), table_optimizer_));
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
  const StepReport rep =
      train_step(state_, batch, comm_, ctx_, step_loss_.data() + index, timer_.get());
  stager_->release();
  timer_->end();
  r->bytes_sent += rep.bytes_sent;
  r->samples += rep.samples;
  pending_logs_.push_back({b.step, rep.samples, rep.bytes_sent, rep.collectives});
  account_step_times(false, r);
}

void Trainer::account_step_times(bool wait_all, EpochResult* r) {
  for (const StepTimes& st : timer_->take_finished(wait_all)) {
    const double x = st.seconds[int(StepPhase::kExchange)];
    const double c = st.seconds[int(StepPhase::kCompute)];
    const double a = st.seconds[int(StepPhase::kAllreduce)];
    r->exchange_seconds += x;
    r->compute_seconds += c;
    r->allreduce_seconds += a;
    NCF_CHECK(!pending_logs_.empty() && pending_logs_.front().step == st.step,
              "step timer returned step ", st.step, " out of order");
    const PendingLog l = pending_logs_.front();
    pending_logs_.pop_front();
    if (cfg_.step_log && comm_.rank() == 0)
      std::printf(
          "step %lld: %lld samples, exchange %.2f ms, compute %.2f ms, allreduce %.2f ms, "
          "%lld collectives, %lld bytes sent by rank 0\n",
          (long long)l.step, (long long)l.samples, x * 1e3, c * 1e3, a * 1e3,
          (long long)l.collectives, (long long)l.bytes);
  }
}

EpochResult Trainer::train_epoch(int64_t epoch) {
  EpochResult r;
  r.epoch = epoch;
  // mpirun hands rank 0 a pseudo-terminal, so "auto" stays quiet under a launcher.
  const bool launched = !detect_launcher().empty() || std::getenv("SLURM_STEP_ID");
  const bool show = comm_.rank() == 0 &&
                    (cfg_.progress == "on" || (cfg_.progress == "auto" && isatty(1) && !launched));
  int64_t steps = train_reader_->steps_per_epoch();
  if (cfg_.max_steps > 0) steps = std::min(steps, cfg_.max_steps);
  auto t0 = Clock::now();
  auto last_print = t0;
  train_reader_->start_epoch(epoch);
  stager_->reset();  // nothing survives an epoch that ended in an error
  timer_->reset();
  pending_logs_.clear();
  step_loss_.reserve(size_t(std::max<int64_t>(steps, 1)));
  step_loss_.zero();
  // Step s + 1 is read and staged (its copy to the device issued) before step s
  // is enqueued.
  TrainBatch batches[2];
  auto fetch = [&](int64_t s) {
    NCF_CHECK(train_reader_->next(&batches[s % 2]), "train reader ended after ", s, " of ", steps,
              " steps");
    stager_->stage(batches[s % 2]);
  };
  if (steps > 0) fetch(0);
  for (int64_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) fetch(s + 1);
    step(batches[s % 2], s, &r);
    ++r.steps;
    if (show && seconds_since(last_print) > 0.5) {
      last_print = Clock::now();
      double el = seconds_since(t0);
      std::printf("\r  epoch %lld: step %lld/%lld  %.2fM samples/s  ", (long long)epoch + 1,
                  (long long)s + 1, (long long)steps, double(r.samples) / el / 1e6);
      std::fflush(stdout);
    }
  }
  if (show) std::printf("\r%70s\r", "");
  account_step_times(true, &r);
  // The loss shares come back once per epoch; summed over ranks, each step's
  // shares give that step's mean loss over its global batch, and the epoch loss
  // is the mean of the step losses.
  check_device_errors(ctx_);  // bad input a kernel met in the last step, if any
  std::vector<double> shares(static_cast<size_t>(steps));
  device_copy(Device::kCpu, shares.data(), ctx_.device, step_loss_.data(), shares.size() * 8);
  double loss_sum = 0;
  for (double x : shares) loss_sum += x;
  double sums[1] = {loss_sum};
  all_reduce_sum_on(comm_, Device::kCpu, sums, 1, DType::kFloat64);
  r.train_seconds = seconds_since(t0);
  r.loss = r.steps ? sums[0] / double(r.steps) : 0;
  return r;
}

EvalResult Trainer::evaluate() {
  EvalResult res;
  auto t0 = Clock::now();
  const int W = comm_.world();
  const int64_t L = meta_.eval_negatives + 1;
  const int D = model_->config().embedding_width();
  const Device dev = ctx_.device;
  const int64_t per_batch = std::max<int64_t>(1, cfg_.eval_batch_size / L);
  // Every rank runs the same number of batches (the exchanges are collective).
  const int64_t most = int64_t((meta_.num_eval_users + W - 1) / W);
  const int64_t batches = (most + per_batch - 1) / per_batch;
  eval_reader_->start();
  EvalBatch b;
  std::vector<int32_t> users;
  std::vector<int64_t> expand;
  double sums[2] = {0, 0};
  for (int64_t k = 0; k < batches; ++k) {
    if (!eval_reader_->next(&b)) b = EvalBatch{};
    const int64_t n = b.num_users;
    users.resize(n);
    expand.resize(n * L);
    for (int64_t u = 0; u < n; ++u) {
      users[u] = int32_t(b.first_user + u);
      std::fill_n(&expand[u * L], L, u);
    }
    eval_users_.reserve(n);
    eval_items_.reserve(n * L);
    eval_mask_.reserve(n * L);
    eval_expand_.reserve(n * L);
    device_copy(dev, eval_users_.data(), Device::kCpu, users.data(), size_t(n) * 4);
    device_copy(dev, eval_items_.data(), Device::kCpu, b.items.data(), size_t(n * L) * 4);
    device_copy(dev, eval_mask_.data(), Device::kCpu, b.mask.data(), size_t(n * L));
    device_copy(dev, eval_expand_.data(), Device::kCpu, expand.data(), size_t(n * L) * 8);
    // One user lookup per user, repeated over its L candidates; both tables in
    // one exchange, as in the training step.
    eval_rows_.reserve(size_t(n * L) * D);
    tables_->lookup({{eval_users_.data(), n}, {eval_items_.data(), n * L}});
    permute_rows(ctx_, tables_->rows(0), n, eval_expand_.data(), eval_rows_.data(), n * L, D);
    if (n == 0) continue;
    scores_.reserve(n * L);
    model_->score(ctx_, eval_rows_.data(), tables_->rows(1), n * L, scores_.data());
    double hr = 0, ndcg = 0;
    hit_ndcg(ctx_, scores_.data(), eval_mask_.data(), n, int(L), cfg_.topk, &hr, &ndcg);
    sums[0] += hr;
    sums[1] += ndcg;
  }
  all_reduce_sum_on(comm_, Device::kCpu, sums, 2, DType::kFloat64);
  res.users = int64_t(meta_.num_eval_users);
  res.hr = sums[0] / double(res.users);
  res.ndcg = sums[1] / double(res.users);
  res.seconds = seconds_since(t0);
  return res;
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

}  // namespace ncf
