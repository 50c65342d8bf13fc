// The dataset's id maps: see id_map.h.
#include "data/id_map.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"

namespace ncf {

namespace {

// The dense ids 0 .. n-1 by ascending original id (less(a, b) on dense ids),
// checked distinct: equal neighbours are the same id twice.
template <typename Less, typename Same, typename Name>
std::vector<int32_t> sorted_index(size_t n, const Less& less, const Same& same, const Name& name,
                                  const std::string& where) {
  std::vector<int32_t> order(n);
  for (size_t d = 0; d < n; ++d) order[d] = int32_t(d);
  std::sort(order.begin(), order.end(), less);
  for (size_t k = 1; k < n; ++k)
    if (same(order[k - 1], order[k]))
      NCF_FAIL(where, ": id ", name(order[k]), " appears twice (entries ",
               std::min(order[k - 1], order[k]), " and ", std::max(order[k - 1], order[k]), ")");
  return order;
}

}  // namespace

IdMap::IdMap(std::vector<int64_t> raw, bool ascending, const std::string& where)
    : size_(int64_t(raw.size())), raw_(std::move(raw)) {
  if (ascending) return;
  order_ = sorted_index(
      raw_.size(), [&](int32_t a, int32_t b) { return raw_[size_t(a)] < raw_[size_t(b)]; },
      [&](int32_t a, int32_t b) { return raw_[size_t(a)] == raw_[size_t(b)]; },
      [&](int32_t a) { return std::to_string(raw_[size_t(a)]); }, where);
}

IdMap::IdMap(StringList strings, bool ascending, const std::string& where)
    : size_(int64_t(strings.size())), strings_(true), string_ids_(std::move(strings)) {
  if (ascending) return;
  const StringList& s = string_ids_;
  order_ = sorted_index(
      s.size(), [&](int32_t a, int32_t b) { return s[size_t(a)] < s[size_t(b)]; },
      [&](int32_t a, int32_t b) { return s[size_t(a)] == s[size_t(b)]; },
      [&](int32_t a) { return "\"" + std::string(s[size_t(a)]) + "\""; }, where);
}

int64_t IdMap::raw(int64_t dense) const {
  NCF_CHECK(!strings_, "IdMap::raw: the map holds string ids");
  return identity() ? dense : raw_[size_t(dense)];
}

std::string IdMap::text(int64_t dense) const {
  if (strings_) return std::string(string(dense));
  return std::to_string(raw(dense));
}

std::string_view IdMap::string(int64_t dense) const {
  NCF_CHECK(strings_, "IdMap::string: the map holds integer ids");
  return string_ids_[size_t(dense)];
}

std::optional<int64_t> IdMap::find(std::string_view id) const {
  if (!strings_) return std::nullopt;
  if (!order_.empty()) {
    const auto it = std::lower_bound(order_.begin(), order_.end(), id,
                                     [&](int32_t d, auto v) { return string_ids_[size_t(d)] < v; });
    if (it == order_.end() || string_ids_[size_t(*it)] != id) return std::nullopt;
    return int64_t(*it);
  }
  const std::optional<size_t> d = string_ids_.find_sorted(id);
  if (!d) return std::nullopt;
  return int64_t(*d);
}

std::optional<int64_t> IdMap::dense(int64_t raw) const {
  if (strings_) return std::nullopt;
  if (identity()) {
    if (raw < 0 || raw >= size_) return std::nullopt;
    return raw;
  }
  if (!order_.empty()) {
    const auto it = std::lower_bound(order_.begin(), order_.end(), raw,
                                     [&](int32_t d, int64_t v) { return raw_[size_t(d)] < v; });
    if (it == order_.end() || raw_[size_t(*it)] != raw) return std::nullopt;
    return int64_t(*it);
  }
  const auto it = std::lower_bound(raw_.begin(), raw_.end(), raw);
  if (it == raw_.end() || *it != raw) return std::nullopt;
  return int64_t(it - raw_.begin());
}

int64_t IdMap::find_same(const IdMap& other, int64_t d) const {
  if (strings_ != other.strings_)
    NCF_FAIL("the id maps are of different kinds (", strings_ ? "string" : "integer", " ids and ",
             other.strings_ ? "string" : "integer", " ids)");
  const std::optional<int64_t> r = strings_ ? find(other.string(d)) : dense(other.raw(d));
  return r ? *r : -1;
}

namespace {

// user_ids.str / item_ids.str (dataset.h: IdMapInfo): offsets, then bytes.
template <typename ReadAt, typename CheckCrc>
StringList load_string_ids(const ReadAt& read_at, const std::string& path, const IdMapInfo& info,
                           const CheckCrc& check_crc) {
  StringList s;
  s.offsets.resize(size_t(info.count) + 1);
  const size_t head = s.offsets.size() * 8;
  read_at(0, s.offsets.data(), head);
  s.bytes.resize(size_t(info.bytes - head));
  read_at(int64_t(head), s.bytes.data(), s.bytes.size());
  check_crc(crc32c_extend(crc32c(s.offsets.data(), head), s.bytes.data(), s.bytes.size()));
  if (s.offsets.front() != 0 || s.offsets.back() != s.bytes.size())
    NCF_FAIL(path, ": offsets run from ", s.offsets.front(), " to ", s.offsets.back(), " over ",
             s.bytes.size(), " bytes of ids");
  for (size_t d = 0; d < s.size(); ++d)
    if (s.offsets[d + 1] <= s.offsets[d])
      NCF_FAIL(path, ": id ", d, " is empty or its offsets go backwards (", s.offsets[d], ", ",
               s.offsets[d + 1], ")");
  if (info.ascending)
    for (size_t d = 1; d < s.size(); ++d)
      if (!(s[d - 1] < s[d])) NCF_FAIL(path, ": ids are not ascending at entry ", d);
  return s;
}

}  // namespace

IdMaps load_id_maps(const std::string& dir, const DatasetMeta& meta) {
  return load_id_maps(
      meta.id_maps, meta.num_users, meta.num_items,
      [&](const std::string& name, int64_t off, void* data, size_t n) {
        FileHandle(dir + "/" + name, O_RDONLY).read_at(off, data, n);
      },
      [&](const std::string& name) { return FileHandle(dir + "/" + name, O_RDONLY).size(); }, dir);
}

IdMaps load_id_maps(const std::vector<IdMapInfo>& id_maps, uint64_t users, uint64_t items,
                    const std::function<void(const std::string&, int64_t, void*, size_t)>& read,
                    const std::function<int64_t(const std::string&)>& size_of,
                    const std::string& where) {
  if (id_maps.empty()) return {IdMap(int64_t(users)), IdMap(int64_t(items))};
  NCF_CHECK(id_maps.size() == 2, where, ": ", id_maps.size(), " id maps, expected 2");
  IdMap maps[2];
  for (int k = 0; k < 2; ++k) {
    const IdMapInfo& info = id_maps[size_t(k)];
    const std::string path = where + "/" + info.name;
    if (info.count != (k == 0 ? users : items))
      NCF_FAIL(path, ": ", info.count, " ids for ", k == 0 ? users : items,
               k == 0 ? " users" : " items");
    const int64_t size = size_of(info.name);
    if (uint64_t(size) != info.bytes)
      NCF_FAIL(path, ": file has ", size, " bytes but the metadata says ", info.bytes,
               "; re-run ncf_prep");
    auto check_crc = [&](uint32_t crc) {
      if (crc == info.crc32c) return;
      char msg[80];
      std::snprintf(msg, sizeof msg, "file CRC-32C 0x%08x does not match the metadata's 0x%08x",
                    crc, info.crc32c);
      NCF_FAIL(path, ": ", msg, "; re-run ncf_prep");
    };
    auto read_at = [&](int64_t off, void* data, size_t n) { read(info.name, off, data, n); };
    if (info.strings) {
      maps[k] = IdMap(load_string_ids(read_at, path, info, check_crc), info.ascending, path);
      continue;
    }
    std::vector<int64_t> raw(size_t(info.count));
    read_at(0, raw.data(), raw.size() * 8);
    check_crc(crc32c(raw.data(), raw.size() * 8));
    if (info.ascending)
      for (size_t d = 1; d < raw.size(); ++d)
        if (raw[d] <= raw[d - 1])
          NCF_FAIL(path, ": ids are not ascending at entry ", d, " (", raw[d - 1], ", ", raw[d],
                   ")");
    maps[k] = IdMap(std::move(raw), info.ascending, path);
  }
  return {std::move(maps[0]), std::move(maps[1])};
}

}  // namespace ncf
