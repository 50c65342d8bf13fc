// CSV interaction logs → dataset: see source_csv.h. The columns' and fields'
// syntax is csv_fields.cc, the id tables csv_intern.cc; here the rows are
// parsed and the pipeline runs.
//
// Memory at 10^8 rows (~10^7 users, ~10^6 items): the file goes through a few
// 32 MiB blocks (block_reader.h), never mapped whole; each row is kept as two
// uint32 keys and an int64 time (16 bytes, 1.6 GB), each distinct id string
// once in its intern shard; grouping frees the rows as it goes
// (interactions.h).
#include "data/source_csv.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>

#include "common/check.h"
#include "common/parallel.h"
#include "data/block_reader.h"
#include "data/csv_fields.h"
#include "data/csv_intern.h"
#include "data/csv_reader.h"
#include "data/extend.h"
#include "data/interactions.h"
#include "data/prep_stages.h"
#include "data/string_list.h"
#include "data/text_input.h"

namespace ncf {
namespace {

// The columns and fields (csv_fields.h) and the id tables (csv_intern.h).
using namespace csv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr size_t kKeptBadRows = 10;  // bad rows reported by line with --skip_bad_rows

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
               " bytes (--csv_max_row_bytes): not an interaction file with these --separator and "
               "quoting rules");
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

// ---------------------------------------------------------- the stages ---

// --csv_max_row_bytes and --csv_block_bytes as the parse's syntax; refuses a
// size outside the flags' range, naming the flag.
CsvSyntax syntax_of(const CsvOptions& csv) {
  for (const auto& [flag, v] : {std::pair<const char*, size_t>{"max_row_bytes", csv.max_row_bytes},
                                {"block_bytes", csv.block_bytes}})
    if (v < 1 || v > kMaxCsvSizeFlag)
      NCF_FAIL("flag --csv_", flag, " must be in [1, ", kMaxCsvSizeFlag, "], got ", v);
  CsvSyntax syntax;
  syntax.separator = csv.separator;
  syntax.max_record_bytes = csv.max_row_bytes;
  syntax.min_chunk_bytes =
      std::max<size_t>(1, std::min<size_t>(size_t(1) << 20, csv.block_bytes / 4));
  return syntax;
}

// What the parse and intern stages take from the file: every row's user and
// item key (and time), each distinct id string once, the bad rows.
struct CsvLog {
  Layout layout;
  bool has_header = false;
  InternTable users, items;
  Interactions in;
  std::array<uint64_t, kBadKinds> bad_counts{};
  std::vector<std::pair<uint64_t, std::string>> bad_rows;  // the first kKeptBadRows
  uint64_t records = 0, below_min_rating = 0;
  double parse_s = 0, intern_s = 0;

  bool timed() const { return layout.col[kTime] >= 0; }
  uint64_t bad_total() const {
    uint64_t s = 0;
    for (uint64_t c : bad_counts) s += c;
    return s;
  }
  // Takes a parsed chunk, in file order: its lines made absolute, its bad
  // rows counted (or the first one refused), its rows kept for interning.
  void commit(Chunk& c, uint64_t first_line, const CsvOptions& csv, const std::string& file,
              std::vector<Chunk>* committed) {
    for (BadRow& b : c.bad) b.line += first_line;
    if (!csv.skip_bad_rows && !c.bad.empty())
      NCF_FAIL(file, ":", c.bad[0].line, ": ", c.bad[0].message);
    for (int k = 0; k < kBadKinds; ++k) bad_counts[size_t(k)] += c.bad_counts[size_t(k)];
    for (BadRow& b : c.bad)
      if (bad_rows.size() < kKeptBadRows) bad_rows.emplace_back(b.line, std::move(b.message));
    records += c.records;
    below_min_rating += c.below_min_rating;
    committed->push_back(std::move(c));
    c = Chunk();
  }
};

// Interns the ids of the committed chunks' rows (each thread owns the shards
// s with s % threads == its index) into log->in's entries from `base` on.
void intern_rows(const std::vector<Chunk>& committed, uint64_t base, int threads,
                 const std::string& file, CsvLog* log) {
  const bool timed = log->timed();
  Interactions& in = log->in;
  parallel_for(threads, threads, 1, [&](int64_t t0_, int64_t t1_) {
    for (int64_t t = t0_; t < t1_; ++t) {
      InternBatch batch;
      uint64_t k = base;
      for (const Chunk& c : committed)
        for (const Row& r : c.rows) {
          const uint32_t su = uint32_t(r.user_hash >> (64 - kShardBits));
          if (su % uint32_t(threads) == uint32_t(t))
            batch.add(&log->users, su, {r.user, r.user_size}, r.user_hash, &in.user[k]);
          const uint32_t si = uint32_t(r.item_hash >> (64 - kShardBits));
          if (si % uint32_t(threads) == uint32_t(t))
            batch.add(&log->items, si, {r.item, r.item_size}, r.item_hash, &in.item[k]);
          if (timed && t == 0) in.time[k] = r.time;
          ++k;
        }
      batch.flush();
    }
  });
  for (uint32_t s = 0; s < kShards; ++s)
    if (log->users.shards[s].strings.size() >= kMaxPerShard ||
        log->items.shards[s].strings.size() >= kMaxPerShard)
      NCF_FAIL(file, ": more distinct ids than this reader handles (about 2^32)");
}

// Parses the file block by block (chunks of each block on the pool, committed
// in file order) and interns each block's rows before reading on.
CsvLog read_log(BlockReader& reader, const std::array<ColumnSpec, kRoles>& cols,
                const CsvOptions& csv, const CsvSyntax& syntax, int threads,
                const std::string& file) {
  CsvLog log;
  std::vector<char> buf;
  bool eof = reader.append_next(&buf) == 0;
  const size_t start =
      static_cast<size_t>(skip_bom(buf.data(), buf.data() + buf.size()) - buf.data());
  const FirstRows first = first_rows(reader, &buf, start, &eof, syntax, 2, file);
  log.layout = resolve_layout(cols, first, csv.header, file, &log.has_header);
  const bool timed = log.timed();
  const RowParser parser(log.layout, csv, syntax.max_record_bytes);

  size_t pos = log.has_header ? first.after_first : start;
  uint64_t line = log.has_header ? first.after_first_line : 1;
  Interactions& in = log.in;
  std::vector<Chunk> slots(static_cast<size_t>(threads));
  std::vector<Chunk> committed;
  bool reserved = false;
  for (;;) {
    auto t0 = Clock::now();
    const size_t round_start = pos;
    committed.clear();
    const CsvBlockResult res = scan_csv_block(
        buf.data(), pos, buf.size(), eof, line, syntax, threads,
        [&](int slot, CsvScanner& sc) { parser.scan(sc, &slots[size_t(slot)]); },
        [&](int slot, uint64_t first_line) {
          log.commit(slots[size_t(slot)], first_line, csv, file, &committed);
        });
    if (res.too_long)
      NCF_FAIL(file, ":", line + res.lines, ": a row longer than ", syntax.max_record_bytes,
               " bytes (--csv_max_row_bytes): not an interaction file with these --separator and "
               "quoting rules");
    log.parse_s += seconds_since(t0);

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
    intern_rows(committed, base, threads, file, &log);
    log.intern_s += seconds_since(t0);

    line += res.lines;
    buf.erase(buf.begin(), buf.begin() + ptrdiff_t(res.consumed));
    pos = 0;
    if (eof) break;
    if (reader.append_next(&buf) == 0) eof = true;
  }
  return log;
}

// The progress line of the read and the report of skipped bad rows; refuses a
// log without interactions.
void report_read(const CsvLog& log, const BlockReader& reader, const std::string& file,
                 const PrepOptions& opt, const PrepProgress& progress) {
  const uint64_t bad_total = log.bad_total();
  if (opt.progress) {
    std::fprintf(stderr,
                 "prep: read %llu rows (%.1f MB%s) from %s in %.1f s: parse %.1f s, intern %.1f "
                 "s; %llu user ids, %llu item ids\n",
                 static_cast<unsigned long long>(log.records), double(reader.content_bytes()) / 1e6,
                 reader.gzip() ? " inflated" : "", file.c_str(), progress.seconds(), log.parse_s,
                 log.intern_s, static_cast<unsigned long long>(log.users.size()),
                 static_cast<unsigned long long>(log.items.size()));
  }
  if (bad_total > 0) {
    std::string by_kind, lines;
    for (int k = 0; k < kBadKinds; ++k)
      if (log.bad_counts[size_t(k)])
        by_kind +=
            detail::concat(by_kind.empty() ? "" : ", ", kBadKey[k], " ", log.bad_counts[size_t(k)]);
    for (const auto& b : log.bad_rows) lines += detail::concat(lines.empty() ? "" : ", ", b.first);
    std::fprintf(stderr, "ncf_prep: skipped %llu bad rows of %s (%s); first at lines %s%s\n",
                 static_cast<unsigned long long>(bad_total), file.c_str(), by_kind.c_str(),
                 lines.c_str(), bad_total > log.bad_rows.size() ? ", ..." : "");
    for (size_t k = 0; k < std::min<size_t>(3, log.bad_rows.size()); ++k)
      std::fprintf(stderr, "ncf_prep:   %s:%llu: %s\n", file.c_str(),
                   static_cast<unsigned long long>(log.bad_rows[k].first),
                   log.bad_rows[k].second.c_str());
  }
  if (log.in.user.empty())
    NCF_FAIL(file, ": no interactions: ", log.records, " rows, ", bad_total, " bad, ",
             log.below_min_rating, " rated below --min_rating");
}

// Renumbers the rows' keys in ascending byte order of the id strings; the
// ranks' `order` stays (key of each rank), `rank_of` is freed.
void rank_keys(int threads, CsvLog* log, RankedIds* user_rank, RankedIds* item_rank) {
  Interactions& in = log->in;
  *user_rank = rank_ids(log->users, threads);
  *item_rank = rank_ids(log->items, threads);
  in.num_user_keys = user_rank->order.size();
  in.num_item_keys = item_rank->order.size();
  parallel_ranges(threads, in.user.size(), [&](uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      in.user[k] = user_rank->rank_of[in.user[k]];
      in.item[k] = item_rank->rank_of[in.item[k]];
    }
  });
  std::vector<uint32_t>().swap(user_rank->rank_of);
  std::vector<uint32_t>().swap(item_rank->rank_of);
}

// metadata.json's generator: no path and nothing about compression, so the
// same rows give the same dataset from a .gz file and from its plain twin.
nlohmann::json generator_of(const CsvLog& log, const BlockReader& reader, const CsvOptions& csv,
                            const PrepOptions& opt, const std::string& file) {
  nlohmann::json columns = nlohmann::json::object();
  for (int r = 0; r < kRoles; ++r)
    if (log.layout.col[size_t(r)] >= 0) columns[kRoleName[r]] = log.layout.col[size_t(r)];
  return {{"format", "csv"},
          {"input", input_name(file)},
          {"input_bytes", reader.content_bytes()},
          {"input_crc32c", reader.content_crc32c()},
          {"columns", columns},
          {"separator", std::string(1, csv.separator)},
          {"header", log.has_header},
          {"time", log.timed() ? "timestamp column" : "file order"},
          {"rows", log.records},
          {"interactions", log.in.user.size()},
          {"min_interactions", opt.min_interactions}};
}

// --extend: the log, its ids as strings by rank, goes to extend.h.
DatasetMeta extend_with_log(CsvLog log, const RankedIds& user_rank, const RankedIds& item_rank,
                            const nlohmann::json& generator, const CsvOptions& csv,
                            const PrepOptions& opt, const std::string& out_dir,
                            const std::string& file) {
  const uint64_t bad_total = log.bad_total();
  KeyedLog keyed;
  keyed.strings = true;
  for (uint64_t k = 0; k < log.in.num_user_keys; ++k)
    keyed.user_strings.push_back(log.users.string_of(user_rank.order[k]));
  for (uint64_t k = 0; k < log.in.num_item_keys; ++k)
    keyed.item_strings.push_back(log.items.string_of(item_rank.order[k]));
  log.users = InternTable();
  log.items = InternTable();
  keyed.in = std::move(log.in);
  DatasetPlan plan = plan_of_options("csv:" + input_name(file), opt);
  plan.generator = generator;
  plan.generator["max_users"] = opt.extend.max_users;
  plan.generator["max_items"] = opt.extend.max_items;
  if (csv.min_rating) plan.generator["min_rating"] = *csv.min_rating;
  if (csv.skip_bad_rows) plan.generator["bad_rows"] = bad_total;
  return extend_dataset(std::move(keyed), plan, opt, out_dir, file);
}

// The counts of the grouping, the --min_rating rows and the bad rows, added
// to the generator of a dataset from scratch.
void add_scratch_counts(const HeldOutUsers& d, const CsvLog& log, const CsvOptions& csv,
                        nlohmann::json* generator) {
  nlohmann::json& g = *generator;
  g["duplicates_removed"] = d.duplicates;
  g["raw_users"] = d.raw_users;
  if (csv.min_rating) {
    g["min_rating"] = *csv.min_rating;
    g["below_min_rating"] = log.below_min_rating;
  }
  if (csv.skip_bad_rows) {
    nlohmann::json counts = nlohmann::json::object();
    for (int k = 0; k < kBadKinds; ++k) counts[kBadKey[k]] = log.bad_counts[size_t(k)];
    nlohmann::json lines = nlohmann::json::array();
    for (const auto& b : log.bad_rows) lines.push_back(b.first);
    g["bad_rows"] = log.bad_total();
    g["bad_rows_by_reason"] = counts;
    g["first_bad_lines"] = lines;
  }
}

// A dataset from scratch: interactions.h's remap and split (shared with
// MovieLens), then prep_stages.h's eval negatives and writer.
DatasetMeta write_from_scratch(CsvLog log, const RankedIds& user_rank, const RankedIds& item_rank,
                               double rank_s, const nlohmann::json& generator,
                               const CsvOptions& csv, const PrepOptions& opt,
                               const std::string& out_dir, const std::string& file, int threads,
                               const PrepProgress& progress) {
  const auto t0 = Clock::now();
  const HeldOutUsers d = hold_out_latest(std::move(log.in), opt.min_interactions, threads, file);
  const uint64_t U = d.num_users(), I = d.num_items();
  StringList user_ids, item_ids;
  user_ids.offsets.reserve(U + 1);
  item_ids.offsets.reserve(I + 1);
  for (uint64_t u = 0; u < U; ++u)
    user_ids.push_back(log.users.string_of(user_rank.order[d.user_key[u]]));
  for (uint64_t i = 0; i < I; ++i)
    item_ids.push_back(log.items.string_of(item_rank.order[d.item_key[i]]));
  log.users = InternTable();
  log.items = InternTable();
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
  add_scratch_counts(d, log, csv, &plan.generator);
  EvalNegatives negatives{I, opt.eval_negatives, opt.seed, nullptr, [&](uint64_t u) {
                            const std::string_view id = user_ids[u];
                            return detail::concat(file, ": user \"",
                                                  excerpt(id.data(), id.data() + id.size()), "\"");
                          }};
  return assemble_dataset(out_dir, plan, leave_one_out(d), negatives, threads, progress);
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
  const CsvSyntax syntax = syntax_of(csv);

  BlockReader reader(file, csv.block_bytes);
  CsvLog log = read_log(reader, cols, csv, syntax, threads, file);
  report_read(log, reader, file, opt, progress);

  const auto t0 = Clock::now();
  RankedIds user_rank, item_rank;
  rank_keys(threads, &log, &user_rank, &item_rank);
  const double rank_s = seconds_since(t0);

  const nlohmann::json generator = generator_of(log, reader, csv, opt, file);
  if (!opt.extend.prev.empty())
    return extend_with_log(std::move(log), user_rank, item_rank, generator, csv, opt, out_dir,
                           file);
  return write_from_scratch(std::move(log), user_rank, item_rank, rank_s, generator, csv, opt,
                            out_dir, file, threads, progress);
}

}  // namespace ncf
