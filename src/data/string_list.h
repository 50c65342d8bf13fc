// Strings kept in one byte buffer with offsets: the in-memory form of a string
// id map (dataset.h: user_ids.str, item_ids.str), which holds exactly these two
// arrays. Strings are arbitrary bytes; a sorted list is looked up by binary search.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ncf {

struct StringList {
  std::vector<uint64_t> offsets{0};  // size() + 1: string d is bytes[offsets[d], offsets[d + 1])
  std::string bytes;

  size_t size() const { return offsets.size() - 1; }
  std::string_view operator[](size_t d) const {
    return std::string_view(bytes.data() + offsets[d], size_t(offsets[d + 1] - offsets[d]));
  }
  void push_back(std::string_view s) {
    bytes.append(s.data(), s.size());
    offsets.push_back(bytes.size());
  }
  // The index of s in a list sorted ascending bytewise; nullopt when absent.
  std::optional<size_t> find_sorted(std::string_view s) const {
    size_t lo = 0, hi = size();
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if ((*this)[mid] < s) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo < size() && (*this)[lo] == s) return lo;
    return std::nullopt;
  }
};

}  // namespace ncf
