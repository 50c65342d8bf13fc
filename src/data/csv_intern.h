// The distinct id strings of a CSV log (source_csv.h): interned into 64
// hash shards (each owned by one thread while interning), then ranked by
// their bytes, the order dense ids follow.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "data/string_list.h"

namespace ncf {
namespace csv {

// A 64-bit hash of an id's bytes: its top 6 bits pick the intern shard, its
// low 32 bits the slot.
inline uint64_t hash_id(const char* p, size_t n) {
  constexpr uint64_t kA = 0x9E3779B97F4A7C15ull, kB = 0xD6E8FEB86659FD93ull;
  uint64_t h = (uint64_t(n) + 1) * kB;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h ^= w * kA;
    h = ((h << 27) | (h >> 37)) * kB;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h ^= w * kA;
    h = ((h << 27) | (h >> 37)) * kB;
  }
  h ^= h >> 31;
  h *= kA;
  h ^= h >> 29;
  return h;
}

constexpr int kShardBits = 6;
constexpr uint32_t kShards = 1u << kShardBits;
// An intern key is (shard-local index << kShardBits) | shard.
constexpr uint64_t kMaxPerShard = uint64_t(1) << (32 - kShardBits);

// One shard of distinct id strings: an open-addressing table of (low 32 bits
// of the hash, local index + 1), the strings in arrival order.
struct InternShard {
  std::vector<uint64_t> slots;
  StringList strings;

  uint32_t intern(std::string_view s, uint64_t h) {
    if ((strings.size() + 1) * 2 > slots.size()) grow();
    const uint32_t tag = static_cast<uint32_t>(h);
    const size_t mask = slots.size() - 1;
    for (size_t i = tag & mask;; i = (i + 1) & mask) {
      const uint64_t e = slots[i];
      if (e == 0) {
        const size_t id = strings.size();
        strings.push_back(s);
        slots[i] = (uint64_t(tag) << 32) | (id + 1);
        return static_cast<uint32_t>(id);
      }
      if (uint32_t(e >> 32) == tag && strings[uint32_t(e) - 1] == s) return uint32_t(e) - 1;
    }
  }
  // The local index + 1 in the first slot probed, when its tag matches, else 0:
  // a prefetch hint only.
  uint32_t candidate(uint64_t h) const {
    if (slots.empty()) return 0;
    const uint64_t e = slots[uint32_t(h) & (slots.size() - 1)];
    return e != 0 && uint32_t(e >> 32) == uint32_t(h) ? uint32_t(e) : 0;
  }
  void grow() {
    std::vector<uint64_t> old(std::max<size_t>(1024, slots.size() * 2), 0);
    old.swap(slots);
    const size_t mask = slots.size() - 1;
    for (uint64_t e : old) {
      if (e == 0) continue;
      size_t i = uint32_t(e >> 32) & mask;
      while (slots[i] != 0) i = (i + 1) & mask;
      slots[i] = e;
    }
  }
};

struct InternTable {
  std::array<InternShard, kShards> shards;
  std::string_view string_of(uint32_t key) const {
    return shards[key & (kShards - 1)].strings[key >> kShardBits];
  }
  uint64_t size() const {
    uint64_t n = 0;
    for (const auto& s : shards) n += s.strings.size();
    return n;
  }
};

// Lookups gathered a few at a time: the table slot, then the string's offset,
// then its bytes are fetched for all of them before any is compared, so their
// cache misses overlap instead of following one another (most of the time of
// interning 10^7 distinct ids is waiting for memory). The hints only warm the
// cache; each lookup is then an ordinary intern(), in order.
class InternBatch {
 public:
  void add(InternTable* t, uint32_t shard, std::string_view s, uint64_t h, uint32_t* out) {
    q_[n_++] = {&t->shards[shard], shard, s, h, out};
    if (n_ == kSize) flush();
  }
  void flush() {
    for (int k = 0; k < n_; ++k) {
      const InternShard& sh = *q_[k].shard;
      if (!sh.slots.empty()) __builtin_prefetch(&sh.slots[q_[k].h & uint32_t(sh.slots.size() - 1)]);
    }
    for (int k = 0; k < n_; ++k) q_[k].id = q_[k].shard->candidate(q_[k].h);
    for (int k = 0; k < n_; ++k)
      if (q_[k].id) __builtin_prefetch(&q_[k].shard->strings.offsets[q_[k].id - 1]);
    for (int k = 0; k < n_; ++k)
      if (q_[k].id) {
        const StringList& l = q_[k].shard->strings;
        __builtin_prefetch(l.bytes.data() + l.offsets[q_[k].id - 1]);
      }
    for (int k = 0; k < n_; ++k)
      *q_[k].out = (q_[k].shard->intern(q_[k].s, q_[k].h) << kShardBits) | q_[k].shard_index;
    n_ = 0;
  }

 private:
  static constexpr int kSize = 16;
  struct Lookup {
    InternShard* shard;
    uint32_t shard_index;
    std::string_view s;
    uint64_t h;
    uint32_t* out;
    uint32_t id = 0;  // the first probe's local index + 1, when its tag matches
  };
  Lookup q_[kSize];
  int n_ = 0;
};

// Keys in ascending order of their strings: order[rank] = key, and rank_of[key].
struct RankedIds {
  std::vector<uint32_t> order;
  std::vector<uint32_t> rank_of;
};

// Ranks the table's keys; the sort runs on `threads` threads (the result
// does not depend on them).
RankedIds rank_ids(const InternTable& t, int threads);

}  // namespace csv
}  // namespace ncf
