// Ranking interned ids: see csv_intern.h.
#include "data/csv_intern.h"

#include "common/parallel.h"

namespace ncf {
namespace csv {

RankedIds rank_ids(const InternTable& t, int threads) {
  struct Entry {
    uint64_t prefix;  // the first 8 bytes, big-endian, zero-padded
    uint32_t key;
  };
  std::vector<Entry> e;
  e.reserve(t.size());
  uint64_t widest = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    const StringList& l = t.shards[s].strings;
    widest = std::max<uint64_t>(widest, l.size());
    for (size_t k = 0; k < l.size(); ++k) {
      const std::string_view v = l[k];
      uint64_t p = 0;
      for (size_t b = 0; b < 8; ++b)
        p = (p << 8) | (b < v.size() ? static_cast<unsigned char>(v[b]) : 0u);
      e.push_back({p, static_cast<uint32_t>((k << kShardBits) | s)});
    }
  }
  auto less = [&t](const Entry& a, const Entry& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    return t.string_of(a.key) < t.string_of(b.key);
  };
  // Sorted in `parts` pieces on the pool, then merged.
  const int parts = std::max(1, std::min<int>(threads, static_cast<int>(e.size() / 65536) + 1));
  std::vector<size_t> cut(static_cast<size_t>(parts) + 1);
  for (int p = 0; p <= parts; ++p) cut[size_t(p)] = e.size() * size_t(p) / size_t(parts);
  parallel_for(parts, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      std::sort(e.begin() + ptrdiff_t(cut[size_t(p)]), e.begin() + ptrdiff_t(cut[size_t(p) + 1]),
                less);
  });
  for (int p = 1; p < parts; ++p)
    std::inplace_merge(e.begin(), e.begin() + ptrdiff_t(cut[size_t(p)]),
                       e.begin() + ptrdiff_t(cut[size_t(p) + 1]), less);
  RankedIds r;
  r.order.resize(e.size());
  r.rank_of.assign(size_t(widest) << kShardBits, 0);
  for (size_t k = 0; k < e.size(); ++k) {
    r.order[k] = e[k].key;
    r.rank_of[e[k].key] = static_cast<uint32_t>(k);
  }
  return r;
}

}  // namespace csv
}  // namespace ncf
