// The dataset's id maps: see id_map.h.
#include "data/id_map.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"

namespace ncf {

IdMap::IdMap(std::vector<int64_t> raw) : size_(int64_t(raw.size())), raw_(std::move(raw)) {}

IdMap::IdMap(StringList strings)
    : size_(int64_t(strings.size())), strings_(true), string_ids_(std::move(strings)) {}

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
  const auto it = std::lower_bound(raw_.begin(), raw_.end(), raw);
  if (it == raw_.end() || *it != raw) return std::nullopt;
  return int64_t(it - raw_.begin());
}

namespace {

// user_ids.str / item_ids.str (dataset.h: IdMapInfo): offsets, then bytes.
template <typename CheckCrc>
StringList load_string_ids(const FileHandle& f, const IdMapInfo& info, const CheckCrc& check_crc) {
  const std::string& path = f.path();
  StringList s;
  s.offsets.resize(size_t(info.count) + 1);
  const size_t head = s.offsets.size() * 8;
  f.read_at(0, s.offsets.data(), head);
  s.bytes.resize(size_t(info.bytes - head));
  f.read_at(int64_t(head), s.bytes.data(), s.bytes.size());
  check_crc(crc32c_extend(crc32c(s.offsets.data(), head), s.bytes.data(), s.bytes.size()));
  if (s.offsets.front() != 0 || s.offsets.back() != s.bytes.size())
    NCF_FAIL(path, ": offsets run from ", s.offsets.front(), " to ", s.offsets.back(), " over ",
             s.bytes.size(), " bytes of ids");
  for (size_t d = 0; d < s.size(); ++d)
    if (s.offsets[d + 1] <= s.offsets[d])
      NCF_FAIL(path, ": id ", d, " is empty or its offsets go backwards (", s.offsets[d], ", ",
               s.offsets[d + 1], ")");
  for (size_t d = 1; d < s.size(); ++d)
    if (!(s[d - 1] < s[d])) NCF_FAIL(path, ": ids are not ascending at entry ", d);
  return s;
}

}  // namespace

IdMaps load_id_maps(const std::string& dir, const DatasetMeta& meta) {
  if (meta.id_maps.empty()) return {IdMap(int64_t(meta.num_users)), IdMap(int64_t(meta.num_items))};
  NCF_CHECK(meta.id_maps.size() == 2, dir, ": ", meta.id_maps.size(), " id maps, expected 2");
  IdMap maps[2];
  for (int k = 0; k < 2; ++k) {
    const IdMapInfo& info = meta.id_maps[size_t(k)];
    const std::string path = dir + "/" + info.name;
    FileHandle f(path, O_RDONLY);
    const int64_t size = f.size();
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
    if (info.strings) {
      maps[k] = IdMap(load_string_ids(f, info, check_crc));
      continue;
    }
    std::vector<int64_t> raw(size_t(info.count));
    f.read_at(0, raw.data(), raw.size() * 8);
    check_crc(crc32c(raw.data(), raw.size() * 8));
    for (size_t d = 1; d < raw.size(); ++d)
      if (raw[d] <= raw[d - 1])
        NCF_FAIL(path, ": ids are not ascending at entry ", d, " (", raw[d - 1], ", ", raw[d], ")");
    maps[k] = IdMap(std::move(raw));
  }
  return {std::move(maps[0]), std::move(maps[1])};
}

}  // namespace ncf
