// Trainer::score_pairs and Trainer::recommend: the loaded tables and tower
// scoring given pairs, or every item for a group of users followed by the
// top-K selection (model/topk.h), in rounds every rank takes part in.
#include <algorithm>
#include <memory>

#include "common/check.h"
#include "model/topk.h"
#include "train/trainer.h"

namespace ncf {

namespace {

// Rounds of `per_round` items that cover the largest share of any rank.
int64_t lockstep_rounds(Communicator& comm, int64_t n, int64_t per_round) {
  const std::vector<int64_t> all = gather_all<int64_t>(comm, {n});
  const int64_t most = *std::max_element(all.begin(), all.end());
  return (most + per_round - 1) / per_round;
}

}  // namespace

std::vector<float> Trainer::score_pairs(const std::vector<int32_t>& users,
                                        const std::vector<int32_t>& items) {
  NCF_CHECK(users.size() == items.size(), "score_pairs: ", users.size(), " users but ",
            items.size(), " items");
  const Device dev = ctx_.device;
  const int64_t n = int64_t(users.size());
  const int64_t per_round = std::max<int64_t>(1, cfg_.eval_batch_size);
  const int64_t rounds = lockstep_rounds(comm_, n, per_round);
  std::vector<float> logits(users.size());
  Buffer<int32_t> u(dev, 0), i(dev, 0);
  Buffer<float> s(dev, 0);
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t a = std::min(n, k * per_round), m = std::min(per_round, n - a);
    u.reserve(size_t(m));
    i.reserve(size_t(m));
    device_copy(dev, u.data(), Device::kCpu, users.data() + a, size_t(m) * 4);
    device_copy(dev, i.data(), Device::kCpu, items.data() + a, size_t(m) * 4);
    tables_->lookup({{u.data(), m}, {i.data(), m}});
    if (m == 0) continue;
    s.reserve(size_t(m));
    model_->score(ctx_, tables_->rows(0), tables_->rows(1), m, 1, s.data());
    device_copy(Device::kCpu, logits.data() + a, dev, s.data(), size_t(m) * 4);
  }
  return logits;
}

void Trainer::recommend(const std::vector<int32_t>& users, int K, bool include_seen,
                        std::vector<int32_t>* items, std::vector<float>* logits) {
  NCF_CHECK(K >= 1, "recommend: K=", K, " must be >= 1");
  const Device dev = ctx_.device;
  const int64_t n = int64_t(users.size()), I = int64_t(meta_.num_items);
  // Users scored at once: group × I scores per round.
  const int64_t group = std::max<int64_t>(1, cfg_.eval_batch_size / I);
  // Every item's row, tiled for a group: user x of the group meets every item.
  const int64_t tiles = std::min(group, std::max<int64_t>(n, 1));
  Buffer<float> tile(dev, 0);
  tile_item_table(tiles, &tile);
  Buffer<float> scores(dev, size_t(tiles * I));
  Buffer<int32_t> ids(dev, 0), top_items(dev, 0), excluded_dev(dev, 0);
  Buffer<float> top_scores(dev, 0);
  Buffer<int64_t> offsets_dev(dev, 0);
  std::vector<int64_t> offsets;
  std::vector<int32_t> excluded;

  items->assign(size_t(n * K), -1);
  logits->assign(size_t(n * K), 0.0f);
  const int64_t rounds = lockstep_rounds(comm_, n, group);
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t a = std::min(n, k * group), m = std::min(group, n - a);
    ids.reserve(size_t(m));
    device_copy(dev, ids.data(), Device::kCpu, users.data() + a, size_t(m) * 4);
    tables_->lookup({{ids.data(), m}, {ids.data(), 0}});
    if (m == 0) continue;
    model_->score(ctx_, tables_->rows(0), tile.data(), m, int(I), scores.data());
    const int64_t* off = nullptr;
    const int32_t* ex = nullptr;
    if (!include_seen) {
      seen_items(users.data() + a, m, &offsets, &excluded);
      offsets_dev.reserve(offsets.size());
      excluded_dev.reserve(std::max<size_t>(excluded.size(), 1));
      device_copy(dev, offsets_dev.data(), Device::kCpu, offsets.data(), offsets.size() * 8);
      device_copy(dev, excluded_dev.data(), Device::kCpu, excluded.data(), excluded.size() * 4);
      off = offsets_dev.data();
      ex = excluded_dev.data();
    }
    top_items.reserve(size_t(m * K));
    top_scores.reserve(size_t(m * K));
    top_k(ctx_, scores.data(), m, I, off, ex, K, top_items.data(), top_scores.data());
    device_copy(Device::kCpu, items->data() + a * K, dev, top_items.data(), size_t(m * K) * 4);
    device_copy(Device::kCpu, logits->data() + a * K, dev, top_scores.data(), size_t(m * K) * 4);
  }
}

std::unique_ptr<ScoringModel> load_scoring_model(TrainConfig cfg, Communicator& comm,
                                                 const ExecContext& ctx,
                                                 const CheckpointReader& ck) {
  cfg.eval_only = true;
  auto trainer = std::make_unique<Trainer>(cfg, comm, ctx);
  trainer->load_checkpoint(ck);
  return trainer;
}

}  // namespace ncf
