// ncf_dist: trains NeuMF on a dataset directory as one or many MPI ranks and
// reports HR@K / NDCG@K after every epoch. The step itself is in trainer.cc.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/collective_watch.h"
#include "comm/peer_watch.h"
#include "common/blas_setup.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/vector_isa.h"
#include "data/dataset.h"
#include "embedding/exchange_model.h"
#include "model/cpu_matmul.h"
#include "model/neumf.h"
#include "model/ops.h"
#include "train/checkpoint_lock.h"
#include "train/config.h"
#include "train/step.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

namespace ncf {
namespace {

// Set by SIGTERM or SIGUSR1 (Slurm's --signal): every rank stops at the next
// step boundary, once the request has ridden the step's allreduce, and writes
// a checkpoint. A second SIGTERM ends the process at once; the last committed
// checkpoint stays as it was.
volatile sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal != 0 && sig == SIGTERM) _exit(128 + SIGTERM);
  g_stop_signal = sig;
  peer_watch_stop_signal();
}

// Called on the main thread, which Linux hands a signal sent to the process
// whenever it does not block it. The handler runs on a stack of its own: run on
// the interrupted one, the frame the kernel pushes there corrupted the heap in
// about 1 of 25 runs stopped mid-step (glibc: "corrupted size vs. prev_size",
// in a free inside the next tower product; not seen with it on its own stack).
void install_stop_handlers() {
  static std::vector<char> handler_stack(size_t(1) << 16);  // also for AVX-512/AMX state
  stack_t ss{};
  ss.ss_sp = handler_stack.data();
  ss.ss_size = handler_stack.size();
  NCF_CHECK(sigaltstack(&ss, nullptr) == 0, "sigaltstack: ", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_ONSTACK;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

// MLPerf-style log lines (rank 0 only).
class MlLog {
 public:
  explicit MlLog(bool on) : on_(on) {}
  void event(const char* key, const nlohmann::json& value, const nlohmann::json& meta = {},
             const char* type = "POINT_IN_TIME") {
    if (!on_) return;
    nlohmann::json j = {{"namespace", ""},
                        {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count()},
                        {"event_type", type},
                        {"key", key},
                        {"value", value},
                        {"metadata", meta.is_null() ? nlohmann::json::object() : meta}};
    std::printf(":::MLLOG %s\n", j.dump().c_str());
  }

 private:
  bool on_;
};

// One epoch's --tensorboard_dir scalars, at the step the epoch ended: the
// numbers of its --metrics_json line (the eval ones when it evaluated).
void write_epoch_scalars(TensorBoardWriter& tb, int64_t step, int epoch, const EpochResult& r,
                         double samples_per_second, bool evaluated, const EvalResult& ev, int k) {
  tb.scalar(kTbEpoch, step, epoch);
  tb.scalar(kTbEpochLoss, step, r.loss);
  tb.scalar(kTbEpochSamplesPerSecond, step, samples_per_second);
  tb.scalar(kTbEpochTrainSeconds, step, r.train_seconds);
  tb.scalar(kTbEpochExchangeSeconds, step, r.exchange_seconds);
  tb.scalar(kTbEpochComputeSeconds, step, r.compute_seconds);
  tb.scalar(kTbEpochAllreduceSeconds, step, r.allreduce_seconds);
  if (evaluated) {
    tb.scalar(tb_eval_tag("HR", k), step, ev.hr);
    tb.scalar(tb_eval_tag("NDCG", k), step, ev.ndcg);
    if (ev.full) {
      tb.scalar(tb_eval_tag("full_HR", k), step, ev.full_hr);
      tb.scalar(tb_eval_tag("full_NDCG", k), step, ev.full_ndcg);
    }
    tb.scalar(kTbEvalSeconds, step, ev.seconds);
  }
  tb.flush();
}

// The flags whose range depends on the dataset: only its metadata knows how
// long an eval list is (1 + E) and how many users it evaluates. Every rank
// reads the same metadata, so every rank refuses alike, before any collective
// of the trainer and before anything is written.
// --save_params: the parameters (gathered: collective), written by rank 0.
void save_params(const TrainConfig& cfg, bool lead, Trainer* trainer) {
  if (cfg.save_params.empty()) return;
  const std::vector<float> params = trainer->gather_parameters();
  if (!lead) return;
  std::ofstream f(cfg.save_params, std::ios::binary);
  f.write(reinterpret_cast<const char*>(params.data()), std::streamsize(params.size() * 4));
  if (!f) NCF_FAIL("flag --save_params: cannot write ", cfg.save_params);
}

void check_flags_against_data(const TrainConfig& cfg, const DatasetMeta& meta, bool lead) {
  // Without evaluation neither flag is used (a checkpoint evaluated later is
  // checked then, with --eval_only).
  if (!cfg.eval_each_epoch && !cfg.eval_only) return;
  const uint64_t list = uint64_t(meta.eval_negatives) + 1;
  // Past the list's length every positive is in the top K: HR@K is 1 whatever
  // the model. (K = 1 + E still gives the whole list's NDCG, so it stays.) The
  // default K only earns a note, as the run goes on: a dataset with few
  // negatives would otherwise need --topk on every run.
  if (uint64_t(cfg.topk) > list) {
    const std::string what = detail::concat(
        " is more than the ", list, " candidates of each eval list of ", cfg.data_dir, " (1 + ",
        meta.eval_negatives, " eval negatives): HR@K would count every user as a hit");
    if (cfg.topk_given) NCF_FAIL("flag --topk ", cfg.topk, what, "; use --topk <= ", list);
    if (lead)
      std::fprintf(stderr, "ncf_dist: note: the default --topk %d%s; give --topk <= %llu\n",
                   cfg.topk, what.c_str(), (unsigned long long)list);
  }
  if (uint64_t(cfg.eval_users) > meta.num_eval_users)
    NCF_FAIL("flag --eval_users ", cfg.eval_users, " is more than the ", meta.num_eval_users,
             " eval users of ", cfg.data_dir, " (0 evaluates them all)");
}

// Notes on rank 0 for flags this run never reads.
void note_flags_without_effect(const TrainConfig& cfg, const RankInfo& info, bool lead) {
  if (!lead) return;
  for (const std::string& u : cfg.unused_flags)
    std::fprintf(stderr, "ncf_dist: note: flag %s; it has no effect\n", u.c_str());
  if (info.world == 1 && cfg.peer_timeout > 0)
    std::fprintf(stderr,
                 "ncf_dist: note: flag --peer_timeout: one rank has no peers to wait "
                 "for; it has no effect\n");
  if (info.world == 1 && cfg.peer_lost_after_given)
    std::fprintf(stderr,
                 "ncf_dist: note: flag --peer_lost_after: one rank has no peers to lose; "
                 "it has no effect\n");
}

// The kernel choices of the flags and of the environment (neumf.h, step.h,
// vector_isa.h), each other than the default with a note on rank 0.
void apply_kernel_switches(const TrainConfig& cfg, bool lead) {
  set_layer0_by_item(parse_layer0_by_item(cfg.layer0_by_item, "--layer0_by_item"));
  if (lead && layer0_by_item_mode() == Layer0ByItem::kOff)
    std::fprintf(stderr,
                 "ncf_dist: note: --layer0_by_item off: layer 0 takes its items' half once per "
                 "sample\n");
  if (lead && layer0_by_item_mode() == Layer0ByItem::kOn)
    std::fprintf(stderr,
                 "ncf_dist: note: --layer0_by_item on: layer 0 takes its items' half once per "
                 "distinct item of a batch, on CPU ranks too\n");
  if (lead && !narrow_item_lookups())
    std::fprintf(stderr,
                 "ncf_dist: note: NCF_NARROW_ITEM_LOOKUP=0: the step looks up, and reduces the "
                 "gradients of, the samples' whole item rows\n");
  // Every rank refuses a bad value alike, before any collective.
  if (vector_isa_from_environment() && lead)
    std::fprintf(stderr, "ncf_dist: note: NCF_VECTOR_ISA=%s: CPU loops on the %s path\n",
                 std::getenv("NCF_VECTOR_ISA"), vector_isa_name(vector_isa()));
  if (lead && score_items_fused_enabled())
    std::fprintf(stderr,
                 "ncf_dist: note: NCF_EVAL_FUSED=1: evaluation by items on BF16 storage scores "
                 "each batch on a GPU in one kernel\n");
}

// The start-up lines on rank 0: the dataset, the job, the device, the plan.
void print_start_up(const TrainConfig& cfg, const RankRuntime& rt, const CpuReport& cpu,
                    const Trainer& trainer) {
  const Device device = rt.ctx.device;
  const DatasetMeta& meta = trainer.meta();
  const int S = cfg.num_neg + 1;
  std::printf(
      "ncf_dist: %s: %llu users, %llu items, %llu train positives, %llu eval users x "
      "(1 + %u)\n",
      cfg.data_dir.c_str(), (unsigned long long)meta.num_users, (unsigned long long)meta.num_items,
      (unsigned long long)meta.num_train, (unsigned long long)meta.num_eval_users,
      meta.eval_negatives);
  std::printf(
      "ncf_dist: %d rank(s), %s backend (BLAS kernels %s), %s comm, %s; batch %lld samples "
      "(%lld positives x %d), factors %d, layers",
      rt.info.world, device_name(device), blas_core_name(), rt.comm->name(), cpu.summary.c_str(),
      (long long)(trainer.positives_per_step() * S), (long long)trainer.positives_per_step(), S,
      cfg.num_factors);
  for (size_t k = 0; k < cfg.layers.size(); ++k) std::printf("%s%d", k ? "," : " ", cfg.layers[k]);
  std::printf(", embedding optimizer %s, %s%s%s%s\n", cfg.embedding_optimizer.c_str(),
              embedding_lr_description(cfg).c_str(), trainer.plan().dedup ? ", dedup" : "",
              cfg.exchange_dtype == "bf16" ? ", bf16 exchange payloads" : "",
              cfg.table_dtype == "bf16" ? ", bf16 table rows" : "");
  if (!rt.device_note.empty())
    std::printf("ncf_dist: device %s (%s)\n", device_name(device), rt.device_note.c_str());
  if (!rt.nodes_note.empty()) std::printf("ncf_dist: nodes: %s\n", rt.nodes_note.c_str());
  if (device == Device::kCpu) {
    std::printf("ncf_dist: tower products: %s\n", cpu_matmul_description().c_str());
    // The element-wise loops beside the products (common/vector_isa.h).
    if (vector_isa() == best_vector_isa())
      std::printf("ncf_dist: CPU loops: %s\n", vector_isa_name(vector_isa()));
    else
      std::printf("ncf_dist: CPU loops: %s (NCF_VECTOR_ISA; this CPU's widest: %s)\n",
                  vector_isa_name(vector_isa()), vector_isa_name(best_vector_isa()));
  }
  std::printf("ncf_dist: shard plan: %s\n", trainer.plan().reason.c_str());
  std::printf("ncf_dist: embedding rows: %s\n", trainer.table_tier_reason().c_str());
  std::printf("ncf_dist: evaluation: %s\n",
              trainer.eval_by_items()
                  ? "candidates scored from the item table (layer 0's items' half once per item)"
                  : "candidates' rows looked up per sample");
  if (!trainer.exchange_reason().empty())
    std::printf("ncf_dist: exchange: %s\n", trainer.exchange_reason().c_str());
  if (!trainer.cuda_graph_reason().empty())
    std::printf("ncf_dist: cuda graph: %s\n", trainer.cuda_graph_reason().c_str());
}

// Every rank's table bytes and memory estimate, gathered (collective) and printed by
// rank 0.
void print_rank_tables(const Trainer& trainer, Communicator& comm, const RankInfo& info) {
  const bool lead = info.rank == 0;
  const int W = info.world;
  const int T = int(trainer.plan().tables.size());
  std::vector<int64_t> mine = trainer.table_bytes();
  mine.push_back(trainer.memory_estimate_bytes());
  // Host arrays: each rank fills its T + 1 entries and a sum assembles them
  // (all_reduce_sum_on stages host data for a device communicator like NCCL).
  std::vector<int64_t> all(size_t(T + 1) * W, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + size_t(T + 1) * info.rank);
  all_reduce_sum_on(comm, Device::kCpu, all.data(), all.size(), DType::kInt64);
  if (lead)
    for (int r = 0; r < W; ++r) {
      const auto first = all.begin() + size_t(T + 1) * r;
      std::printf(
          "ncf_dist:   rank %d: %s, estimated memory %.3f MiB\n", r,
          describe_rank_tables(trainer.plan(), std::vector<int64_t>(first, first + T)).c_str(),
          first[T] / 1048576.0);
    }
}

// --eval_only: rank 0's line and --metrics_json record of the loaded checkpoint's
// evaluation.
void report_eval_only(const TrainConfig& cfg, const DatasetMeta& meta,
                      const Trainer::Position& start, const EvalResult& ev,
                      std::ofstream& metrics) {
  std::printf(
      "ncf_dist: eval of the checkpoint (epoch %lld, %lld steps into it), %lld users: "
      "sampled HR@%d %.4f NDCG@%d %.4f (1 + %u candidates)",
      (long long)start.epoch + 1, (long long)start.epoch_step, (long long)ev.users, cfg.topk, ev.hr,
      cfg.topk, ev.ndcg, meta.eval_negatives);
  if (ev.full)
    std::printf("; full ranking HR@%d %.4f NDCG@%d %.4f (%llu items)", cfg.topk, ev.full_hr,
                cfg.topk, ev.full_ndcg, (unsigned long long)meta.num_items);
  std::printf(" in %.2f s\n", ev.seconds);
  if (metrics.is_open()) {
    nlohmann::json j = {{"eval_only", true}, {"hr", ev.hr},       {"ndcg", ev.ndcg},
                        {"k", cfg.topk},     {"users", ev.users}, {"eval_seconds", ev.seconds}};
    if (ev.full) j["full_hr"] = ev.full_hr, j["full_ndcg"] = ev.full_ndcg;
    metrics << j.dump() << "\n";
  }
}

// One epoch's line on rank 0, and its --metrics_json record and TensorBoard scalars.
void report_epoch(const TrainConfig& cfg, const DatasetMeta& meta, const RankInfo& info,
                  const Trainer& trainer, int e, const EpochResult& r, const EvalResult& ev,
                  double sps, std::ofstream& metrics, TensorBoardWriter* tb) {
  std::printf("%6d %9.5f %8.4f %8.4f %9.2f %12.0f %8.2f\n", e + 1, r.loss, ev.hr, ev.ndcg,
              r.train_seconds, sps, ev.seconds);
  if (ev.full)
    std::printf("       full ranking: HR@%d %.4f NDCG@%d %.4f (%lld users x %llu items)\n",
                cfg.topk, ev.full_hr, cfg.topk, ev.full_ndcg, (long long)ev.users,
                (unsigned long long)meta.num_items);
  if (cfg.step_log)
    std::printf(
        "  time split (rank 0): exchange %.2f s, compute %.2f s, allreduce %.2f s; "
        "%.1f KiB sent per step; exchanges per step: intra-node %.1f msgs %.1f KiB, "
        "inter-node %.1f msgs %.1f KiB\n",
        r.exchange_seconds, r.compute_seconds, r.allreduce_seconds,
        r.steps ? double(r.bytes_sent) / r.steps / 1024 : 0.0,
        r.steps ? double(r.intra_msgs) / r.steps : 0.0,
        r.steps ? double(r.intra_bytes) / r.steps / 1024 : 0.0,
        r.steps ? double(r.inter_msgs) / r.steps : 0.0,
        r.steps ? double(r.inter_bytes) / r.steps / 1024 : 0.0);
  const RowCache::Counters* tier = r.host_tier ? &r.tier : nullptr;
  if (tier)
    std::printf(
        "       host tier (so far, the most of any rank): %lld rows loaded, %lld of them at "
        "step time in %lld of %lld steps (waited %.3f s); %lld written back, %lld of them "
        "inside their window; largest window %lld rows, largest step %lld rows; host time "
        "announcing %.3f s (%.2f ms a step)\n",
        (long long)tier->loads, (long long)tier->waited_loads, (long long)tier->waits,
        (long long)tier->steps, r.tier_wait_seconds, (long long)tier->evictions,
        (long long)tier->evicted_in_window, (long long)tier->most_window_rows,
        (long long)tier->most_step_rows, r.tier_host_seconds,
        tier->steps ? 1e3 * r.tier_host_seconds / double(tier->steps) : 0.0);
  std::fflush(stdout);
  if (metrics.is_open()) {
    nlohmann::json j = {{"epoch", e + 1},
                        {"loss", r.loss},
                        {"hr", ev.hr},
                        {"ndcg", ev.ndcg},
                        {"k", cfg.topk},
                        {"train_seconds", r.train_seconds},
                        {"samples_per_second", sps},
                        {"eval_seconds", ev.seconds},
                        {"steps", r.steps},
                        {"samples", r.samples},
                        {"exchange_seconds", r.exchange_seconds},
                        {"compute_seconds", r.compute_seconds},
                        {"allreduce_seconds", r.allreduce_seconds},
                        {"bytes_sent_per_step", r.steps ? r.bytes_sent / r.steps : 0},
                        {"intra_node_msgs", r.intra_msgs},
                        {"intra_node_bytes", r.intra_bytes},
                        {"inter_node_msgs", r.inter_msgs},
                        {"inter_node_bytes", r.inter_bytes},
                        {"world", info.world}};
    if (ev.full) j["full_hr"] = ev.full_hr, j["full_ndcg"] = ev.full_ndcg;
    if (tier)
      j["host_tier"] = {{"steps", tier->steps},
                        {"waits", tier->waits},
                        {"loads", tier->loads},
                        {"waited_loads", tier->waited_loads},
                        {"wait_seconds", r.tier_wait_seconds},
                        {"host_seconds", r.tier_host_seconds},
                        {"evictions", tier->evictions},
                        {"evicted_in_window", tier->evicted_in_window},
                        {"most_window_rows", tier->most_window_rows},
                        {"most_step_rows", tier->most_step_rows},
                        {"split_passes", tier->parallel_passes},
                        {"lookahead_steps", trainer.lookahead()},
                        {"copy_in_gbps", trainer.copy_in_gbps()},
                        {"copy_out_gbps", trainer.copy_out_gbps()},
                        {"cache_rows", trainer.cache_slots()},
                        {"cache_row_bytes", trainer.cache_row_bytes()}};
    metrics << j.dump() << "\n";
    metrics.flush();
  }
  if (tb)
    write_epoch_scalars(*tb, trainer.global_step(), e + 1, r, sps, cfg.eval_each_epoch, ev,
                        cfg.topk);
}

// One job per checkpoint directory (train/checkpoint_lock.h): taken before
// any rank writes anything, refused on every rank alike, released when this
// function is left, by a return or an exception. --eval_only only reads.
std::unique_ptr<CheckpointLock> take_checkpoint_lock(const TrainConfig& cfg, Communicator& comm) {
  if (cfg.checkpoint_dir.empty() || cfg.eval_only) return nullptr;
  CheckpointLockOptions lock_options;
  lock_options.stale_seconds = double(cfg.checkpoint_lock_stale_seconds);
  std::vector<std::string> notes;
  std::unique_ptr<CheckpointLock> lock =
      CheckpointLock::acquire(comm, cfg.checkpoint_dir, lock_options, &notes);
  for (const std::string& n : notes) std::fprintf(stderr, "ncf_dist: note: %s\n", n.c_str());
  return lock;
}

// The MLPerf log's run settings, ending its init interval.
void log_mlperf_settings(MlLog& mllog, const TrainConfig& cfg, const Trainer& trainer) {
  const DatasetMeta& meta = trainer.meta();
  const int S = cfg.num_neg + 1;
  mllog.event("global_batch_size", trainer.positives_per_step() * S);
  mllog.event("opt_base_learning_rate", cfg.learning_rate);
  mllog.event("opt_adam_beta_1", cfg.beta1);
  mllog.event("opt_adam_beta_2", cfg.beta2);
  mllog.event("opt_adam_epsilon", cfg.epsilon);
  mllog.event("train_samples", meta.num_train);
  mllog.event("eval_samples", meta.num_eval_users * (meta.eval_negatives + 1));
  mllog.event("init_stop", nullptr, {}, "INTERVAL_END");
}

// Where training starts: the checkpoint --resume finds, else the --init_from warm start;
// then the epoch lines' header on rank 0. --eval_only with nothing to evaluate stops here.
Trainer::Position start_position(const TrainConfig& cfg, Trainer& trainer, bool lead) {
  const Trainer::Position start = trainer.resume();
  // A warm start, unless a checkpoint of this run was found (a requeued job
  // continues where it stopped, with the same command line).
  if (!cfg.init_from.empty()) {
    if (!trainer.resumed()) {
      trainer.warm_start();
    } else if (lead) {
      std::printf("ncf_dist: --init_from %s not used: resumed from this run's own checkpoint\n",
                  cfg.init_from.c_str());
    }
  }
  // The epoch lines' header, after what the checkpoint search printed.
  if (lead)
    std::printf("%6s %9s %8s %8s %9s %12s %8s\n", "epoch", "loss",
                ("HR@" + std::to_string(cfg.topk)).c_str(),
                ("NDCG@" + std::to_string(cfg.topk)).c_str(), "train_s", "samples/s", "eval_s");
  // Nothing to evaluate: --resume auto found no checkpoint (the same on every rank).
  if (cfg.eval_only && !trainer.resumed() && cfg.init_from.empty())
    NCF_FAIL("flag --eval_only: --resume ", cfg.resume, " found no checkpoint to evaluate in ",
             cfg.checkpoint_dir);
  return start;
}

int train_main(int& argc, char**& argv) {
  TrainConfig cfg;
  int code = 0;
  // Flags are checked before MPI starts, so --help and bad flags need no launcher.
  if (!parse_train_flags(argc, argv, &cfg, &code)) return code;

  // MPI only under a launcher (or --comm mpi): a plain run is one rank without MPI.
  // Declared before the trainer so that the context and communicator outlive it.
  // --topology's declared nodes, read before MPI starts (a bad value is refused
  // here, on every rank alike); the links are the trainer's.
  const int ranks_per_node = parse_topology(cfg.topology, false).ranks_per_node;
  RankRuntime rt(&argc, &argv, cfg.device, cfg.comm, cfg.threads, ranks_per_node);
  const Device device = rt.ctx.device;
  cfg.device = device_name(device);
  use_device_defaults(&cfg, device == Device::kCuda);
  if (rt.info.world > 1) set_collective_timeout(cfg.peer_timeout);
  // Collective: every rank's heartbeat connections to its ring neighbours.
  if (cfg.peer_lost_after > 0) {
    const PeerWatchStart w = start_peer_watch(rt.info, {cfg.peer_lost_after, "ncf_dist"});
    if (!w.warning.empty()) std::fprintf(stderr, "ncf_dist: warning: %s\n", w.warning.c_str());
  }
  const RankInfo& info = rt.info;
  ExecContext& ctx = rt.ctx;
  std::unique_ptr<Communicator>& comm = rt.comm;
  const bool lead = info.rank == 0;
  note_flags_without_effect(cfg, info, lead);
  // Collective: every rank's mask and thread count, for the startup line below.
  const CpuReport cpu = cpu_report(rt, "ncf_dist");
  for (const std::string& w : cpu.warnings) std::fprintf(stderr, "%s\n", w.c_str());
  set_math_mode(parse_math_mode(cfg.precision));
  apply_kernel_switches(cfg, lead);
  check_flags_against_data(cfg, DatasetMeta::load(cfg.data_dir), lead);
  // Taken before any rank writes anything, released when this function is left.
  const std::unique_ptr<CheckpointLock> lock = take_checkpoint_lock(cfg, *comm);
  // Before the trainer loads anything, so that a refused directory costs nothing
  // (collective; none with --eval_only).
  std::unique_ptr<TensorBoardWriter> tb = open_tensorboard(cfg, *comm);

  MlLog mllog(cfg.mlperf_log && lead);
  mllog.event("init_start", nullptr, {}, "INTERVAL_START");
  Trainer trainer(cfg, *comm, ctx);
  trainer.set_checkpoint_lock(lock.get());
  const DatasetMeta& meta = trainer.meta();
  if (lead) print_start_up(cfg, rt, cpu, trainer);
  print_rank_tables(trainer, *comm, info);
  log_mlperf_settings(mllog, cfg, trainer);
  mllog.event("run_start", nullptr, {}, "INTERVAL_START");

  std::ofstream metrics;
  if (lead && !cfg.metrics_json.empty()) {
    metrics.open(cfg.metrics_json, std::ios::app);
    if (!metrics) NCF_FAIL("flag --metrics_json: cannot open ", cfg.metrics_json, " for writing");
  }
  if (trainer.checkpointing()) {
    trainer.set_stop_flag(&g_stop_signal);
    install_stop_handlers();
  }
  const Trainer::Position start = start_position(cfg, trainer, lead);
  trainer.set_tensorboard(tb.get());
  if (tb) tb->session_start(trainer.global_step() + 1);
  if (cfg.eval_only) {
    const EvalResult ev = trainer.evaluate();
    if (lead) report_eval_only(cfg, meta, start, ev, metrics);
    save_params(cfg, lead, &trainer);
    comm->barrier();
    return 0;
  }
  bool reached = false;
  for (int e = int(start.epoch); e < cfg.train_epochs && !reached; ++e) {
    mllog.event("epoch_start", nullptr, {{"epoch_num", e + 1}}, "INTERVAL_START");
    EpochResult r = trainer.train_epoch(e, e == start.epoch ? start.epoch_step : 0);
    mllog.event("epoch_stop", nullptr, {{"epoch_num", e + 1}}, "INTERVAL_END");
    if (r.stopped) {
      if (lead)
        std::printf(
            "ncf_dist: stopped by %s in epoch %d; checkpoint written; exit code %d "
            "(resume with --resume auto)\n",
            g_stop_signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM", e + 1, kExitPreempted);
      if (tb) tb->close();
      std::fflush(stdout);
      comm->barrier();
      return kExitPreempted;
    }
    EvalResult ev;
    if (cfg.eval_each_epoch) {
      mllog.event("eval_start", nullptr, {{"epoch_num", e + 1}}, "INTERVAL_START");
      ev = trainer.evaluate();
      mllog.event("eval_accuracy", ev.hr, {{"epoch_num", e + 1}});
      mllog.event("eval_stop", nullptr, {{"epoch_num", e + 1}}, "INTERVAL_END");
      reached = cfg.hr_threshold >= 0 && ev.hr >= cfg.hr_threshold;
    }
    const double sps = r.train_seconds > 0 ? double(r.samples) / r.train_seconds : 0;
    if (lead) report_epoch(cfg, meta, info, trainer, e, r, ev, sps, metrics, tb.get());
  }
  mllog.event("run_stop", nullptr,
              {{"status", reached || cfg.hr_threshold < 0 ? "success" : "aborted"}},
              "INTERVAL_END");
  if (reached && lead)
    std::printf("ncf_dist: HR@%d reached --hr_threshold %g\n", cfg.topk, cfg.hr_threshold);
  if (lead && trainer.graph_launches() > 0)
    std::printf("ncf_dist: cuda graph: %lld steps launched as graphs (%lld executable graphs)\n",
                (long long)trainer.graph_launches(), (long long)trainer.graph_instantiations());

  trainer.save_final_checkpoint();
  if (tb) tb->close();
  save_params(cfg, lead, &trainer);
  comm->barrier();
  return 0;
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  ncf::upgrade_blas_kernels(argv);
  return ncf::run_main(argc, argv, ncf::train_main, "ncf_dist");
}
