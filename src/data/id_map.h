// The dataset's original ids: dense id ↔ the id in the source files. ncf_prep
// keeps them as user_ids.i64 / item_ids.i64 (MovieLens: integer ids) or
// user_ids.str / item_ids.str (CSV interaction logs: string ids), see dataset.h:
// IdMapInfo; datasets without them (synthetic, NCF-paper files) have dense ids
// that are the original ones. Every program that takes or prints an id goes
// through an IdMap, so it speaks the ids of the files whatever their kind.
#pragma once

#include <cstdint>
#include <functional>
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
  // raw[d] = the original id of dense id d, strictly ascending; or, with
  // ascending false (a dataset extended by ncf_prep --extend: the parent's ids
  // first, then the new ones), distinct in any order, looked up through a
  // sorted index. Throws naming `where` on a repeated id.
  explicit IdMap(std::vector<int64_t> raw, bool ascending = true, const std::string& where = "");
  // strings[d] = the original id of dense id d, strictly ascending bytewise
  // (or distinct in any order, as above).
  explicit IdMap(StringList strings, bool ascending = true, const std::string& where = "");

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
  // Integer maps: the whole list (empty for the identity).
  const std::vector<int64_t>& raw_list() const { return raw_; }
  // Whether the original ids ascend with the dense ids (always for the identity).
  bool ascending() const { return order_.empty(); }
  // The dense id of dense id `d` of `other` (the same original id), or -1 when
  // this map lacks it. The maps must be of the same kind (integer or
  // identity, or string); throws otherwise, naming both.
  int64_t find_same(const IdMap& other, int64_t d) const;

 private:
  int64_t size_ = 0;
  std::vector<int64_t> raw_;
  bool strings_ = false;
  StringList string_ids_;
  std::vector<int32_t> order_;  // non-ascending maps: the dense ids by ascending original id
};

struct IdMaps {
  IdMap user, item;
};

// The dataset's maps, each file checked against metadata.json (size, CRC-32C)
// and for ascending ids (non-empty strings, well-formed offsets); errors name
// the file. Identity maps of num_users and num_items when the dataset has none.
IdMaps load_id_maps(const std::string& dir, const DatasetMeta& meta);

// The same from any store of the map files (a checkpoint keeps a copy of its
// dataset's): read(name, offset, data, bytes) and size(name); errors name
// `where` and the file. `maps` empty: identity maps of users and items.
IdMaps load_id_maps(const std::vector<IdMapInfo>& maps, uint64_t users, uint64_t items,
                    const std::function<void(const std::string&, int64_t, void*, size_t)>& read,
                    const std::function<int64_t(const std::string&)>& size,
                    const std::string& where);

}  // namespace ncf
