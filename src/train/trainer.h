// The step and eval loops. One Trainer per rank: it owns the readers, the two
// sharded tables (user, item), the replicated NeuMF tower and its optimizer
// state. A global step (shared/DESIGN.md): read this rank's slice of positives
// → sample negatives → look up user and item rows (all-to-all) → tower forward
// and backward → one allreduce of the flat dense gradient → identical Adam step
// on every rank → embedding gradients back to their owners, which update.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/device.h"
#include "common/step_timer.h"
#include "data/dataset.h"
#include "data/negatives.h"
#include "data/reader.h"
#include "embedding/embedding.h"
#include "model/neumf.h"
#include "model/optim.h"
#include "train/config.h"
#include "train/input_stager.h"

namespace ncf {

struct EpochResult {
  int64_t epoch = 0;
  int64_t steps = 0;
  int64_t samples = 0;          // global training samples this epoch
  double loss = 0;              // mean BCE over the epoch's samples
  double train_seconds = 0;
  // This rank's step time by phase (common/step_timer.h): host clocks on CPU
  // ranks, CUDA events on the compute stream on GPU ranks.
  double exchange_seconds = 0;  // embedding lookups and gradient exchanges, owners' update
  double allreduce_seconds = 0; // dense-gradient allreduce (the wait for it on GPU ranks)
  double compute_seconds = 0;   // negatives, tower, dense Adam
  int64_t bytes_sent = 0;       // payload bytes this rank sent to other ranks
};

struct EvalResult {
  double hr = 0, ndcg = 0;
  int64_t users = 0;
  double seconds = 0;
};

// Placement of each table, decided by the planner or forced by --shard_plan.
struct ShardPlan {
  TableSpec user, item;
  std::string reason;
};

ShardPlan plan_shards(const TrainConfig& cfg, const DatasetMeta& meta, int W,
                      EmbeddingOptimizer opt);

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, Communicator& comm, const ExecContext& ctx);
  ~Trainer();

  EpochResult train_epoch(int64_t epoch);
  EvalResult evaluate();
  const DatasetMeta& meta() const { return meta_; }
  const ShardPlan& plan() const { return plan_; }
  int64_t positives_per_step() const { return P_; }
  // Dense parameters, then the full user and item tables (collective).
  std::vector<float> gather_parameters();
  int64_t memory_estimate_bytes() const { return memory_bytes_; }

 private:
  // One global step on the batch acquired from stager_; its loss share goes to
  // step_loss_[index] on the device (read back once per epoch).
  void step(const TrainBatch& batch, int64_t index, EpochResult* r);
  // Adds the phase times of the steps the timer has finished to *r (and prints
  // their --step_log lines); wait_all at the end of an epoch.
  void account_step_times(bool wait_all, EpochResult* r);

  TrainConfig cfg_;
  Communicator& comm_;
  ExecContext ctx_;
  DatasetMeta meta_;
  ShardPlan plan_;
  int64_t P_ = 0;       // positives per global step
  int64_t t_ = 0;       // optimizer steps taken
  int64_t memory_bytes_ = 0;
  std::unique_ptr<PositiveLists> positives_;
  std::unique_ptr<DevicePositiveLists> device_positives_;  // GPU ranks: the CSR on the device
  std::unique_ptr<TrainReader> train_reader_;
  std::unique_ptr<InputStager> stager_;
  std::unique_ptr<StepTimer> timer_;
  struct PendingLog {
    int64_t step, samples, bytes;
  };
  std::deque<PendingLog> pending_logs_;  // steps enqueued, times not yet read
  std::unique_ptr<EvalReader> eval_reader_;
  std::unique_ptr<ShardedEmbedding> user_, item_;
  std::unique_ptr<NeuMF> model_;
  Buffer<float> adam_m_, adam_v_;
  AdamHyper dense_hyper_;

  // Step buffers on the context's device (n positives, B = n · (1 + num_neg)
  // samples, D table width).
  Buffer<int32_t> pos_users_, pos_items_;     // [n]
  Buffer<int32_t> s_users_, s_items_;         // [B]
  Buffer<float> labels_, logits_, dlogits_;   // [B]
  Buffer<float> urows_, irows_, durows_, dirows_;  // [B×D]
  Buffer<double> step_loss_;                  // [steps of the epoch] this rank's loss shares
  // Eval buffers (n users, L = 1 + E list entries each).
  Buffer<int32_t> eval_users_, eval_items_;   // [n], [n×L]
  Buffer<uint8_t> eval_mask_;                 // [n×L]
  Buffer<int64_t> eval_expand_;               // [n×L] user row of each entry
  Buffer<float> eval_user_rows_, eval_rows_, scores_;  // [n×D], [n×L×D], [n×L]
};

}  // namespace ncf
