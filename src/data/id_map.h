// The dataset's original ids: dense id ↔ the id in the source files. ncf_prep
// keeps them as user_ids.i64 / item_ids.i64 (MovieLens: integer ids) or
// user_ids.str / item_ids.str (CSV interaction logs: string ids), see dataset.h:
// IdMapInfo; datasets without them (synthetic, NCF-paper files) have dense ids
// that are the original ones. Every program that takes or prints an id goes
// through an IdMap, so it speaks the ids of the files whatever their kind.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"
#include "data/string_list.h"

namespace ncf {

class IdMap {
 public:
  // The identity on [0, size).
  explicit IdMap(int64_t size = 0) : size_(size) {}
  // raw[d] = the original id of dense id d, strictly ascending.
  explicit IdMap(std::vector<int64_t> raw);
  // strings[d] = the original id of dense id d, strictly ascending bytewise.
  explicit IdMap(StringList strings);

  int64_t size() const { return size_; }
  bool identity() const { return raw_.empty() && !strings_; }
  bool strings() const { return strings_; }
  // The original integer id of dense id d (0 <= d < size()); integer maps only.
  int64_t raw(int64_t dense) const;
  // The dense id of an original integer id; nullopt when the dataset has no
  // such id (and always for a string map).
  std::optional<int64_t> dense(int64_t raw) const;
  // The original id of dense id d as text: the decimal integer, or the string.
  std::string text(int64_t dense) const;
  // The original string id of dense id d; string maps only.
  std::string_view string(int64_t dense) const;
  // The dense id of an original string id; nullopt when absent (and always
  // for an integer map).
  std::optional<int64_t> find(std::string_view id) const;
  // String maps: the whole list (the layout of user_ids.str).
  const StringList& string_list() const { return string_ids_; }

 private:
  int64_t size_ = 0;
  std::vector<int64_t> raw_;
  bool strings_ = false;
  StringList string_ids_;
};

struct IdMaps {
  IdMap user, item;
};

// The dataset's maps, each file checked against metadata.json (size, CRC-32C)
// and for ascending ids (non-empty strings, well-formed offsets); errors name
// the file. Identity maps of num_users and num_items when the dataset has none.
IdMaps load_id_maps(const std::string& dir, const DatasetMeta& meta);

}  // namespace ncf
