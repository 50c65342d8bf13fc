// ncf_dist's command line: TF Model Garden NCF flag names where one exists,
// presets for the reference settings, and the checks that turn bad values or
// combinations into one clear message naming the flag and the value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ncf {

// The default --eval_batch_size of a GPU rank: at 100,000 a GPU evaluation is bound by
// its per-batch work on the host (on an H200 the GPU kit's eval_speed stages timed one
// ml-20m evaluation at 0.37-0.38 s at 100,000 and 0.22-0.24 s at 1,000,000).
constexpr int64_t kGpuEvalBatchSize = 1000000;

struct TrainConfig {
  std::string data_dir;
  std::string preset;         // "", "ml-20m-mlperf", "ncf-paper"
  int64_t batch_size = 2048;  // training samples per global step (positives × (1 + num_neg))
  // Eval samples (users × (1 + E)) per eval batch per rank: 100,000 on CPU ranks, and
  // kGpuEvalBatchSize on GPU ranks unless --eval_batch_size was given (use_device_defaults).
  int64_t eval_batch_size = 100000;
  bool eval_batch_size_given = false;
  double learning_rate = 0.001;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  int num_factors = 8;  // mf_dim
  std::vector<int> layers{64, 32, 16, 8};
  int num_neg = 4;
  int train_epochs = 20;
  double hr_threshold = -1;  // stop when HR@K reaches it (< 0: never)
  uint64_t seed = 1;
  int topk = 10;            // K of HR@K / NDCG@K
  bool topk_given = false;  // --topk was on the command line (not the default)
  bool peer_lost_after_given = false;
  std::string device = "auto";     // auto | cpu | cuda (RankRuntime resolves auto)
  std::string precision = "tf32";  // tower GEMMs: tf32 (GPU only) | fp32 | bf16 (model/ops.h)
  int threads = 0;                 // CPU kernel threads per rank (0: cores / local ranks)
  std::string cuda_graph = "off";  // off | on: each training step as one CUDA graph (step_graph.h)
  std::string layer0_by_item = "auto";  // auto | on | off (model/neumf.h Layer0ByItem)
  std::string embedding_optimizer = "dense_adam";
  // The embedding optimizer's rate: --embedding_lr when given (< 0: --learning_rate), else
  // default_embedding_lr's for the optimizer and preset; a resumed run without the flag
  // takes its checkpoint's (Trainer::load_checkpoint).
  double embedding_lr = -1;
  bool embedding_lr_given = false;
  std::string embedding_lr_from;  // where the rate came from, for the start-up line
  double l2_embedding = 0, l2_dense = 0;
  double adagrad_init = -1;   // negative: 0.1 for adagrad (Keras), 0 for rowwise_adagrad (FBGEMM)
  std::string comm = "auto";  // auto | mpi | nccl | single
  std::string shard_plan = "auto";      // auto | row | table | replicated | user=...,item=...
  std::string dedup = "auto";           // auto | on | off | node (embedding/plan.h)
  std::string exchange = "auto";        // auto | flat | two_hop (comm/communicator.h)
  std::string exchange_dtype = "fp32";  // fp32 | bf16: the row exchanges' payload
  std::string table_dtype = "fp32";     // fp32 | bf16: how embedding rows are stored
  std::string topology;                 // links for the exchange model (embedding/exchange_model.h)
  double peer_timeout = 0;              // s a rank may wait in one collective (0: no limit)
  double peer_lost_after = 30;  // s of a neighbour's silence that make it lost (0: no watch)
  double memory_limit_gb = 0;   // per rank, 0: this machine's free memory
  // The host tier (embedding/collection.h): auto | BYTES[K|M|G|T] | P% of this rank's tables.
  std::string device_table_budget = "auto";
  int64_t lookahead_steps = -1;  // steps whose rows the host tier is told of ahead (<0: auto)
  int64_t max_steps = -1;        // per epoch (tests, benchmarks); < 0: whole epoch
  bool shuffle_records = true;
  bool eval_each_epoch = true;
  bool eval_full_ranking = false;         // also rank each eval user's test item against all items
  bool eval_only = false;                 // evaluate the --resume checkpoint and stop
  int64_t eval_users = 0;                 // > 0: evaluate a fixed seeded subset of this many users
  std::string eval_scoring = "auto";      // auto | per_sample (Trainer::eval_by_items)
  std::string eval_lists_cache = "auto";  // auto | on | off (Trainer::eval_lists_cached)
  bool eval_phases = false;               // rank 0 prints where each evaluation's time went
  std::string metrics_json;
  bool mlperf_log = false;
  std::string progress = "auto";  // auto | on | off
  std::string save_params;        // write final parameters (rank 0) to this file
  bool step_log = false;          // per-step time split and bytes moved
  // TensorBoard event files (train/tensorboard.h), written by rank 0.
  std::string tensorboard_dir;
  int64_t tensorboard_every_steps = 100;  // training scalars every N steps (0: per epoch only)
  // Checkpoints (train/checkpoint.h) and resuming.
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;   // 0: not by steps
  double checkpoint_every_minutes = 0;  // 0: not by time
  int keep_checkpoints = 2;
  int64_t checkpoint_chunk_kib = 65536;    // rows staged per exchange when checkpointing
  std::string resume = "never";            // never | auto | PATH
  std::vector<std::string> allow_changed;  // flags a resumed run may change
  // A warm start (Trainer::warm_start): a checkpoint of this dataset or of an
  // ancestor (ncf_prep --extend), its rows matched by original id; "keep" or
  // "reset" its optimizer state. A checkpoint --resume finds comes first.
  std::string init_from;
  std::string init_optimizer_state = "keep";
  // A lock of --checkpoint_dir held on another host is stale after this long
  // without a heartbeat (train/checkpoint_lock.h).
  int64_t checkpoint_lock_stale_seconds = 300;
  // Flags the command line gave that this combination never reads, each with
  // why ("--hr_threshold: no evaluation (--no_eval)"); ncf_dist prints them as
  // notes and runs on.
  std::vector<std::string> unused_flags;
};

// The flags a training trajectory depends on, by flag name: what a checkpoint
// records, and what a resumed run must match. Output flags (--metrics_json,
// --step_log, --tensorboard_dir, --tensorboard_every_steps, ...) are not among
// them: a resumed run may set them as it likes.
nlohmann::json trajectory_flags(const TrainConfig& cfg);
// The inverse: sets cfg's trajectory flags from such an object (a checkpoint
// manifest's "config"), each checked against the range the command line has;
// errors name `where` and the missing, mistyped or out-of-range flag.
void apply_trajectory_flags(const nlohmann::json& flags, const std::string& where,
                            TrainConfig* cfg);
// A checkpoint's recorded flags with the values that flags added since imply
// where they are absent (--exchange_dtype fp32, --table_dtype fp32).
nlohmann::json with_later_flags(const nlohmann::json& flags);
// The trajectory flags a resumed run may change with --allow_changed_flags.
const std::vector<std::string>& changeable_flags();

// Parses argv (CLI11). Returns false when the program should exit right away
// (--help), with *exit_code set. Throws ncf::Error on bad values: every
// numeric flag has a range, which --help states.
bool parse_train_flags(int argc, char** argv, TrainConfig* cfg, int* exit_code);

// The rate an embedding optimizer trains with when --embedding_lr is not given, for a
// preset ("" for none): negative for dense_adam and lazy_adam (the preset's
// --learning_rate), a measured one for sgd, adagrad and rowwise_adagrad
// (docs/training.md).
double default_embedding_lr(const std::string& optimizer, const std::string& preset);
// "embedding lr 0.1 (rowwise_adagrad's default for ncf-paper)", "embedding lr 0.001
// (--learning_rate)", "embedding lr 0.05 (--embedding_lr)": the rate and where it came from.
std::string embedding_lr_description(const TrainConfig& c);
// The rate the embedding optimizer steps with: embedding_lr, or learning_rate when negative.
double effective_embedding_lr(const TrainConfig& c);

// Checks that need no data: every numeric flag's range, layer widths,
// combinations. (The ones that need the dataset, --topk and --eval_users
// against its eval lists, are ncf_dist's.)
void validate_config(const TrainConfig& cfg);

// The defaults that depend on where the ranks run, once --device is resolved (the
// same on every rank): on GPU ranks --eval_batch_size is kGpuEvalBatchSize unless given.
void use_device_defaults(TrainConfig* cfg, bool gpu);

// --device_table_budget: "auto" (kAuto), a byte count with an optional K, M, G or T
// (powers of 1024, an optional "iB" or "B" after it: "64M", "1.5GiB"), or a percentage
// of this rank's tables with their optimizer state ("30%"). Anything else fails,
// naming the flag and the value.
struct TableBudget {
  enum Kind { kAuto, kBytes, kPercent } kind = kAuto;
  double value = 0;  // bytes, or percent in (0, 100]
};
TableBudget parse_table_budget(const std::string& s);

// The host tier is on every rank or on none: its announcements are collective. From every
// rank's own decision (its cache in rows, 0 for none: under auto a GPU rank whose tables fit
// takes none), this rank's cache: its own, or, where another rank took one and it did not,
// every one of its rows (at least one), a cache that mirrors the rows and leaves the steps
// as they are.
int64_t agreed_cache_slots(const std::vector<int64_t>& slots_of_ranks, int rank, int64_t rows);

}  // namespace ncf
