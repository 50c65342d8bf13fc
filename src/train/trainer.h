// The epoch and eval loops around the step. One Trainer per rank: it owns the
// readers, the embedding collection (user and item tables), the replicated
// NeuMF tower and the step's state; train_step (step.h) is the step itself.
// The trainer reads each step's slice of positives, stages it on the device,
// calls train_step, and keeps the timing and the logs.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/device.h"
#include "common/step_timer.h"
#include "data/dataset.h"
#include "data/negatives.h"
#include "data/reader.h"
#include "embedding/collection.h"
#include "embedding/exchange_model.h"
#include "embedding/plan.h"
#include "model/neumf.h"
#include "model/optim.h"
#include "train/checkpoint.h"  // DamagedCheckpoint
#include "train/config.h"
#include "train/input_stager.h"
#include "train/scoring_model.h"
#include "train/step.h"
#include "train/step_graph.h"

namespace ncf {

class TensorBoardWriter;  // train/tensorboard.h
class EvalPhases;         // train/trainer_eval.cc (--eval_phases)

struct EpochResult {
  int64_t epoch = 0;
  int64_t steps = 0;
  int64_t samples = 0;  // global training samples this epoch
  double loss = 0;      // mean BCE over the epoch's samples
  double train_seconds = 0;
  // This rank's step time by phase (common/step_timer.h): host clocks on CPU
  // ranks, CUDA events on the compute stream on GPU ranks.
  double exchange_seconds = 0;   // embedding lookups and gradient exchanges, owners' update
  double allreduce_seconds = 0;  // dense-gradient allreduce (the wait for it on GPU ranks)
  double compute_seconds = 0;    // negatives, tower, dense Adam
  int64_t bytes_sent = 0;        // payload bytes this rank sent to other ranks
  // Of the count and all-to-all exchanges: messages and bytes this rank sent
  // inside its node and across nodes.
  int64_t intra_msgs = 0, intra_bytes = 0, inter_msgs = 0, inter_bytes = 0;
  bool stopped = false;  // a stop request ended the epoch early (checkpoint written)
  // With a host tier: its counters so far (row_cache.h), each the largest over the ranks,
  // the time steps spent waiting for their rows so far (StepPhase::kTierWait), and the
  // host time the announcements took so far (the draw of the step's negatives, the ids'
  // exchange to their owners, the cache's bookkeeping and the copies' enqueueing): on a GPU
  // rank the host work beside the device's steps that the tier adds.
  bool host_tier = false;
  RowCache::Counters tier;
  double tier_wait_seconds = 0;
  double tier_host_seconds = 0;
};

struct EvalResult {
  double hr = 0, ndcg = 0;  // sampled: the test item among its E negatives
  int64_t users = 0;
  double seconds = 0;
  // --eval_full_ranking: the test item among every item the user has no
  // training interaction with.
  bool full = false;
  double full_hr = 0, full_ndcg = 0;
};

// The plan of the user and item tables for a job: the planner's request
// built from the flags and the dataset, then embedding/plan.h's planner.
EmbeddingPlan plan_for_job(const TrainConfig& cfg, const DatasetMeta& meta, int W);

class Trainer : public ScoringModel {
 public:
  // With cfg.eval_only (ncf_dist --eval_only, ncf_recommend) it holds the
  // tables' rows only, without optimizer state, and cannot train.
  Trainer(const TrainConfig& cfg, Communicator& comm, const ExecContext& ctx);
  ~Trainer() override;

  // Trains epoch `epoch` from its step `first_step` (0, or where a resumed
  // checkpoint left it). Writes the checkpoints --checkpoint_every_* ask for,
  // and on a stop request (stop_flag) one more, then returns with stopped set.
  EpochResult train_epoch(int64_t epoch, int64_t first_step = 0);

  // Where training continues: after epoch_step steps of epoch.
  struct Position {
    int64_t epoch = 0, epoch_step = 0;
  };
  // --resume: loads the checkpoint it names, if any, after checking that it
  // belongs to this dataset and these flags (collective). Rank 0 prints what
  // it took or skipped.
  Position resume();
  // Whether resume() loaded a checkpoint.
  bool resumed() const { return !resumed_from_.empty(); }
  // --init_from: a warm start from a checkpoint of this dataset or of one of
  // its ancestors (ncf_prep --extend), refused otherwise naming both dataset
  // ids (collective). Rows of the original ids both datasets have are the
  // checkpoint's, with its optimizer state unless --init_optimizer_state
  // reset; the others keep the initialisation of this run (keyed by seed and
  // global row, so the same for any W); the tower and its Adam moments carry
  // over (and the step count, for Adam's bias correction, unless reset).
  // Training then starts at epoch 0 of this dataset. Rank 0 prints the counts.
  void warm_start();
  // A checkpoint of the state after epoch_step steps of epoch (collective);
  // returns its directory.
  std::string save_checkpoint(int64_t epoch, int64_t epoch_step);
  // A flag that a signal handler sets (non-zero: stop at the next step boundary).
  void set_stop_flag(const volatile int* flag) { stop_flag_ = flag; }
  // Rank 0's lock of --checkpoint_dir (checkpoint_lock.h): before each
  // checkpoint it must still be this job's, or the run fails instead of writing.
  void set_checkpoint_lock(const class CheckpointLock* lock) { lock_ = lock; }
  // Rank 0's event file (nullptr on other ranks): with --tensorboard_dir every
  // rank takes part in the training scalars every --tensorboard_every_steps
  // steps (their loss is summed over the ranks), and rank 0 writes them.
  void set_tensorboard(TensorBoardWriter* tb) { tb_ = tb; }
  // Optimizer steps taken since step 0 (a resumed run: counting the checkpoint's).
  int64_t global_step() const { return state_.t; }
  bool checkpointing() const { return !cfg_.checkpoint_dir.empty(); }
  // A checkpoint of where training ended, unless one of that step exists.
  void save_final_checkpoint();
  EvalResult evaluate();
  // Whether evaluate() scores against the item table (NeuMF::score_items): a
  // hidden layer and the fused top, FP32 rows on the wire (the rows the lookups
  // would bring), and eval_items_fit (memory_estimate.h); --eval_scoring per_sample
  // turns it off.
  bool eval_by_items() const;
  // Whether evaluate() keeps the lists on the device after the first evaluation and reads
  // them from there: GPU ranks whose lists fit eval_lists_cache_bytes (memory_estimate.h),
  // not with full ranking (it reads the host lists) or --eval_only. --eval_lists_cache off
  // turns it off, on turns it on, on any device.
  bool eval_lists_cached() const;
  // Loads a found checkpoint (resume(), ncf_recommend): its dataset must be
  // this one, and its flags this run's (with --eval_only: its shape flags).
  void load_checkpoint(const class CheckpointReader& ck);
  const DatasetMeta& meta() const override { return meta_; }
  const EmbeddingPlan& plan() const { return plan_; }
  // How the exchanges cross nodes and why (the startup line); "" at W = 1.
  const std::string& exchange_reason() const { return exchange_reason_; }
  // With --cuda_graph on: whether the steps run as CUDA graphs, and why not (the startup
  // line); "" with --cuda_graph off.
  const std::string& cuda_graph_reason() const { return graph_reason_; }
  // Steps launched as CUDA graphs so far, and the executable graphs made for them.
  int64_t graph_launches() const { return graph_ ? graph_->launches() : 0; }
  int64_t graph_instantiations() const { return graph_ ? graph_->instantiations() : 0; }
  // This rank's bytes per table (rows and optimizer state).
  std::vector<int64_t> table_bytes() const;
  int64_t positives_per_step() const { return P_; }
  // Dense parameters, then the full user and item tables (collective).
  std::vector<float> gather_parameters();
  int64_t memory_estimate_bytes() const { return memory_bytes_; }
  // --device_table_budget: where this rank's rows live and why (the start-up line), and
  // what its host tier did so far (null without one).
  const std::string& table_tier_reason() const { return tier_reason_; }
  const RowCache::Counters* table_cache_counters() const { return tables_->cache_counters(); }
  int64_t cache_slots() const { return cache_slots_; }
  // The host tier's k (negative until --lookahead_steps auto decided it) and this rank's
  // copy rates measured at start-up, GB/s to the cache and home.
  int64_t lookahead() const { return lookahead_; }
  double copy_in_gbps() const { return copy_in_gbps_; }
  double copy_out_gbps() const { return copy_out_gbps_; }
  int64_t cache_row_bytes() const { return tables_->cached_row_bytes(); }

  // Serving (scoring_model.h; recommend.cc), on the loaded state.
  std::vector<float> score_pairs(const std::vector<int32_t>& users,
                                 const std::vector<int32_t>& items) override;
  void recommend(const std::vector<int32_t>& users, int K, bool include_seen,
                 std::vector<int32_t>* items, std::vector<float>* logits) override;

 private:
  struct Drawn {  // the samples of a step drawn when it was announced (host tier)
    std::vector<int32_t> users, items;
    std::vector<float> labels;
  };
  // One global step on the batch acquired from stager_ (train_step); its loss
  // share goes to step_loss_[index] on the device (read back once per epoch).
  void step(const TrainBatch& batch, int64_t index, EpochResult* r, const Drawn* drawn = nullptr);
  // Adds the phase times of the steps the timer has finished to *r (and prints
  // their --step_log lines); wait_all at the end of an epoch.
  void account_step_times(bool wait_all, EpochResult* r);
  // --tensorboard_every_steps: the training scalars of the steps since the
  // last ones, after the step of index `last` in the epoch (collective).
  bool tb_windows() const {
    return !cfg_.tensorboard_dir.empty() && cfg_.tensorboard_every_steps > 0;
  }
  void log_train_window(int64_t last, EpochResult* r);
  // The whole item table (gathered: collective) copied `copies` times into
  // *tile on this rank's device, so that `copies` users meet every item in
  // one NeuMF::score ([copies × I × D]).
  void tile_item_table(int64_t copies, Buffer<float>* tile);
  // The whole item table on this rank (collective), its GMF columns apart, and
  // the model's per-item products of layer 0 (NeuMF::prepare_items). A rank that holds
  // the whole table on its device in FP32 (EmbeddingCollection::local_rows) reads it in
  // place: no copy through the host.
  void prepare_eval_items();
  // The positives.bin interactions of users[0..m) as one CSR on the host:
  // user x's items are (*items)[(*offsets)[x] .. (*offsets)[x+1]).
  void seen_items(const int32_t* users, int64_t m, std::vector<int64_t>* offsets,
                  std::vector<int32_t>* items) const;
  // evaluate()'s stages (trainer_eval.cc). One batch's lists where the device reads
  // them: users [n], candidates and masks [n × L].
  struct EvalLists {
    const int32_t* users = nullptr;
    const int32_t* items = nullptr;
    const uint8_t* mask = nullptr;
    int64_t n = 0;
  };
  // The next batch from eval_reader_ (empty past the end), keeping --eval_users' users.
  void read_eval_batch(EvalBatch* b);
  // Sends a read batch to the device through eval_stager_.
  void stage_eval_batch(const EvalBatch& b);
  // Batch k of eval_cache_.
  EvalLists cached_eval_lists(int64_t k) const;
  // The batch of n users eval_stager_ holds next; with `keep`, copied into eval_cache_.
  EvalLists staged_eval_lists(int64_t n, bool keep);
  // The lookup (collective: every rank, even with no user), the scores and the
  // batch's HR / NDCG sums added to eval_sums_ on the device.
  void score_eval_lists(const EvalLists& x, bool by_items, EvalPhases* phases);
  // --eval_full_ranking: the batch's users (their rows still in the lookup's) against
  // every item, `group` users at a time; their HR and NDCG added to full[0], full[1].
  void rank_full_catalogue(const EvalBatch& b, int64_t group, double* full);
  // Rank 0 tells that the lists stay on the device (the first evaluation's end).
  void report_eval_cache() const;
  // The evaluation's figures from the sums over all ranks (HR, NDCG, full HR, full NDCG).
  EvalResult eval_result(const double* sums, bool full) const;

  TrainConfig cfg_;
  Communicator& comm_;
  ExecContext ctx_;
  DatasetMeta meta_;
  EmbeddingPlan plan_;
  EmbeddingOptimizer table_optimizer_ = EmbeddingOptimizer::kDenseAdam;
  int64_t P_ = 0;  // positives per global step
  int64_t memory_bytes_ = 0;
  int64_t cache_slots_ = 0;  // the host tier's device cache, in rows (0: no host tier)
  std::string tier_reason_;
  // The host tier's lookahead: the ids of a step read ahead (its positives and the
  // negatives drawn for them on the host, as the step draws them) announced to the owners.
  void announce_step(const TrainBatch& b, Drawn* d);
  // The host tier's counters so far, each the largest over the ranks, into *r (collective).
  void tier_counters_over_ranks(EpochResult* r);
  // --lookahead_steps auto, with one step announced: the k every rank uses from now on,
  // the largest up to kMaxAutoLookahead whose window of k + 1 steps, at the most rows that
  // step touched on any rank, fits 90% of the smallest cache (collective): the farther
  // ahead, the longer the copies have; the tenth left covers steps larger than the first.
  int64_t choose_lookahead();
  static constexpr int64_t kMaxAutoLookahead = 4;
  std::vector<Drawn> drawn_;                     // by step % the lookahead's depth
  double tier_wait_seconds_ = 0;                 // this rank's StepPhase::kTierWait so far
  double tier_host_seconds_ = 0;                 // this rank's time in announce_step so far
  int64_t lookahead_ = -1;                       // the host tier's k (negative: not decided yet)
  double copy_in_gbps_ = 0, copy_out_gbps_ = 0;  // probe_copies at start-up, this rank's
  std::unique_ptr<PositiveLists> positives_;
  std::unique_ptr<DevicePositiveLists> device_positives_;  // GPU ranks: the CSR on the device
  std::unique_ptr<TrainReader> train_reader_;
  std::unique_ptr<InputStager> stager_;
  std::unique_ptr<StepTimer> timer_;
  std::unique_ptr<StepGraph> graph_;  // --cuda_graph on, where a step can be captured
  std::string graph_reason_;
  struct PendingLog {
    int64_t step, samples, bytes, collectives;
    int64_t intra_msgs, intra_bytes, inter_msgs, inter_bytes;
  };
  std::deque<PendingLog> pending_logs_;  // steps enqueued, times not yet read
  std::string exchange_reason_;
  // --exchange and --dedup node against the nodes and the cost model: sets the
  // communicator's exchange and the collection's node dedup (collective).
  void choose_exchange_across_nodes();
  // --exchange auto with both routes: the first training steps of the run
  // alternate flat and two-hop (one of each untimed, then kRouteTrialRounds of
  // each timed: the step timer's exchange phase), and the route with the
  // smaller total over the ranks is kept. The routes deliver the same bytes,
  // so the trial changes no number.
  struct RouteTrial {
    bool active = false;
    int issued = 0;                // trial steps issued so far
    std::map<int64_t, int> route;  // global step -> route (0 flat, 1 two-hop), timed ones
    double seconds[2] = {0, 0};    // exchange seconds of the timed steps, this rank
    ExchangeShape shape;
    LinkLevels links;
  } trial_;
  void route_trial_before_step(int64_t step);
  void route_trial_after_step(EpochResult* r);
  std::unique_ptr<EvalReader> eval_reader_;
  std::unique_ptr<EmbeddingCollection> tables_;
  std::unique_ptr<NeuMF> model_;

  TrainState state_;     // what train_step reads and writes
  StepControl control_;  // the requests riding in each step's allreduce
  const volatile int* stop_flag_ = nullptr;
  const class CheckpointLock* lock_ = nullptr;
  TensorBoardWriter* tb_ = nullptr;
  // The steps since the last training scalars; they may span epochs (not the
  // evaluations between them).
  struct TbWindow {
    int64_t begin = 0;  // index in the current epoch of its first step there
    int64_t steps = 0, samples = 0;
    double loss = 0;     // this rank's loss shares of its steps in earlier epochs
    double seconds = 0;  // its training time in earlier epochs
    double phase[kStepPhases] = {0, 0, 0, 0};     // this rank's step times (StepPhase)
    std::chrono::steady_clock::time_point since;  // start of its time in this epoch
  };
  TbWindow tb_window_;
  std::chrono::steady_clock::time_point last_checkpoint_;
  std::vector<double> resumed_loss_;  // loss shares of the resumed epoch's steps taken
  Position position_;                 // after the last step taken
  std::string resumed_from_;          // the checkpoint resume() loaded, if any
  // Sealed checkpoints resume() found damaged: retention leaves them uncounted.
  std::vector<DamagedCheckpoint> damaged_;
  nlohmann::json init_from_;  // --init_from: where the warm start began (manifests)
  int64_t saved_step_ = -1;   // optimizer step of the last checkpoint written
  Buffer<double> step_loss_;  // [steps of the epoch] this rank's loss shares
  // Eval buffers (n users, L = 1 + E list entries each): the batches' users [n],
  // candidates [n×L] and duplicate masks [n×L] in two staged slots; the pass's
  // hit and NDCG sums [2], on the device.
  std::unique_ptr<ArrayStager> eval_stager_;
  // The evaluation's lists kept on a GPU rank's device (eval_lists_cache()): each batch's
  // user count and its users, candidates and masks as the first evaluation staged them;
  // complete once a whole evaluation has filled it, after which evaluations read no list.
  struct EvalListsCache {
    bool complete = false;
    std::vector<int64_t> n;
    std::vector<Buffer<int32_t>> users, items;
    std::vector<Buffer<uint8_t>> mask;
  } eval_cache_;
  Buffer<double> eval_sums_;
  Buffer<float> scores_;                // [n×L]
  std::vector<uint8_t> eval_selected_;  // --eval_users: 1 for the users evaluated
  // Full ranking: every item's row, tiled for a group of users ([users × I × D]),
  // and their scores.
  Buffer<float> full_item_tile_, full_scores_;
  // eval_by_items(): the item table's GMF columns [I × mf] where it is gathered; scoring
  // reads eval_gmf_ (row stride eval_gmf_ld_): those, or one rank's own table in place.
  Buffer<float> eval_item_gmf_;
  const float* eval_gmf_ = nullptr;
  int64_t eval_gmf_ld_ = 0;
};

}  // namespace ncf
