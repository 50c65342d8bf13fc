// CSV interaction logs → dataset: see source_csv.h.
//
// Memory at 10^8 rows (~10^7 users, ~10^6 items): the file goes through a few
// 32 MiB blocks (block_reader.h), never mapped whole; each row is kept as two
// uint32 keys and an int64 time (16 bytes, 1.6 GB), each distinct id string
// once in its intern shard; grouping frees the rows as it goes
// (interactions.h).
#include "data/source_csv.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/check.h"
#include "common/parallel.h"
#include "data/block_reader.h"
#include "data/csv_reader.h"
#include "data/extend.h"
#include "data/interactions.h"
#include "data/prep_stages.h"
#include "data/string_list.h"
#include "data/text_input.h"

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A size from an environment variable (the tests shrink blocks and the row
// limit to cover chunk and block boundaries with small files), else `fallback`.
size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (*end != '\0' || x == 0) NCF_FAIL("environment ", name, "=", v, " is not a positive integer");
  return static_cast<size_t>(x);
}

constexpr size_t kMaxRowBytes = size_t(1) << 20;
constexpr size_t kKeptBadRows = 10;  // bad rows reported by line with --skip_bad_rows

// ---------------------------------------------------------------- columns ---

enum Role { kUser, kItem, kTime, kRating, kRoles };
constexpr const char* kRoleName[kRoles] = {"user", "item", "timestamp", "rating"};

struct ColumnSpec {
  bool given = false;
  std::string name;    // header name, or empty when given by position
  int64_t index = -1;  // 0-based position (resolved)
};

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

// -------------------------------------------------------------- fields ---

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

namespace {

// ------------------------------------------------------------------ ids ---

// A 64-bit hash of an id's bytes: its top 6 bits pick the intern shard, its
// low 32 bits the slot.
uint64_t hash_id(const char* p, size_t n) {
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

// ------------------------------------------------------------- bad rows ---

enum BadKind {
  kMissingColumn,
  kExtraFields,
  kEmptyId,
  kBadTimestamp,
  kBadRating,
  kStrayQuote,
  kUnterminatedQuote,
  kBadKinds
};
constexpr const char* kBadKey[kBadKinds] = {"missing_column",    "extra_fields", "empty_id",
                                            "bad_timestamp",     "bad_rating",   "stray_quote",
                                            "unterminated_quote"};

struct BadRow {
  uint64_t line = 0;    // relative to the chunk until committed
  std::string message;  // "column NAME (C): REASON: "EXCERPT""
};

// ----------------------------------------------------------- the parse ---

// A parsed row, its id bytes in the block buffer (or in a chunk's own copy
// when the field held "" pairs).
struct Row {
  const char* user;
  const char* item;
  uint32_t user_size, item_size;
  uint64_t user_hash, item_hash;
  int64_t time;
};

struct Chunk {
  std::vector<Row> rows;
  std::vector<std::unique_ptr<std::string>> unescaped;  // owned values of "" fields
  std::vector<BadRow> bad;                              // the first kKeptBadRows
  std::array<uint64_t, kBadKinds> bad_counts{};
  uint64_t records = 0;  // non-blank records
  uint64_t below_min_rating = 0;
  void reset() {
    rows.clear();
    unescaped.clear();
    bad.clear();
    bad_counts.fill(0);
    records = 0;
    below_min_rating = 0;
  }
};

struct Layout {
  std::array<int64_t, kRoles> col{};  // -1 when absent
  size_t num_fields = 0;              // M: every row has this many fields
  std::vector<std::string> header;    // the header's names, when there is one
  std::string name_of(size_t c) const {
    if (!header.empty() && c < header.size()) {
      const std::string& h = header[c];
      return excerpt(h.data(), h.data() + h.size());
    }
    for (int r = 0; r < kRoles; ++r)
      if (col[size_t(r)] == int64_t(c)) return kRoleName[r];
    return "#" + std::to_string(c);
  }
};

class RowParser {
 public:
  RowParser(const Layout& layout, const CsvOptions& csv, size_t max_row_bytes)
      : layout_(layout), csv_(csv), max_row_bytes_(max_row_bytes) {}

  // Every record of the scanner into `out`.
  void scan(CsvScanner& sc, Chunk* out) const {
    out->reset();
    CsvRecord r;
    std::string scratch;
    while (sc.next(&r)) {
      if (r.problem == CsvProblem::kNone && r.num_fields == 1 && r.blank()) continue;
      ++out->records;
      take(r, out, &scratch);
    }
  }

 private:
  void bad(Chunk* out, BadKind kind, const CsvRecord& r, size_t column, const std::string& reason,
           const char* b, const char* e) const {
    ++out->bad_counts[kind];
    if (out->bad.size() >= kKeptBadRows) return;
    out->bad.push_back({r.line, detail::concat("column ", layout_.name_of(column), " (", column,
                                               "): ", reason, ": \"", excerpt(b, e), "\"")});
  }

  void take(const CsvRecord& r, Chunk* out, std::string* scratch) const {
    if (r.problem == CsvProblem::kStrayQuote) {
      bad(out, kStrayQuote, r, r.problem_field, "stray quote (a quote must enclose a whole field)",
          r.begin, r.end);
      return;
    }
    if (r.problem == CsvProblem::kUnterminatedQuote) {
      bad(out, kUnterminatedQuote, r, r.problem_field,
          detail::concat("unterminated quote (no closing quote within ", max_row_bytes_,
                         " bytes or before the end of the file)"),
          r.begin, r.end);
      return;
    }
    const size_t M = layout_.num_fields;
    if (r.num_fields < M) {
      bad(out, kMissingColumn, r, r.num_fields,
          detail::concat("missing: the row has ", r.num_fields, " field",
                         r.num_fields == 1 ? "" : "s", ", the first row ", M),
          r.begin, r.end);
      return;
    }
    if (r.num_fields > M) {
      bad(out, kExtraFields, r, M,
          detail::concat("more fields than the first row's ", M, " (", r.num_fields, ")"), r.begin,
          r.end);
      return;
    }
    Row row{};
    for (int role : {kUser, kItem}) {
      const size_t c = size_t(layout_.col[size_t(role)]);
      const CsvField& f = r.fields[c];
      std::string_view v = csv_value(f, scratch);
      if (v.empty()) {
        bad(out, kEmptyId, r, c, detail::concat("empty ", kRoleName[role], " id"), r.begin, r.end);
        return;
      }
      if (f.doubled) {
        out->unescaped.push_back(std::make_unique<std::string>(v));
        v = *out->unescaped.back();
      }
      const uint64_t h = hash_id(v.data(), v.size());
      if (v.size() > UINT32_MAX) NCF_FAIL("id longer than 4 GiB");
      (role == kUser ? row.user : row.item) = v.data();
      (role == kUser ? row.user_size : row.item_size) = static_cast<uint32_t>(v.size());
      (role == kUser ? row.user_hash : row.item_hash) = h;
    }
    std::string why;
    if (layout_.col[kTime] >= 0) {
      const size_t c = size_t(layout_.col[kTime]);
      const std::string_view v = csv_value(r.fields[c], scratch);
      if (!parse_csv_timestamp(v, &row.time, &why)) {
        bad(out, kBadTimestamp, r, c, why, v.data(), v.data() + v.size());
        return;
      }
    }
    if (layout_.col[kRating] >= 0) {
      const size_t c = size_t(layout_.col[kRating]);
      const std::string_view v = csv_value(r.fields[c], scratch);
      double rating = 0;
      if (!parse_rating(v, &rating, &why)) {
        bad(out, kBadRating, r, c, why, v.data(), v.data() + v.size());
        return;
      }
      if (csv_.min_rating && rating < *csv_.min_rating) {
        ++out->below_min_rating;
        return;
      }
    }
    out->rows.push_back(row);
  }

  const Layout& layout_;
  const CsvOptions& csv_;
  size_t max_row_bytes_;
};

// ---------------------------------------------------------- the header ---

// The first non-blank records of the input (up to `want`), reading more
// blocks while they run past the buffer.
struct FirstRows {
  std::vector<CsvTextRecord> rows;
  size_t after_first = 0;         // offset just past the first row
  uint64_t first_line = 0;        // 1-based line of the first row
  uint64_t after_first_line = 0;  // 1-based line just past it
};

FirstRows first_rows(BlockReader& reader, std::vector<char>* buf, size_t start, bool* eof,
                     const CsvSyntax& syntax, size_t want, const std::string& file) {
  for (;;) {
    FirstRows f;
    CsvScanner sc(buf->data() + start, buf->data() + buf->size(), buf->data() + buf->size(), *eof,
                  syntax);
    CsvRecord r;
    std::string scratch;
    while (f.rows.size() < want && sc.next(&r)) {
      if (r.problem == CsvProblem::kNone && r.num_fields == 1 && r.blank()) continue;
      CsvTextRecord t;
      t.line = 1 + r.line;
      t.problem = r.problem;
      t.text.assign(r.begin, r.end);
      for (size_t k = 0; k < r.num_fields; ++k)
        t.fields.emplace_back(csv_value(r.fields[k], &scratch));
      if (f.rows.empty()) {
        f.after_first = static_cast<size_t>(sc.pos() - buf->data());
        f.first_line = t.line;
        f.after_first_line = 1 + sc.lines();
      }
      f.rows.push_back(std::move(t));
    }
    if (sc.status() == CsvScanner::Status::kTooLong)
      NCF_FAIL(file, ":", 1 + sc.lines(), ": a row longer than ", syntax.max_record_bytes,
               " bytes: not an interaction file with these --separator and quoting rules");
    // Fewer rows than wanted and more input: read on, also when the buffer
    // ended exactly at a record's end (the scanner then says kDone, not
    // kNeedMore), or where the blocks happen to end would decide the header.
    if (f.rows.size() >= want || *eof) return f;
    if (reader.append_next(buf) == 0) *eof = true;
  }
}

Layout resolve_layout(const std::array<ColumnSpec, kRoles>& cols, const FirstRows& first,
                      CsvHeader header_mode, const std::string& file, bool* has_header) {
  if (first.rows.empty()) NCF_FAIL(file, ": no rows (the file holds only blank lines)");
  const CsvTextRecord& row1 = first.rows[0];
  const std::string where = detail::concat(file, ":", row1.line);
  const std::string shown = excerpt(row1.text.data(), row1.text.data() + row1.text.size());
  if (row1.problem != CsvProblem::kNone)
    NCF_FAIL(where, ": the first row has a ",
             row1.problem == CsvProblem::kStrayQuote ? "stray" : "unterminated",
             " quote, so its columns are unknown: \"", shown, "\"");
  bool by_name = false;
  for (const auto& c : cols) by_name |= c.given && !c.name.empty();
  bool header = header_mode == CsvHeader::kYes;
  if (by_name) {
    if (header_mode == CsvHeader::kNo)
      NCF_FAIL(
          "--columns names columns by header name but --header no: give positions, or "
          "--header yes");
    header = true;
  } else if (header_mode == CsvHeader::kAuto) {
    // Typed columns decide: a header's timestamp and rating fields are not
    // timestamps and numbers. With only ids, integer ids on line 2 and
    // non-integer ones on line 1 make line 1 a header; otherwise ask.
    int typed = 0, parsed = 0;
    for (int role : {kTime, kRating}) {
      if (!cols[size_t(role)].given) continue;
      ++typed;
      const size_t c = size_t(cols[size_t(role)].index);
      if (c >= row1.fields.size()) continue;
      std::string why;
      int64_t t = 0;
      double v = 0;
      parsed += role == kTime ? parse_csv_timestamp(row1.fields[c], &t, &why)
                              : parse_rating(row1.fields[c], &v, &why);
    }
    auto ids_are_integers = [&](const CsvTextRecord& r) {
      for (int role : {kUser, kItem}) {
        const size_t c = size_t(cols[size_t(role)].index);
        if (c >= r.fields.size() || !all_digits(r.fields[c])) return false;
      }
      return true;
    };
    const char* ask = "; pass --header yes or --header no";
    if (typed > 0) {
      if (parsed > 0 && parsed < typed)
        NCF_FAIL(where,
                 ": cannot tell whether the first row is a header (one of its timestamp and "
                 "rating fields parses, the other does not)",
                 ask, ": \"", shown, "\"");
      header = parsed == 0;
    } else if (first.rows.size() >= 2 && ids_are_integers(first.rows[1])) {
      header = !ids_are_integers(row1);
    } else {
      NCF_FAIL(where,
               ": cannot tell whether the first row is a header: with string ids and no "
               "timestamp or rating column nothing tells a header from data",
               ask, ": \"", shown, "\"");
    }
  }
  *has_header = header;
  Layout L;
  L.num_fields = row1.fields.size();
  if (header) L.header = row1.fields;
  for (int role = 0; role < kRoles; ++role) {
    const ColumnSpec& c = cols[size_t(role)];
    L.col[size_t(role)] = -1;
    if (!c.given) continue;
    if (c.name.empty()) {
      if (size_t(c.index) >= L.num_fields)
        NCF_FAIL("--columns ", kRoleName[role], "=", c.index, ": the first row (", where, ") has ",
                 L.num_fields, " column", L.num_fields == 1 ? "" : "s", ": \"", shown, "\"");
      L.col[size_t(role)] = c.index;
      continue;
    }
    for (size_t k = 0; k < L.header.size(); ++k) {
      if (L.header[k] != c.name) continue;
      if (L.col[size_t(role)] >= 0)
        NCF_FAIL("--columns ", kRoleName[role], "=", c.name, ": the header (", where,
                 ") has two columns of that name; give the position");
      L.col[size_t(role)] = int64_t(k);
    }
    if (L.col[size_t(role)] < 0)
      NCF_FAIL("--columns ", kRoleName[role], "=", c.name, ": no such column in the header (",
               where, "): \"", shown, "\"");
  }
  for (int a = 0; a < kRoles; ++a)
    for (int b = a + 1; b < kRoles; ++b)
      if (L.col[size_t(a)] >= 0 && L.col[size_t(a)] == L.col[size_t(b)])
        NCF_FAIL("--columns: ", kRoleName[a], " and ", kRoleName[b], " are the same column (",
                 L.col[size_t(a)], ")");
  return L;
}

std::string input_name(const std::string& file) {
  std::string name = basename_of(file);
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  return name;
}

}  // namespace

DatasetMeta prepare_csv(const std::string& file, const CsvOptions& csv, const std::string& out_dir,
                        const PrepOptions& opt) {
  const PrepProgress progress{opt.progress, "prep", Clock::now()};
  const int threads = resolve_threads(opt.threads);
  if (opt.min_interactions < 1)
    NCF_FAIL("min_interactions must be >= 1, got ", opt.min_interactions);
  const std::array<ColumnSpec, kRoles> cols = parse_columns(csv.columns);
  if (csv.min_rating && !cols[kRating].given)
    NCF_FAIL("--min_rating needs a rating column in --columns (rating=C)");

  CsvSyntax syntax;
  syntax.separator = csv.separator;
  syntax.max_record_bytes = env_size("NCF_CSV_MAX_ROW_BYTES", kMaxRowBytes);
  const size_t block_bytes = env_size("NCF_CSV_BLOCK_BYTES", BlockReader::kDefaultBlockBytes);
  syntax.min_chunk_bytes = std::max<size_t>(1, std::min<size_t>(size_t(1) << 20, block_bytes / 4));

  // ---- parse + intern, block by block ----
  BlockReader reader(file, block_bytes);
  std::vector<char> buf;
  bool eof = reader.append_next(&buf) == 0;
  const size_t start =
      static_cast<size_t>(skip_bom(buf.data(), buf.data() + buf.size()) - buf.data());
  const FirstRows first = first_rows(reader, &buf, start, &eof, syntax, 2, file);
  bool has_header = false;
  const Layout layout = resolve_layout(cols, first, csv.header, file, &has_header);
  const bool timed = layout.col[kTime] >= 0;
  const RowParser parser(layout, csv, syntax.max_record_bytes);

  size_t pos = has_header ? first.after_first : start;
  uint64_t line = has_header ? first.after_first_line : 1;
  InternTable users, items;
  Interactions in;
  std::vector<Chunk> slots(static_cast<size_t>(threads));
  std::vector<Chunk> committed;
  std::array<uint64_t, kBadKinds> bad_counts{};
  std::vector<std::pair<uint64_t, std::string>> bad_rows;  // the first kKeptBadRows
  uint64_t records = 0, below_min_rating = 0;
  double parse_s = 0, intern_s = 0;
  bool reserved = false;
  for (;;) {
    // Parse: chunks of the buffer on the pool, committed in file order.
    auto t0 = Clock::now();
    const size_t round_start = pos;
    committed.clear();
    const CsvBlockResult res = scan_csv_block(
        buf.data(), pos, buf.size(), eof, line, syntax, threads,
        [&](int slot, CsvScanner& sc) { parser.scan(sc, &slots[size_t(slot)]); },
        [&](int slot, uint64_t first_line) {
          Chunk& c = slots[size_t(slot)];
          for (BadRow& b : c.bad) b.line += first_line;
          if (!csv.skip_bad_rows && !c.bad.empty())
            NCF_FAIL(file, ":", c.bad[0].line, ": ", c.bad[0].message);
          for (int k = 0; k < kBadKinds; ++k) bad_counts[size_t(k)] += c.bad_counts[size_t(k)];
          for (BadRow& b : c.bad)
            if (bad_rows.size() < kKeptBadRows) bad_rows.emplace_back(b.line, std::move(b.message));
          records += c.records;
          below_min_rating += c.below_min_rating;
          committed.push_back(std::move(c));
          c = Chunk();
        });
    if (res.too_long)
      NCF_FAIL(file, ":", line + res.lines, ": a row longer than ", syntax.max_record_bytes,
               " bytes: not an interaction file with these --separator and quoting rules");
    parse_s += seconds_since(t0);

    // Intern: each thread owns the shards s with s % threads == its index.
    t0 = Clock::now();
    uint64_t n = 0;
    for (const Chunk& c : committed) n += c.rows.size();
    const uint64_t base = in.user.size();
    if (!reserved && n > 0 && !reader.gzip()) {
      // Rows of the whole file, from the bytes per row of the first block.
      const double per_row = double(res.consumed - round_start) / double(n);
      const uint64_t est =
          static_cast<uint64_t>(double(reader.file_bytes()) / per_row * 1.02) + 1024;
      in.user.reserve(est);
      in.item.reserve(est);
      if (timed) in.time.reserve(est);
      reserved = true;
    }
    in.user.resize(base + n);
    in.item.resize(base + n);
    if (timed) in.time.resize(base + n);
    parallel_for(threads, threads, 1, [&](int64_t t0_, int64_t t1_) {
      for (int64_t t = t0_; t < t1_; ++t) {
        InternBatch batch;
        uint64_t k = base;
        for (const Chunk& c : committed)
          for (const Row& r : c.rows) {
            const uint32_t su = uint32_t(r.user_hash >> (64 - kShardBits));
            if (su % uint32_t(threads) == uint32_t(t))
              batch.add(&users, su, {r.user, r.user_size}, r.user_hash, &in.user[k]);
            const uint32_t si = uint32_t(r.item_hash >> (64 - kShardBits));
            if (si % uint32_t(threads) == uint32_t(t))
              batch.add(&items, si, {r.item, r.item_size}, r.item_hash, &in.item[k]);
            if (timed && t == 0) in.time[k] = r.time;
            ++k;
          }
        batch.flush();
      }
    });
    for (uint32_t s = 0; s < kShards; ++s)
      if (users.shards[s].strings.size() >= kMaxPerShard ||
          items.shards[s].strings.size() >= kMaxPerShard)
        NCF_FAIL(file, ": more distinct ids than this reader handles (about 2^32)");
    intern_s += seconds_since(t0);

    line += res.lines;
    buf.erase(buf.begin(), buf.begin() + ptrdiff_t(res.consumed));
    pos = 0;
    if (eof) break;
    if (reader.append_next(&buf) == 0) eof = true;
  }
  committed.clear();
  slots.clear();
  const uint64_t num_rows = in.user.size();
  const uint64_t bad_total = [&] {
    uint64_t s = 0;
    for (uint64_t c : bad_counts) s += c;
    return s;
  }();
  if (opt.progress) {
    std::fprintf(stderr,
                 "prep: read %llu rows (%.1f MB%s) from %s in %.1f s: parse %.1f s, intern %.1f "
                 "s; %llu user ids, %llu item ids\n",
                 static_cast<unsigned long long>(records), double(reader.content_bytes()) / 1e6,
                 reader.gzip() ? " inflated" : "", file.c_str(), progress.seconds(), parse_s,
                 intern_s, static_cast<unsigned long long>(users.size()),
                 static_cast<unsigned long long>(items.size()));
  }
  if (bad_total > 0) {
    std::string by_kind, lines;
    for (int k = 0; k < kBadKinds; ++k)
      if (bad_counts[size_t(k)])
        by_kind +=
            detail::concat(by_kind.empty() ? "" : ", ", kBadKey[k], " ", bad_counts[size_t(k)]);
    for (const auto& b : bad_rows) lines += detail::concat(lines.empty() ? "" : ", ", b.first);
    std::fprintf(stderr, "ncf_prep: skipped %llu bad rows of %s (%s); first at lines %s%s\n",
                 static_cast<unsigned long long>(bad_total), file.c_str(), by_kind.c_str(),
                 lines.c_str(), bad_total > bad_rows.size() ? ", ..." : "");
    for (size_t k = 0; k < std::min<size_t>(3, bad_rows.size()); ++k)
      std::fprintf(stderr, "ncf_prep:   %s:%llu: %s\n", file.c_str(),
                   static_cast<unsigned long long>(bad_rows[k].first), bad_rows[k].second.c_str());
  }
  if (num_rows == 0)
    NCF_FAIL(file, ": no interactions: ", records, " rows, ", bad_total, " bad, ", below_min_rating,
             " rated below --min_rating");

  // ---- rank: keys in ascending byte order of the id strings ----
  auto t0 = Clock::now();
  RankedIds user_rank = rank_ids(users, threads);
  RankedIds item_rank = rank_ids(items, threads);
  in.num_user_keys = user_rank.order.size();
  in.num_item_keys = item_rank.order.size();
  parallel_ranges(threads, num_rows, [&](uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      in.user[k] = user_rank.rank_of[in.user[k]];
      in.item[k] = item_rank.rank_of[in.item[k]];
    }
  });
  std::vector<uint32_t>().swap(user_rank.rank_of);
  std::vector<uint32_t>().swap(item_rank.rank_of);
  const double rank_s = seconds_since(t0);

  nlohmann::json columns = nlohmann::json::object();
  for (int r = 0; r < kRoles; ++r)
    if (layout.col[size_t(r)] >= 0) columns[kRoleName[r]] = layout.col[size_t(r)];
  // No path and nothing about compression: the same rows give the same dataset
  // from a .gz file and from its plain twin.
  const nlohmann::json generator = {{"format", "csv"},
                                    {"input", input_name(file)},
                                    {"input_bytes", reader.content_bytes()},
                                    {"input_crc32c", reader.content_crc32c()},
                                    {"columns", columns},
                                    {"separator", std::string(1, csv.separator)},
                                    {"header", has_header},
                                    {"time", timed ? "timestamp column" : "file order"},
                                    {"rows", records},
                                    {"interactions", num_rows},
                                    {"min_interactions", opt.min_interactions}};
  if (!opt.extend.prev.empty()) {
    // ---- extend a dataset (extend.h) ----
    KeyedLog log;
    log.strings = true;
    for (uint64_t k = 0; k < in.num_user_keys; ++k)
      log.user_strings.push_back(users.string_of(user_rank.order[k]));
    for (uint64_t k = 0; k < in.num_item_keys; ++k)
      log.item_strings.push_back(items.string_of(item_rank.order[k]));
    users = InternTable();
    items = InternTable();
    log.in = std::move(in);
    DatasetPlan plan = plan_of_options("csv:" + input_name(file), opt);
    plan.generator = generator;
    plan.generator["max_users"] = opt.extend.max_users;
    plan.generator["max_items"] = opt.extend.max_items;
    if (csv.min_rating) plan.generator["min_rating"] = *csv.min_rating;
    if (csv.skip_bad_rows) plan.generator["bad_rows"] = bad_total;
    return extend_dataset(std::move(log), plan, opt, out_dir, file);
  }

  // ---- remap + split (shared with MovieLens) ----
  t0 = Clock::now();
  const HeldOutUsers d = hold_out_latest(std::move(in), opt.min_interactions, threads, file);
  const uint64_t U = d.num_users(), I = d.num_items();
  StringList user_ids, item_ids;
  user_ids.offsets.reserve(U + 1);
  item_ids.offsets.reserve(I + 1);
  for (uint64_t u = 0; u < U; ++u)
    user_ids.push_back(users.string_of(user_rank.order[d.user_key[u]]));
  for (uint64_t i = 0; i < I; ++i)
    item_ids.push_back(items.string_of(item_rank.order[d.item_key[i]]));
  users = InternTable();
  items = InternTable();
  const double group_s = seconds_since(t0);
  if (opt.progress)
    std::fprintf(stderr,
                 "prep: %llu users (%llu dropped with < %u items), %llu items, %llu duplicate rows "
                 "removed; rank %.1f s, group %.1f s (%.1f s)\n",
                 static_cast<unsigned long long>(U), static_cast<unsigned long long>(d.dropped),
                 opt.min_interactions, static_cast<unsigned long long>(I),
                 static_cast<unsigned long long>(d.duplicates), rank_s, group_s,
                 progress.seconds());

  DatasetPlan plan = plan_of_options("csv:" + input_name(file), opt);
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = d.pos.size() - U;
  plan.num_positives = d.pos.size();
  plan.dropped_users = d.dropped;
  // Each id's latest activity (generation 0), what a bounded --extend keeps by.
  std::vector<int64_t> user_activity, item_activity;
  activity_of(d, &user_activity, &item_activity);
  plan.user_activity = &user_activity;
  plan.item_activity = &item_activity;
  plan.user_strings = &user_ids;
  plan.item_strings = &item_ids;
  plan.generator = generator;
  plan.generator["duplicates_removed"] = d.duplicates;
  plan.generator["raw_users"] = d.raw_users;
  if (csv.min_rating) {
    plan.generator["min_rating"] = *csv.min_rating;
    plan.generator["below_min_rating"] = below_min_rating;
  }
  if (csv.skip_bad_rows) {
    nlohmann::json counts = nlohmann::json::object();
    for (int k = 0; k < kBadKinds; ++k) counts[kBadKey[k]] = bad_counts[size_t(k)];
    nlohmann::json lines = nlohmann::json::array();
    for (const auto& b : bad_rows) lines.push_back(b.first);
    plan.generator["bad_rows"] = bad_total;
    plan.generator["bad_rows_by_reason"] = counts;
    plan.generator["first_bad_lines"] = lines;
  }
  EvalNegatives negatives{I, opt.eval_negatives, opt.seed, nullptr, [&](uint64_t u) {
                            const std::string_view id = user_ids[u];
                            return detail::concat(file, ": user \"",
                                                  excerpt(id.data(), id.data() + id.size()), "\"");
                          }};
  return assemble_dataset(out_dir, plan, leave_one_out(d), negatives, threads, progress);
}

}  // namespace ncf
