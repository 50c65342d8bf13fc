// Synthetic implicit-feedback generator with planted low-rank preferences.
// Deterministic by seed; memory grows with users and items, not interactions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sources.h"

namespace ncf {

struct SyntheticShape {
  std::string name;            // "ml-1m", "ml-20m", "small", or "custom"
  uint64_t num_users = 0;
  uint64_t num_items = 0;
  uint64_t num_interactions = 0;  // total, train + test
};

// Named shapes: "ml-1m" (6,040 / 3,706 / 1,000,209), "ml-20m" (138,493 / 26,744 /
// 20,000,263), "small" (the embedded default). Throws on an unknown name.
SyntheticShape synthetic_shape(const std::string& name);

struct SyntheticParams {
  SyntheticShape shape;
  uint32_t min_per_user = 20;   // every user has at least this many interactions
  double activity_alpha = 1.8;  // Pareto tail exponent of user activity
  double zipf_s = 1.0;          // item popularity ~ 1 / rank^s
  uint32_t rank = 16;           // latent dimension of the planted preferences
  double preference = 0.8;      // share of a user's interactions drawn from the planted taste
};

DatasetMeta generate_synthetic(const SyntheticParams& params, const std::string& out_dir,
                               const PrepOptions& opt);

// The planted preferences, rebuilt from (params, seed) without the data: scores
// an item for a user the way the generator draws it. Tests use it as the oracle.
class PlantedModel {
 public:
  PlantedModel(const SyntheticParams& params, uint64_t seed);
  double score(uint64_t user, uint64_t item) const;
  double popularity(uint64_t item) const;

 private:
  SyntheticParams params_;
  uint64_t seed_;
  std::vector<float> item_factors_;  // I x rank
  std::vector<double> item_pop_;     // I
};

}  // namespace ncf
