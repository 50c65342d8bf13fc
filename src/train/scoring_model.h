// What a program serving a trained model needs from it (ncf_recommend): a checkpoint's
// model, held sharded over the job's ranks as training holds it, that scores pairs and
// ranks items. Trainer implements it; a serving program includes this header only, and
// sees nothing of training, evaluation or checkpoint writing.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "common/device.h"
#include "data/dataset.h"
#include "train/config.h"

namespace ncf {

class CheckpointReader;

class ScoringModel {
 public:
  virtual ~ScoringModel() = default;
  virtual const DatasetMeta& meta() const = 0;
  // Both are collective: every rank passes its own share (of any size, 0 included) and
  // the ranks run the same number of rounds of at most --eval_batch_size scores.
  // The logits of pairs (users[k], items[k]) of dense ids.
  virtual std::vector<float> score_pairs(const std::vector<int32_t>& users,
                                         const std::vector<int32_t>& items) = 0;
  // For each user, its K best items by logit and those logits ([n×K], in model/topk.h's
  // order: ties by item id; item -1 past the items left). Unless include_seen, the user's
  // interactions in positives.bin (training items and the held-out test item) are left
  // out. Scored against the whole item table, a group of users at a time, through the
  // training tower; selected on the ranks' device.
  virtual void recommend(const std::vector<int32_t>& users, int K, bool include_seen,
                         std::vector<int32_t>* items, std::vector<float>* logits) = 0;
};

// The model of checkpoint `ck` on cfg.data_dir's dataset, cfg holding the checkpoint's
// trajectory flags (apply_trajectory_flags) and this job's device, ranks and batch:
// the tables' rows only, without optimizer state (cfg.eval_only is set here). Collective;
// refuses a checkpoint of another dataset or shape naming it.
std::unique_ptr<ScoringModel> load_scoring_model(TrainConfig cfg, Communicator& comm,
                                                 const ExecContext& ctx,
                                                 const CheckpointReader& ck);

}  // namespace ncf
