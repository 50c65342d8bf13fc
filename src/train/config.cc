// Flag parsing for ncf_dist (CLI11) and the presets (docs/training.md).
#include "train/config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <type_traits>

#include "common/check.h"
#include "train/flag_range.h"

namespace ncf {

namespace {

struct Preset {
  const char* name;
  int64_t batch_size;
  double lr, beta1, beta2, eps;
  int factors;
  std::vector<int> layers;
  int num_neg;
  double hr_threshold;
};

const Preset kPresets[] = {
    {"ml-20m-mlperf", 1048576, 0.0045, 0.25, 0.5, 1e-8, 64, {256, 256, 128, 64}, 4, 0.635},
    {"ncf-paper", 256, 0.001, 0.9, 0.999, 1e-8, 8, {64, 32, 16, 8}, 4, -1},
};

// The embedding optimizers' rates when --embedding_lr is not given. The Adam
// family keeps --learning_rate (negative here). The others' are the best of a
// measured sweep on the synthetic ml-1m shape (docs/training.md, "Embedding
// optimizers"; bench/compressed_quality.sh): the loss is a mean over the batch,
// so plain SGD's rate grows with the batch, and Adagrad's, whose accumulator
// starts at 0.1, nearly as much; row-wise Adagrad's accumulator starts at 0, so
// its steps are the rate's size at any batch. Without a preset the model and
// Adam settings are ncf-paper's, and so are the rates. ml-20m-mlperf's are
// measured at batch 65,536 (16 times smaller); sgd's and adagrad's are their
// sweeps' largest (sgd's the flag's range's end), so a larger batch may want more.
struct EmbeddingLrDefault {
  const char* preset;
  double sgd, adagrad, rowwise_adagrad;
};
const EmbeddingLrDefault kEmbeddingLrDefaults[] = {
    {"", 30, 10, 0.1},
    {"ncf-paper", 30, 10, 0.1},
    {"ml-20m-mlperf", 1000, 100, 0.3},
};

std::string format_rate(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// Every numeric flag of ncf_dist with its range, in one place: the parser
// attaches them (so --help states them and the command line is checked as it
// is read), validate_config checks them again once the presets are applied,
// and apply_trajectory_flags checks what a checkpoint's manifest recorded.
// The size bounds keep the int64 products of the memory estimate and of the
// buffers (samples x widths x bytes) far from overflowing; the others are
// wide of any setting a recommender is trained with.
template <class Config, class Visit>
void for_each_numeric_flag(Config& c, Visit&& visit) {
  constexpr uint64_t kMaxSteps = uint64_t{1} << 40;
  visit("batch_size", c.batch_size, FlagRange::ints(1, uint64_t{1} << 34));
  visit("eval_batch_size", c.eval_batch_size, FlagRange::ints(1, uint64_t{1} << 31));
  visit("learning_rate", c.learning_rate, FlagRange::reals(0, 1000).open_low());
  visit("beta1", c.beta1, FlagRange::reals(0, 1).open_high());
  visit("beta2", c.beta2, FlagRange::reals(0, 1).open_high());
  visit("epsilon", c.epsilon, FlagRange::reals(0, 1).open_low());
  visit("num_factors", c.num_factors, FlagRange::ints(1, 4096));
  visit("num_neg", c.num_neg, FlagRange::ints(0, 1000));
  visit("train_epochs", c.train_epochs, FlagRange::ints(1, 100000));
  visit("hr_threshold", c.hr_threshold, FlagRange::reals(0, 1).or_negative("never"));
  visit("seed", c.seed, FlagRange::ints(0, UINT64_MAX));
  visit("topk", c.topk, FlagRange::ints(1, 1 << 20));
  visit("threads", c.threads, FlagRange::ints(0, 1024));
  visit("embedding_lr", c.embedding_lr,
        FlagRange::reals(0, 1000).open_low().or_negative("use --learning_rate"));
  visit("l2_embedding", c.l2_embedding, FlagRange::reals(0, 1000));
  visit("l2_dense", c.l2_dense, FlagRange::reals(0, 1000));
  visit("adagrad_init", c.adagrad_init,
        FlagRange::reals(0, 1000).or_negative("the optimizer's default"));
  visit("peer_timeout", c.peer_timeout, FlagRange::reals(0, 7 * 86400));
  visit("peer_lost_after", c.peer_lost_after, FlagRange::reals(0, 86400));
  visit("memory_limit_gb", c.memory_limit_gb, FlagRange::reals(0, 1 << 20));
  visit("lookahead_steps", c.lookahead_steps, FlagRange::ints(0, 1024).or_negative("auto"));
  visit("max_steps", c.max_steps, FlagRange::ints(1, kMaxSteps).or_negative("whole epochs"));
  visit("eval_users", c.eval_users, FlagRange::ints(0, uint64_t{1} << 31));
  visit("tensorboard_every_steps", c.tensorboard_every_steps, FlagRange::ints(0, kMaxSteps));
  visit("checkpoint_every_steps", c.checkpoint_every_steps, FlagRange::ints(0, kMaxSteps));
  visit("checkpoint_every_minutes", c.checkpoint_every_minutes, FlagRange::reals(0, 525600));
  visit("keep_checkpoints", c.keep_checkpoints, FlagRange::ints(1, 10000));
  visit("checkpoint_chunk_kib", c.checkpoint_chunk_kib, FlagRange::ints(1, 1 << 24));
  visit("checkpoint_lock_stale_seconds", c.checkpoint_lock_stale_seconds,
        FlagRange::ints(2, 7 * 86400));
}

// --layers: each width, and how many there may be.
FlagRange layer_width() { return FlagRange::ints(1, 65536); }
constexpr size_t kMaxLayers = 32;

template <typename T>
std::string refusal_of(const FlagRange& r, const std::string& flag, T v) {
  if constexpr (std::is_integral_v<T>)
    return r.refusal(flag, static_cast<__int128>(v));
  else
    return r.refusal(flag, static_cast<double>(v));
}

// The checks of values a checkpoint records as well; `where` names the
// manifest they came from ("" for the command line).
void check_recorded_combinations(const TrainConfig& c, const std::string& where) {
  const std::string at = where.empty() ? std::string() : where + ": ";
  if (c.layers.empty() || c.layers.size() > kMaxLayers)
    NCF_FAIL(at, "flag --layers needs 1 to ", kMaxLayers, " widths, got ", c.layers.size());
  for (size_t k = 0; k < c.layers.size(); ++k) {
    const std::string why = refusal_of(layer_width(), "--layers", c.layers[k]);
    if (!why.empty()) NCF_FAIL(at, why, " (width ", k, ")");
  }
  if (c.layers[0] % 2 != 0)
    NCF_FAIL(at, "flag --layers: layers[0] = ", c.layers[0],
             " must be even (it is the user and item MLP embeddings side by side)");
  if (c.batch_size < c.num_neg + 1)
    NCF_FAIL(at, "flag --batch_size ", c.batch_size,
             " holds no positive: it must be at least 1 + num_neg = ", c.num_neg + 1);
}

// The data, the model and its schedule: what the references set.
void add_training_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--data_dir", c.data_dir, "dataset directory written by ncf_prep")->required();
  app.add_option("--preset", c.preset,
                 "reference settings; explicit flags override them:\n"
                 "ml-20m-mlperf: batch 1048576, lr 0.0045, betas 0.25/0.5, eps 1e-8, factors 64, "
                 "layers 256,256,128,64, num_neg 4, hr_threshold 0.635\n"
                 "ncf-paper: batch 256, lr 0.001, factors 8, layers 64,32,16,8, num_neg 4")
      ->check(CLI::IsMember({"ml-20m-mlperf", "ncf-paper"}));
  app.add_option("--batch_size", c.batch_size,
                 "training samples per global step, over all ranks (positives x (1 + num_neg); "
                 "rounded down to a multiple of 1 + num_neg)")
      ->capture_default_str();
  app.add_option("--eval_batch_size", c.eval_batch_size,
                 "eval samples (users x (1 + E)) scored per batch on each rank (default: "
                 "100000 on CPU ranks, 1000000 on GPU ranks)");
  app.add_option("--learning_rate", c.learning_rate, "Adam learning rate")->capture_default_str();
  app.add_option("--beta1", c.beta1, "Adam beta1")->capture_default_str();
  app.add_option("--beta2", c.beta2, "Adam beta2")->capture_default_str();
  app.add_option("--epsilon", c.epsilon, "Adam epsilon")->capture_default_str();
  app.add_option("--num_factors", c.num_factors, "GMF embedding width (mf_dim)")
      ->capture_default_str();
  app.add_option("--layers", c.layers,
                 "MLP widths; layers[0] is the concatenated [user ; item] MLP embedding, so it "
                 "must be even")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--num_neg", c.num_neg, "negatives sampled per positive")->capture_default_str();
  app.add_option("--train_epochs", c.train_epochs, "epochs to train")->capture_default_str();
  app.add_option("--hr_threshold", c.hr_threshold,
                 "stop once HR@K reaches this value (negative: never)")
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of initialisation, negatives and record order")
      ->capture_default_str();
  app.add_option("--topk", c.topk,
                 "K of HR@K and NDCG@K; at most the eval list's length, 1 + E of the dataset")
      ->capture_default_str();
}

// Where and in what precision the step runs.
void add_device_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--device", c.device,
                 "auto (a GPU per rank when this build has CUDA and every rank sees a GPU, "
                 "else the CPU; the start-up line says which and why), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--precision", c.precision,
                 "tower GEMMs: tf32 (TensorFloat-32 inputs, fp32 accumulation; rounds on the "
                 "GPU only, the CPU computes fp32), fp32, or bf16 (BF16 inputs, FP32 "
                 "accumulation and FP32 master weights, on both the CPU and GPU backends); "
                 "parameters, gradients, optimizer state and embeddings stay fp32")
      ->check(CLI::IsMember({"tf32", "fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--cuda_graph", c.cuda_graph,
                 "on: each training step after the first of its size is captured as one CUDA "
                 "graph and launched whole (the same kernels and arguments, the same bits, less "
                 "time between kernels); one GPU rank with fp32 table rows only, elsewhere the "
                 "start-up line says why the step runs as it is")
      ->check(CLI::IsMember({"off", "on"}))
      ->capture_default_str();
  app.add_option("--layer0_by_item", c.layer0_by_item,
                 "layer 0's item half: once per distinct item of a batch that repeats its "
                 "items, or once per sample (the same training up to float rounding): auto "
                 "(by item on GPU ranks, per sample on CPU ranks, where it measured slower), on "
                 "(by item on CPU ranks too), off (per sample everywhere)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--threads", c.threads,
                 "CPU kernel threads per rank (0: the cores its affinity mask allows, each shared "
                 "among the node's ranks that may run on it)")
      ->capture_default_str();
}

// The embedding optimizer and its regularisation.
void add_embedding_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--embedding_optimizer", c.embedding_optimizer,
                 "dense_adam (every row's moments decay each step, as the references), "
                 "lazy_adam (touched rows only), sgd, adagrad, rowwise_adagrad (one "
                 "accumulator per row: 1 float of state per row, where dense_adam keeps 2 per "
                 "element)")
      ->check(CLI::IsMember({"dense_adam", "lazy_adam", "sgd", "adagrad", "rowwise_adagrad"}))
      ->capture_default_str();
  app.add_option(
      "--embedding_lr", c.embedding_lr,
      "learning rate of the embedding optimizer (negative: --learning_rate); when "
      "not given: --learning_rate for dense_adam and lazy_adam, and for sgd, "
      "adagrad, rowwise_adagrad " +
          [] {
            std::string t;
            for (const EmbeddingLrDefault& d : kEmbeddingLrDefaults) {
              if (!*d.preset) continue;
              t += (t.empty() ? "" : "; ") + std::string(d.preset) + " " + format_rate(d.sgd) +
                   ", " + format_rate(d.adagrad) + ", " + format_rate(d.rowwise_adagrad);
            }
            return t +
                   " (ncf-paper's without a preset); a resumed run without "
                   "it keeps its checkpoint's";
          }());
  app.add_option("--l2_embedding", c.l2_embedding, "L2 coefficient on embedding rows (g += l2 p)")
      ->capture_default_str();
  app.add_option("--l2_dense", c.l2_dense, "L2 coefficient on tower and head weights")
      ->capture_default_str();
  app.add_option("--adagrad_init", c.adagrad_init,
                 "initial accumulator of adagrad and rowwise_adagrad (negative: 0.1 for "
                 "adagrad as Keras, 0 for rowwise_adagrad as FBGEMM)")
      ->capture_default_str();
}

// The tables over the ranks: collectives, placement, exchange, dtypes, lost peers, memory.
void add_distribution_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--comm", c.comm,
                 "collectives: auto (single for one rank, mpi on cpu, nccl on cuda), mpi, nccl, "
                 "single")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "single"}))
      ->capture_default_str();
  app.add_option("--shard_plan", c.shard_plan,
                 "embedding placement: auto (cost model), row, table, replicated, or per table "
                 "e.g. user=row,item=replicated")
      ->capture_default_str();
  app.add_option("--dedup", c.dedup,
                 "de-duplicate ids before the all-to-all exchange: auto (when the plan expects "
                 "at most half of a step's routed ids to be unique), on, off, or node (on, and "
                 "across the ranks of a node before ids cross nodes; needs the two-hop exchange)")
      ->expected(0, 1)
      ->default_str("on")  // the value of --dedup given alone
      ->check(CLI::IsMember({"auto", "on", "off", "node"}))
      // CLI11 would show the default_str, "on", as the default.
      ->option_text("TEXT:{auto,on,off,node}=auto (given alone: on)");
  app.add_option("--exchange", c.exchange,
                 "how the embedding all-to-alls cross nodes: flat (one message per peer rank), "
                 "two_hop (inside the node first, then one message per remote node), or auto "
                 "(the cost model's choice); falls back to flat on one node, unequal ranks per "
                 "node, or ranks not numbered node by node, saying why")
      ->check(CLI::IsMember({"auto", "flat", "two_hop"}))
      ->capture_default_str();
  app.add_option("--exchange_dtype", c.exchange_dtype,
                 "what the embedding all-to-alls carry per vector element: fp32, or bf16 (the "
                 "sender rounds rows and gradients to nearest-even, the receiver widens them; "
                 "half the bytes of vectors and gradients, ids unchanged, sums and updates "
                 "stay fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--table_dtype", c.table_dtype,
                 "how embedding rows are stored: fp32, or bf16 (half the bytes; read widened to "
                 "fp32, updated in fp32 and written back with stochastic rounding keyed by seed, "
                 "step, table, row and column; optimizer state stays fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--device_table_budget", c.device_table_budget,
                 "device memory per rank for its embedding rows and their optimizer state: "
                 "auto (all on the device where they fit, else a host tier with what the "
                 "memory estimate leaves free; CPU ranks: all), bytes (64M, 1.5G: the rows "
                 "live in host memory and the device caches this much of them, loaded ahead "
                 "from the steps' known ids; the same results to the bit), or a percentage of "
                 "the rank's tables (30%); needs an optimizer that updates touched rows only "
                 "(sgd, adagrad, rowwise_adagrad, lazy_adam)")
      ->check([](const std::string& v) {
        try {
          parse_table_budget(v);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      })
      ->capture_default_str();
  app.add_option("--lookahead_steps", c.lookahead_steps,
                 "with a host tier: how many steps ahead each step's ids are announced to the "
                 "rows' owners, which load the missing rows then (0: at the step itself; "
                 "negative, the default: as many, up to 4, as 90% of the smallest cache holds "
                 "at the first step's rows)")
      ->capture_default_str();
  app.add_option("--peer_timeout", c.peer_timeout,
                 "seconds a rank may wait in one collective before it ends itself, naming its "
                 "host: ends the ranks a lost or cut-off node leaves waiting (0: no limit; set "
                 "it above the longest healthy wait, e.g. a checkpoint chunk)")
      ->capture_default_str();
  app.add_option("--peer_lost_after", c.peer_lost_after,
                 "seconds of silence after which a neighbouring rank counts as lost: every rank "
                 "keeps a heartbeat connection to ranks r-1 and r+1 of its own, and a rank that "
                 "loses one (connection closed: process or host died; silence: host cut off) "
                 "says which rank and host, in which collective, and ends, as do the others it "
                 "tells (0: no watch)")
      ->capture_default_str();
  app.add_option("--topology", c.topology,
                 "links for the exchange's cost model: a file of key = value lines or inline "
                 "key=value,... (intra_gbps, intra_us, inter_gbps, inter_us, nics_per_node); "
                 "unset keys keep the defaults for the device; ranks_per_node=L declares "
                 "nodes of L consecutive ranks instead of the hosts MPI finds")
      ->capture_default_str();
  app.add_option("--memory_limit_gb", c.memory_limit_gb,
                 "memory a rank may use for tables and state (0: the machine's available "
                 "memory divided among the node's ranks)")
      ->capture_default_str();
}

// What a run does and reports: steps, evaluation, logs, TensorBoard.
void add_run_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--max_steps", c.max_steps,
                 "stop each epoch after this many global steps (negative: whole epochs)")
      ->capture_default_str();
  app.add_flag("!--no_shuffle", c.shuffle_records,
               "read train records in file order every epoch (default: an order per epoch)");
  app.add_flag("!--no_eval", c.eval_each_epoch, "skip evaluation after each epoch");
  app.add_flag("--eval_full_ranking", c.eval_full_ranking,
               "also rank each eval user's test item against every item it has no training "
               "interaction with (full-catalogue HR@K and NDCG@K)");
  app.add_flag("--eval_only", c.eval_only,
               "evaluate the checkpoint --resume names (or finds) and stop, without training");
  app.add_option("--eval_users", c.eval_users,
                 "evaluate a fixed subset of this many users, drawn with --seed (0: all; at "
                 "most the dataset's eval users)")
      ->capture_default_str();
  app.add_option("--eval_scoring", c.eval_scoring,
                 "auto: where the model and memory allow, each batch's items are scored once "
                 "through their half of the tower and each user's candidates read from them "
                 "(by items); per_sample: every (user, candidate) pair through the whole "
                 "tower, as --exchange_dtype bf16 always does (the reference the by-items "
                 "path is tested against; the same metrics up to float rounding)")
      ->check(CLI::IsMember({"auto", "per_sample"}))
      ->capture_default_str();
  app.add_option("--eval_lists_cache", c.eval_lists_cache,
                 "keep each rank's evaluation lists (users and candidates) in device memory "
                 "between evaluations: auto (on GPU ranks where they fit, not with "
                 "--eval_only), on (on any device: CPU ranks keep them in host memory), off "
                 "(read them from the files at every evaluation)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_flag("--eval_phases", c.eval_phases,
               "rank 0 prints where each evaluation's time went (prepare, read, upload, "
               "lookup, score, metrics, full ranking); each phase waits for the device, "
               "which slows the evaluation down");
  app.add_option("--metrics_json", c.metrics_json, "append one JSON line per epoch to this file");
  app.add_flag("--mlperf_log", c.mlperf_log, "print MLPerf-style :::MLLOG lines");
  app.add_option("--progress", c.progress,
                 "live progress line: auto (when stdout is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--save_params", c.save_params,
                 "write the final parameters (tower, head, full tables) as raw float32 to this "
                 "file");
  app.add_flag("--step_log", c.step_log,
               "log each step's time split (exchange, compute, allreduce) and bytes moved");
  app.add_option("--tensorboard_dir", c.tensorboard_dir,
                 "write TensorBoard event files here (rank 0; created when missing): the epoch "
                 "figures of --metrics_json and the training scalars of "
                 "--tensorboard_every_steps, on the global step");
  app.add_option("--tensorboard_every_steps", c.tensorboard_every_steps,
                 "with --tensorboard_dir: the loss, samples/s and step time split of the last N "
                 "global steps, every N steps (0: per epoch only)")
      ->capture_default_str();
}

// Checkpoints: writing, keeping, resuming, warm starts.
void add_checkpoint_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--checkpoint_dir", c.checkpoint_dir,
                 "write checkpoints here (a file system every rank shares)");
  app.add_option("--checkpoint_every_steps", c.checkpoint_every_steps,
                 "checkpoint every N optimizer steps (0: not by steps)")
      ->capture_default_str();
  app.add_option("--checkpoint_every_minutes", c.checkpoint_every_minutes,
                 "checkpoint when this many minutes passed since the last one (0: not by time)")
      ->capture_default_str();
  app.add_option("--keep_checkpoints", c.keep_checkpoints,
                 "checkpoints that load to keep in --checkpoint_dir (older ones are removed; "
                 "damaged ones are neither counted nor removed)")
      ->capture_default_str();
  app.add_option("--checkpoint_chunk_kib", c.checkpoint_chunk_kib,
                 "table rows a checkpoint stages per exchange, in KiB (bounds its extra memory)")
      ->capture_default_str();
  app.add_option("--checkpoint_lock_stale_seconds", c.checkpoint_lock_stale_seconds,
                 "a job holds --checkpoint_dir's lock (ncf_dist.lock) while it runs, and a "
                 "second job on it is refused; a holder that died is taken over: on this host "
                 "at once (its pid is gone), on another host once its heartbeat (refreshed "
                 "every fifth of this) is older than this many seconds, or the holder's own "
                 "setting if larger")
      ->capture_default_str();
  app.add_option("--resume", c.resume,
                 "never; auto: the newest sealed checkpoint in --checkpoint_dir that loads "
                 "(step 0 when there is none; an error naming each damaged one when it holds "
                 "sealed checkpoints and none loads); auto_or_restart: the same, but step 0 "
                 "instead of that error (naming what it skipped); or the path of one "
                 "checkpoint")
      ->capture_default_str();
  app.add_option("--init_from", c.init_from,
                 "warm start from this checkpoint (DIR/step-N or a checkpoint directory) of the "
                 "dataset or of one it extends (ncf_prep --extend): rows of ids on both sides "
                 "and the tower carry over, new ids start as from scratch; a checkpoint --resume "
                 "finds comes first");
  app.add_option("--init_optimizer_state", c.init_optimizer_state,
                 "with --init_from: keep the checkpoint's optimizer state (and step count) or "
                 "reset it")
      ->check(CLI::IsMember({"keep", "reset"}))
      ->capture_default_str();
  app.add_option("--allow_changed_flags", c.allow_changed,
                 "flags a resumed run may set differently from the checkpoint (some of "
                 "learning_rate, embedding_lr, train_epochs, exchange_dtype, table_dtype: "
                 "the tables are then converted)")
      ->delimiter(',');
}

// Flags given that this combination never reads. A note, not a refusal: a job
// script's common flags stay valid across its variants.
void note_unused_flags(const CLI::App& app, TrainConfig& c) {
  auto unused = [&](const char* flag, bool never_read, const std::string& why) {
    if (never_read && app.count(flag) > 0) c.unused_flags.push_back(flag + (": " + why));
  };
  const bool no_eval = !c.eval_each_epoch && !c.eval_only;
  for (const char* f : {"--topk", "--hr_threshold", "--eval_users", "--eval_full_ranking",
                        "--eval_scoring", "--eval_lists_cache", "--eval_phases"})
    unused(f, no_eval, "no evaluation (--no_eval)");
  unused("--hr_threshold", c.eval_only, "--eval_only trains nothing to stop");
  unused("--tensorboard_every_steps", c.tensorboard_dir.empty(), "no --tensorboard_dir");
  const bool no_checkpoints = c.checkpoint_dir.empty() && c.resume == "never";
  unused("--checkpoint_chunk_kib", no_checkpoints, "no --checkpoint_dir and no --resume");
  unused("--keep_checkpoints", c.checkpoint_dir.empty(), "no --checkpoint_dir");
  unused("--checkpoint_lock_stale_seconds", c.checkpoint_dir.empty() || c.eval_only,
         c.checkpoint_dir.empty() ? "no --checkpoint_dir"
                                  : "--eval_only writes nothing there and takes no lock");
  unused("--allow_changed_flags", c.resume == "never", "no --resume");
  unused("--init_optimizer_state", c.init_from.empty(), "no --init_from");
  unused("--cuda_graph", c.eval_only, "--eval_only trains no step");
  unused("--layer0_by_item", c.eval_only, "--eval_only trains no step");
}

// The preset's values of the flags not given.
void apply_preset(const CLI::App& app, TrainConfig& c) {
  if (c.preset.empty()) return;
  for (const Preset& p : kPresets) {
    if (c.preset != p.name) continue;
    auto unset = [&](const char* flag) { return app.count(flag) == 0; };
    if (unset("--batch_size")) c.batch_size = p.batch_size;
    if (unset("--learning_rate")) c.learning_rate = p.lr;
    if (unset("--beta1")) c.beta1 = p.beta1;
    if (unset("--beta2")) c.beta2 = p.beta2;
    if (unset("--epsilon")) c.epsilon = p.eps;
    if (unset("--num_factors")) c.num_factors = p.factors;
    if (unset("--layers")) c.layers = p.layers;
    if (unset("--num_neg")) c.num_neg = p.num_neg;
    if (unset("--hr_threshold")) c.hr_threshold = p.hr_threshold;
  }
}

// --embedding_lr given, or the embedding optimizer's default, and where it came from.
void resolve_embedding_lr(const CLI::App& app, TrainConfig& c) {
  c.embedding_lr_given = app.count("--embedding_lr") > 0;
  if (c.embedding_lr_given) {
    c.embedding_lr_from =
        c.embedding_lr < 0 ? "--learning_rate, as --embedding_lr < 0 asks" : "--embedding_lr";
  } else {
    c.embedding_lr = default_embedding_lr(c.embedding_optimizer, c.preset);
    c.embedding_lr_from = c.embedding_lr < 0 ? "--learning_rate"
                                             : c.embedding_optimizer + "'s default" +
                                                   (c.preset.empty() ? "" : " for " + c.preset);
  }
}

}  // namespace

bool parse_train_flags(int argc, char** argv, TrainConfig* cfg, int* exit_code) {
  TrainConfig& c = *cfg;
  CLI::App app{
      "ncf_dist: NeuMF (GMF + MLP) training with embedding tables sharded over MPI ranks.\n"
      "  ncf_dist --data_dir data/small --preset ncf-paper\n"
      "  mpirun -np 8 ncf_dist --data_dir data/ml-20m --preset ml-20m-mlperf --device cuda"};
  app.get_formatter()->column_width(34);
  add_training_flags(app, c);
  add_device_flags(app, c);
  add_embedding_flags(app, c);
  add_distribution_flags(app, c);
  add_run_flags(app, c);
  add_checkpoint_flags(app, c);
  for_each_numeric_flag(c, [&](const char* name, auto& field, const FlagRange& range) {
    const std::string flag = std::string("--") + name;
    app.get_option(flag)->transform(range_check<std::decay_t<decltype(field)>>(flag, range));
  });
  app.get_option("--layers")->transform(range_check<std::vector<int>>("--layers", layer_width()));

  refuse_empty_list_entries(argc, argv, {"--layers", "--allow_changed_flags"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw_if_range_refusal(e);
    *exit_code = app.exit(e);
    return false;
  }

  c.topk_given = app.count("--topk") > 0;
  c.eval_batch_size_given = app.count("--eval_batch_size") > 0;
  c.peer_lost_after_given = app.count("--peer_lost_after") > 0;
  note_unused_flags(app, c);
  apply_preset(app, c);
  resolve_embedding_lr(app, c);
  validate_config(c);
  return true;
}

double default_embedding_lr(const std::string& optimizer, const std::string& preset) {
  for (const EmbeddingLrDefault& d : kEmbeddingLrDefaults) {
    if (preset != d.preset) continue;
    if (optimizer == "sgd") return d.sgd;
    if (optimizer == "adagrad") return d.adagrad;
    if (optimizer == "rowwise_adagrad") return d.rowwise_adagrad;
    return -1;  // dense_adam, lazy_adam: --learning_rate
  }
  NCF_FAIL("flag --preset: no embedding learning rates for preset '", preset, "'");
}

double effective_embedding_lr(const TrainConfig& c) {
  return c.embedding_lr > 0 ? c.embedding_lr : c.learning_rate;
}

std::string embedding_lr_description(const TrainConfig& c) {
  return "embedding lr " + format_rate(effective_embedding_lr(c)) + " (" +
         (c.embedding_lr_from.empty()
              ? std::string(c.embedding_lr < 0 ? "--learning_rate" : "--embedding_lr")
              : c.embedding_lr_from) +
         ")";
}

void validate_config(const TrainConfig& c) {
  // Again after the presets; the command line's values were checked as read.
  for_each_numeric_flag(c, [&](const char* name, const auto& value, const FlagRange& range) {
    const std::string why = refusal_of(range, std::string("--") + name, value);
    if (!why.empty()) NCF_FAIL(why);
  });
  check_recorded_combinations(c, "");
  if (c.eval_only && c.resume == "never" && c.init_from.empty())
    NCF_FAIL(
        "flag --eval_only needs a checkpoint: --resume PATH, or --resume auto with "
        "--checkpoint_dir");
  if ((c.checkpoint_every_steps > 0 || c.checkpoint_every_minutes > 0) && c.checkpoint_dir.empty())
    NCF_FAIL("flags --checkpoint_every_steps/--checkpoint_every_minutes need --checkpoint_dir");
  if ((c.resume == "auto" || c.resume == "auto_or_restart") && c.checkpoint_dir.empty())
    NCF_FAIL("flag --resume ", c.resume, " needs --checkpoint_dir (where to look)");
  if (c.resume.empty())
    NCF_FAIL("flag --resume: empty (never, auto, auto_or_restart or a checkpoint path)");
  for (const std::string& f : c.allow_changed)
    if (std::find(changeable_flags().begin(), changeable_flags().end(), f) ==
        changeable_flags().end())
      NCF_FAIL("flag --allow_changed_flags: ", f,
               " cannot change on resume (only learning_rate, embedding_lr, train_epochs, "
               "exchange_dtype, table_dtype)");
  if (c.device == "cpu" && c.comm == "nccl")
    NCF_FAIL("flag --comm nccl needs --device cuda (NCCL exchanges device buffers)");
}

void use_device_defaults(TrainConfig* c, bool gpu) {
  if (gpu && !c->eval_batch_size_given) c->eval_batch_size = kGpuEvalBatchSize;
}

nlohmann::json trajectory_flags(const TrainConfig& c) {
  return {{"batch_size", c.batch_size},
          {"learning_rate", c.learning_rate},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"epsilon", c.epsilon},
          {"num_factors", c.num_factors},
          {"layers", c.layers},
          {"num_neg", c.num_neg},
          {"train_epochs", c.train_epochs},
          {"seed", c.seed},
          {"precision", c.precision},
          {"embedding_optimizer", c.embedding_optimizer},
          {"exchange_dtype", c.exchange_dtype},
          {"table_dtype", c.table_dtype},
          {"embedding_lr", c.embedding_lr},
          {"l2_embedding", c.l2_embedding},
          {"l2_dense", c.l2_dense},
          {"adagrad_init", c.adagrad_init},
          {"max_steps", c.max_steps},
          {"shuffle_records", c.shuffle_records}};
}

nlohmann::json with_later_flags(const nlohmann::json& flags) {
  nlohmann::json f = flags;
  if (f.is_object() && !f.contains("exchange_dtype")) f["exchange_dtype"] = "fp32";
  if (f.is_object() && !f.contains("table_dtype")) f["table_dtype"] = "fp32";
  return f;
}

void apply_trajectory_flags(const nlohmann::json& recorded_flags, const std::string& where,
                            TrainConfig* c) {
  const nlohmann::json flags = with_later_flags(recorded_flags);
  if (!flags.is_object()) NCF_FAIL(where, ": its flags ", flags.dump(), " are not an object");
  auto value = [&](const char* key) -> const nlohmann::json& {
    if (!flags.contains(key)) NCF_FAIL(where, ": no value for flag --", key);
    return flags.at(key);
  };
  auto wrong_type = [&](const char* key) {
    NCF_FAIL(where, ": flag --", key, " has value ", flags.at(key).dump(), " of the wrong type");
  };
  // Numbers are range-checked as on the command line: a manifest may be old,
  // or edited with its checksum recomputed, and a JSON integer converted
  // unchecked would wrap (a seed of -1) or truncate.
  const nlohmann::json recorded = trajectory_flags(*c);
  for_each_numeric_flag(*c, [&](const char* key, auto& field, const FlagRange& range) {
    using T = std::decay_t<decltype(field)>;
    if (!recorded.contains(key)) return;
    const nlohmann::json& j = value(key);
    std::string why;
    if constexpr (std::is_integral_v<T>) {
      if (!j.is_number_integer()) wrong_type(key);
      const __int128 v =
          j.is_number_unsigned() ? __int128(j.get<uint64_t>()) : __int128(j.get<int64_t>());
      why = range.refusal(std::string("--") + key, v);
      if (why.empty()) field = static_cast<T>(v);  // in range, so it fits
    } else {
      if (!j.is_number()) wrong_type(key);
      const double v = j.get<double>();
      why = range.refusal(std::string("--") + key, v);
      if (why.empty()) field = v;
    }
    if (!why.empty()) NCF_FAIL(where, ": ", why);
  });
  {
    const nlohmann::json& j = value("layers");
    if (!j.is_array()) wrong_type("layers");
    std::vector<int> layers;
    for (const nlohmann::json& w : j) {
      if (!w.is_number_integer()) wrong_type("layers");
      const __int128 v =
          w.is_number_unsigned() ? __int128(w.get<uint64_t>()) : __int128(w.get<int64_t>());
      const std::string why = layer_width().refusal("--layers", v);
      if (!why.empty()) NCF_FAIL(where, ": ", why, " (width ", layers.size(), ")");
      layers.push_back(int(v));
    }
    c->layers = layers;
  }
  auto get_string = [&](const char* key, std::string* out,
                        const std::vector<std::string>& allowed) {
    const nlohmann::json& j = value(key);
    if (!j.is_string()) wrong_type(key);
    *out = j.get<std::string>();
    if (std::find(allowed.begin(), allowed.end(), *out) == allowed.end())
      NCF_FAIL(where, ": flag --", key, " has value ", j.dump(), ", not one of this program's");
  };
  get_string("precision", &c->precision, {"tf32", "fp32", "bf16"});
  get_string("embedding_optimizer", &c->embedding_optimizer,
             {"dense_adam", "lazy_adam", "sgd", "adagrad", "rowwise_adagrad"});
  get_string("exchange_dtype", &c->exchange_dtype, {"fp32", "bf16"});
  get_string("table_dtype", &c->table_dtype, {"fp32", "bf16"});
  if (!value("shuffle_records").is_boolean()) wrong_type("shuffle_records");
  c->shuffle_records = flags.at("shuffle_records").get<bool>();
  if (trajectory_flags(*c) != flags)
    NCF_FAIL(where, ": its flags ", flags.dump(), " are not the set this program reads");
  check_recorded_combinations(*c, where);
}

const std::vector<std::string>& changeable_flags() {
  static const std::vector<std::string> flags = {"learning_rate", "embedding_lr", "train_epochs",
                                                 "exchange_dtype", "table_dtype"};
  return flags;
}

TableBudget parse_table_budget(const std::string& s) {
  TableBudget b;
  if (s == "auto") return b;
  const auto bad = [&](const char* why) {
    NCF_FAIL("flag --device_table_budget '", s, "': ", why,
             " (auto, bytes such as 64M or 1.5G, or a percentage such as 30%)");
  };
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    bad("not a number");
  }
  std::string unit = s.substr(used);
  if (!(v > 0) || !std::isfinite(v)) bad("must be above 0");
  if (unit == "%") {
    if (v > 100) bad("a percentage above 100");
    b.kind = TableBudget::kPercent;
    b.value = v;
    return b;
  }
  if (unit.size() >= 2 && unit.substr(unit.size() - 2) == "iB") unit.resize(unit.size() - 2);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  double scale = 1;
  if (unit == "K" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "M") {
    scale = 1024.0 * 1024;
  } else if (unit == "G") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (!unit.empty()) {
    bad("unknown unit");
  }
  if (v * scale < 1 || v * scale > 9.0e18) bad("outside 1 byte .. 8 EiB");
  b.kind = TableBudget::kBytes;
  b.value = v * scale;
  return b;
}

int64_t agreed_cache_slots(const std::vector<int64_t>& slots_of_ranks, int rank, int64_t rows) {
  NCF_CHECK(rank >= 0 && size_t(rank) < slots_of_ranks.size(), "agreed_cache_slots: rank ", rank,
            " of ", slots_of_ranks.size());
  const int64_t mine = slots_of_ranks[size_t(rank)];
  if (mine > 0) return mine;
  for (int64_t s : slots_of_ranks)
    if (s > 0) return std::max<int64_t>(rows, 1);
  return 0;
}

}  // namespace ncf
