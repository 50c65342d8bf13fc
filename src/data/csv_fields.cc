// The fields of a CSV log: see csv_fields.h; the --separator, --header and
// timestamp syntax of source_csv.h.
#include "data/csv_fields.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/check.h"
#include "data/source_csv.h"
#include "data/text_input.h"

namespace ncf {
namespace csv {

std::array<ColumnSpec, kRoles> parse_columns(const std::string& text) {
  std::array<ColumnSpec, kRoles> cols;
  if (text.empty())
    NCF_FAIL(
        "--format csv needs --columns user=C,item=C[,timestamp=C][,rating=C] (each C a "
        "header name or a 0-based position)");
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    const std::string part = text.substr(at, comma - at);
    const size_t eq = part.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == part.size())
      NCF_FAIL("--columns '", text, "': '", part, "' is not KEY=COLUMN");
    const std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    int role = -1;
    for (int r = 0; r < kRoles; ++r)
      if (key == kRoleName[r]) role = r;
    if (role < 0)
      NCF_FAIL("--columns '", text, "': unknown key '", key,
               "' (the keys are user, item, timestamp, rating)");
    ColumnSpec& c = cols[size_t(role)];
    if (c.given) NCF_FAIL("--columns '", text, "': '", key, "' given twice");
    c.given = true;
    const bool digits =
        std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (digits) {
      if (value.size() > 9) NCF_FAIL("--columns '", text, "': position ", value, " is too large");
      c.index = std::stoll(value);
    } else {
      c.name = value;
    }
    at = comma + 1;
  }
  if (!cols[kUser].given || !cols[kItem].given)
    NCF_FAIL("--columns '", text, "': user and item are required");
  return cols;
}

std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool parse_rating(std::string_view text, double* v, std::string* why) {
  const std::string_view s = trim_spaces(text);
  if (s.empty()) {
    *why = "empty rating";
    return false;
  }
  const auto [q, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  if (ec != std::errc() || q != s.data() + s.size() || !std::isfinite(*v)) {
    *why = "not a decimal number";
    return false;
  }
  return true;
}

}  // namespace csv

namespace {

// Days from 1970-01-01 to year-month-day of the proleptic Gregorian calendar.
int64_t days_since_epoch(int64_t y, int m, int d) {
  auto floor_div = [](int64_t a, int64_t b) {
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
  };
  // Leap days in the years before y, counted from year 0.
  auto leap_days_before = [&](int64_t year) {
    const int64_t p = year - 1;
    return floor_div(p, 4) - floor_div(p, 100) + floor_div(p, 400);
  };
  static constexpr int kBeforeMonth[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  const int64_t days_to_year = 365 * (y - 1970) + leap_days_before(y) - leap_days_before(1970);
  return days_to_year + kBeforeMonth[m - 1] + (leap && m > 2 ? 1 : 0) + (d - 1);
}

// `n` digits at s[at..) as a number; false when they are not all digits.
bool digits_at(std::string_view s, size_t at, size_t n, int* v) {
  if (at + n > s.size()) return false;
  int x = 0;
  for (size_t k = at; k < at + n; ++k) {
    if (s[k] < '0' || s[k] > '9') return false;
    x = x * 10 + (s[k] - '0');
  }
  *v = x;
  return true;
}

}  // namespace

using csv::all_digits;
using csv::trim_spaces;

bool parse_csv_timestamp(std::string_view text, int64_t* micros, std::string* why) {
  const std::string_view s = trim_spaces(text);
  if (s.empty()) {
    *why = "empty timestamp";
    return false;
  }
  const bool is_integer =
      all_digits(s) || ((s[0] == '-' || s[0] == '+') && all_digits(s.substr(1)));
  if (is_integer) {
    int64_t v = 0;
    const char* b = s.data() + (s[0] == '+' ? 1 : 0);
    const auto [q, ec] = std::from_chars(b, s.data() + s.size(), v);
    constexpr int64_t kMaxSeconds = INT64_MAX / 1000000 - 1;
    if (ec != std::errc() || q != s.data() + s.size() || v > kMaxSeconds || v < -kMaxSeconds) {
      *why = "integer timestamp out of range";
      return false;
    }
    *micros = v * 1000000;
    return true;
  }
  const char* kExpected =
      "not a timestamp (integer seconds since the epoch, or ISO 8601 such as 2019-03-04 or "
      "2019-03-04T05:06:07Z)";
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!digits_at(s, 0, 4, &year) || s.size() < 10 || s[4] != '-' || !digits_at(s, 5, 2, &month) ||
      s[7] != '-' || !digits_at(s, 8, 2, &day)) {
    *why = kExpected;
    return false;
  }
  size_t at = 10;
  int64_t frac_micros = 0;
  if (at < s.size() && (s[at] == 'T' || s[at] == 't' || s[at] == ' ')) {
    if (!digits_at(s, at + 1, 2, &hour) || at + 3 >= s.size() || s[at + 3] != ':' ||
        !digits_at(s, at + 4, 2, &minute)) {
      *why = kExpected;
      return false;
    }
    at += 6;
    if (at < s.size() && s[at] == ':') {
      if (!digits_at(s, at + 1, 2, &second)) {
        *why = kExpected;
        return false;
      }
      at += 3;
      if (at < s.size() && (s[at] == '.' || s[at] == ',')) {
        size_t k = at + 1;
        int64_t scale = 100000;
        while (k < s.size() && s[k] >= '0' && s[k] <= '9') {
          frac_micros += (s[k] - '0') * scale;
          scale /= 10;
          ++k;
        }
        if (k == at + 1) {
          *why = kExpected;
          return false;
        }
        at = k;
      }
    }
  }
  int64_t offset_seconds = 0;
  if (at < s.size()) {
    if (s[at] == 'Z' || s[at] == 'z') {
      ++at;
    } else if (s[at] == '+' || s[at] == '-') {
      const int sign = s[at] == '-' ? -1 : 1;
      int oh = 0, om = 0;
      if (!digits_at(s, at + 1, 2, &oh)) {
        *why = kExpected;
        return false;
      }
      at += 3;
      if (at < s.size() && s[at] == ':') {
        if (!digits_at(s, at + 1, 2, &om)) {
          *why = kExpected;
          return false;
        }
        at += 3;
      } else if (digits_at(s, at, 2, &om)) {
        at += 2;
      }
      if (oh > 23 || om > 59) {
        *why = "timestamp offset out of range";
        return false;
      }
      offset_seconds = sign * (oh * 3600 + om * 60);
    }
  }
  if (at != s.size()) {
    *why = kExpected;
    return false;
  }
  static constexpr int kDays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  if (month < 1 || month > 12 || day < 1 || day > kDays[month - 1] ||
      (month == 2 && day == 29 && !leap) || hour > 23 || minute > 59 || second > 60) {
    *why = "timestamp out of range (month, day, hour, minute or second)";
    return false;
  }
  const int64_t secs = days_since_epoch(year, month, day) * 86400 + hour * 3600 + minute * 60 +
                       second - offset_seconds;
  *micros = secs * 1000000 + frac_micros;
  return true;
}

char parse_csv_separator(const std::string& text) {
  if (text == "\\t" || text == "tab" || text == "TAB") return '\t';
  if (text.size() != 1)
    NCF_FAIL("--separator '", text, "': give one character (or \\t or tab for TAB)");
  const char c = text[0];
  if (c == '"' || c == '\n' || c == '\r')
    NCF_FAIL("--separator '", excerpt(text.data(), text.data() + text.size()),
             "': a quote or a line break cannot separate fields");
  return c;
}

CsvHeader parse_csv_header(const std::string& text) {
  if (text == "auto") return CsvHeader::kAuto;
  if (text == "yes") return CsvHeader::kYes;
  if (text == "no") return CsvHeader::kNo;
  NCF_FAIL("--header '", text, "': expected yes, no or auto");
}

}  // namespace ncf
