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

std::optional<int64_t> IdMap::dense(int64_t raw) const {
  if (identity()) {
    if (raw < 0 || raw >= size_) return std::nullopt;
    return raw;
  }
  const auto it = std::lower_bound(raw_.begin(), raw_.end(), raw);
  if (it == raw_.end() || *it != raw) return std::nullopt;
  return int64_t(it - raw_.begin());
}

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
    std::vector<int64_t> raw(size_t(info.count));
    f.read_at(0, raw.data(), raw.size() * 8);
    const uint32_t crc = crc32c(raw.data(), raw.size() * 8);
    if (crc != info.crc32c) {
      char msg[80];
      std::snprintf(msg, sizeof msg, "file CRC-32C 0x%08x does not match the metadata's 0x%08x",
                    crc, info.crc32c);
      NCF_FAIL(path, ": ", msg, "; re-run ncf_prep");
    }
    for (size_t d = 1; d < raw.size(); ++d)
      if (raw[d] <= raw[d - 1])
        NCF_FAIL(path, ": ids are not ascending at entry ", d, " (", raw[d - 1], ", ", raw[d], ")");
    maps[k] = IdMap(std::move(raw));
  }
  return {std::move(maps[0]), std::move(maps[1])};
}

}  // namespace ncf
