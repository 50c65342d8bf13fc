// The dataset's original ids: dense id ↔ the id in the source files
// (MovieLens user and movie ids). ncf_prep keeps them as user_ids.i64 and
// item_ids.i64 (dataset.h: IdMapInfo); datasets without them (synthetic,
// NCF-paper files) have dense ids that are the original ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace ncf {

class IdMap {
 public:
  // The identity on [0, size).
  explicit IdMap(int64_t size = 0) : size_(size) {}
  // raw[d] = the original id of dense id d, strictly ascending.
  explicit IdMap(std::vector<int64_t> raw);

  int64_t size() const { return size_; }
  bool identity() const { return raw_.empty(); }
  // The original id of dense id d (0 <= d < size()).
  int64_t raw(int64_t dense) const { return identity() ? dense : raw_[size_t(dense)]; }
  // The dense id of an original id; nullopt when the dataset has no such id.
  std::optional<int64_t> dense(int64_t raw) const;

 private:
  int64_t size_ = 0;
  std::vector<int64_t> raw_;
};

struct IdMaps {
  IdMap user, item;
};

// The dataset's maps, each file checked against metadata.json (size, CRC-32C)
// and for ascending ids; errors name the file. Identity maps of num_users and
// num_items when the dataset has none.
IdMaps load_id_maps(const std::string& dir, const DatasetMeta& meta);

}  // namespace ncf
