// Synthetic implicit-feedback generator with planted low-rank preferences.
// Deterministic by seed; memory grows with users and items, not interactions.
//
// The model (U users, I items, params.rank topics):
//  - item popularity: a seeded permutation of the items gets weights 1 / rank^s;
//  - item factors: each item belongs to a primary topic (share a in [0.5, 1)) and a
//    secondary topic (share 1 - a), so its factor vector has at most two nonzeros;
//  - user taste: 1 to 3 topics with random weights;
//  - a user's items are successive draws without repeats from
//      p_u(i) = (1 - rho) pop(i) / sum(pop) + rho sum_t taste_u(t) v_i(t) pop(i) / Z_t
//    (Z_t the topic's mass); draw order is timestamp order, the last is held out;
//  - user activity: min_per_user + floor(lambda w_u), w_u Pareto(alpha) - 1, capped,
//    lambda solved so that the counts sum exactly to num_interactions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/sources.h"

namespace ncf {

struct SyntheticShape {
  std::string name;  // "ml-1m", "ml-20m", "small", or "custom"
  uint64_t num_users = 0;
  uint64_t num_items = 0;
  uint64_t num_interactions = 0;  // total, train + test
};

// Named shapes: "ml-1m" (6,040 / 3,706 / 1,000,209), "ml-20m" (138,493 / 26,744 /
// 20,000,263), "small" (the embedded default: 2,000 / 1,000 / 100,000; it needs
// eval_negatives <= 500). Throws on an unknown name.
SyntheticShape synthetic_shape(const std::string& name);

struct SyntheticParams {
  SyntheticShape shape;
  uint32_t min_per_user = 20;   // every user has at least this many interactions
  double activity_alpha = 1.8;  // Pareto tail exponent of user activity
  double zipf_s = 1.0;          // item popularity ~ 1 / rank^s
  uint32_t rank = 16;           // latent dimension (topics) of the planted preferences
  double preference = 0.8;      // share of draws from the planted taste, in [0, 1)
};

DatasetMeta generate_synthetic(const SyntheticParams& params, const std::string& out_dir,
                               const PrepOptions& opt);

// Most interactions one user may get: num_items / 2, lowered to num_items - E so
// E distinct eval negatives always remain (generate_synthetic passes E = 0 when
// they are drawn with replacement). Throws (naming the numbers) when that is
// below min_per_user.
uint32_t synthetic_max_per_user(const SyntheticParams& params, uint32_t eval_negatives);

// The per-user interaction counts generate_synthetic uses (U entries summing to
// num_interactions), without generating items. Throws when num_interactions is
// outside [min_per_user * U, max_per_user * U]. threads = 0: hardware concurrency.
std::vector<uint32_t> synthetic_user_counts(const SyntheticParams& params, uint32_t eval_negatives,
                                            uint64_t seed, int threads = 0);

// The planted preferences, rebuilt from (params, seed) without the data: scores
// an item for a user the way the generator draws it. Tests use it as the oracle.
class PlantedModel {
 public:
  PlantedModel(const SyntheticParams& params, uint64_t seed);
  ~PlantedModel();
  PlantedModel(PlantedModel&&) noexcept;
  PlantedModel& operator=(PlantedModel&&) noexcept;

  // log p_u(item): the probability that one draw of the generator for `user`
  // (before excluding repeats) picks `item`.
  double score(uint64_t user, uint64_t item) const;
  // Popularity weight 1 / rank^s of the item (the largest is 1).
  double popularity(uint64_t item) const;
  // The item's factor on topic t (of params.rank): two nonzeros summing to 1.
  double item_factor(uint64_t item, uint32_t t) const;
  // The user's taste weight on topic t (sums to 1 over t).
  double user_taste(uint64_t user, uint32_t t) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ncf
