// The fields of a CSV interaction log (source_csv.h): which column holds what
// (--columns), and the typed fields' syntax (ratings; timestamps are
// parse_csv_timestamp in source_csv.h). Shared by the header rule and the row
// parser of source_csv.cc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ncf {
namespace csv {

enum Role { kUser, kItem, kTime, kRating, kRoles };
constexpr const char* kRoleName[kRoles] = {"user", "item", "timestamp", "rating"};

struct ColumnSpec {
  bool given = false;
  std::string name;    // header name, or empty when given by position
  int64_t index = -1;  // 0-based position (resolved)
};

// --columns: "user=C,item=C[,timestamp=C][,rating=C]", each C a header name
// or a 0-based position; user and item required.
std::array<ColumnSpec, kRoles> parse_columns(const std::string& text);

// `s` without leading and trailing spaces and tabs.
std::string_view trim_spaces(std::string_view s);
// Whether `s` is one or more ASCII digits.
bool all_digits(std::string_view s);
// A rating field: a finite decimal number, surrounding spaces ignored; false
// with *why otherwise.
bool parse_rating(std::string_view text, double* v, std::string* why);

}  // namespace csv
}  // namespace ncf
