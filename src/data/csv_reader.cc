// The RFC 4180 tokenizer and the checked parallel chunking: see csv_reader.h.
#include "data/csv_reader.h"

#include <algorithm>
#include <cstring>

#include "common/parallel.h"

namespace ncf {

std::string_view csv_value(const CsvField& f, std::string* scratch) {
  if (!f.doubled) return std::string_view(f.data, f.size);
  scratch->clear();
  for (uint32_t k = 0; k < f.size; ++k) {
    scratch->push_back(f.data[k]);
    if (f.data[k] == '"') ++k;  // the second quote of a pair
  }
  return *scratch;
}

CsvScanner::CsvScanner(const char* begin, const char* stop, const char* end, bool at_eof,
                       const CsvSyntax& syntax)
    : pos_(begin), stop_(stop), end_(end), at_eof_(at_eof), syntax_(syntax) {
  special_[static_cast<unsigned char>(syntax.separator)] = true;
  special_[static_cast<unsigned char>('\n')] = true;
  special_[static_cast<unsigned char>('"')] = true;
}

bool CsvScanner::next(CsvRecord* r) {
  if (status_ != Status::kMore) return false;
  if (pos_ >= stop_ || pos_ >= end_) {
    status_ = Status::kDone;
    return false;
  }
  const char* next = nullptr;
  switch (parse(r, &next)) {
    case Step::kNeedMore:
      status_ = Status::kNeedMore;
      return false;
    case Step::kTooLong:
      status_ = Status::kTooLong;
      return false;
    case Step::kRecord:
      break;
  }
  r->line = lines_;
  lines_ += static_cast<uint64_t>(std::count(pos_, next, '\n'));
  pos_ = next;
  return true;
}

// One record from pos_. Everything is decided inside the window [pos_, pos_ +
// max_record_bytes) (or up to the end of the input), never by where the buffer
// happens to end, so the outcome does not depend on block or chunk boundaries.
CsvScanner::Step CsvScanner::parse(CsvRecord* r, const char** next) {
  const char* const p = pos_;
  const char sep = syntax_.separator;
  const bool window_cut = static_cast<size_t>(end_ - p) < syntax_.max_record_bytes;
  const char* const w = window_cut ? end_ : p + syntax_.max_record_bytes;
  const bool input_ends = window_cut && at_eof_;  // w is the end of the input
  fields_.clear();
  r->begin = p;
  r->problem = CsvProblem::kNone;
  r->problem_field = 0;

  // Nothing ends the record inside the window.
  auto unended = [&]() { return window_cut && !at_eof_ ? Step::kNeedMore : Step::kTooLong; };
  auto finish = [&](const char* rec_end, const char* after) {
    r->end = rec_end;
    r->fields = fields_.data();
    r->num_fields = fields_.size();
    *next = after;
    return Step::kRecord;
  };
  // A bad record ends at the end of the line that holds `from`.
  auto resync = [&](const char* from, CsvProblem what, size_t field) {
    const void* nl = std::memchr(from, '\n', static_cast<size_t>(w - from));
    const char* line_end = nl ? static_cast<const char*>(nl) : w;
    if (!nl && !input_ends) return unended();
    r->end = (line_end > p && line_end[-1] == '\r') ? line_end - 1 : line_end;
    r->fields = nullptr;
    r->num_fields = 0;
    r->problem = what;
    r->problem_field = field;
    *next = nl ? line_end + 1 : line_end;
    return Step::kRecord;
  };

  const char* q = p;
  for (;;) {
    const size_t field = fields_.size();
    if (q < w && *q == '"') {
      const char* const open = q;
      const char* c = q + 1;
      const char* close = nullptr;
      bool doubled = false;
      for (;;) {
        const void* hit = std::memchr(c, '"', static_cast<size_t>(w - c));
        if (!hit) break;
        const char* x = static_cast<const char*>(hit);
        if (x + 1 < w && x[1] == '"') {
          doubled = true;
          c = x + 2;
          continue;
        }
        // A quote at the window's end could be the first of a pair.
        if (x + 1 == w && !input_ends) break;
        close = x;
        break;
      }
      if (!close) {
        if (window_cut && !at_eof_) return Step::kNeedMore;
        return resync(open, CsvProblem::kUnterminatedQuote, field);
      }
      fields_.push_back({open + 1, static_cast<uint32_t>(close - open - 1), true, doubled});
      q = close + 1;
      if (q == w) return input_ends ? finish(q, q) : unended();
      if (*q == sep) {
        ++q;
        continue;
      }
      if (*q == '\n') return finish(q, q + 1);
      if (*q == '\r') {
        if (q + 1 < w && q[1] == '\n') return finish(q, q + 2);
        if (q + 1 == w) return input_ends ? finish(q, w) : unended();
      }
      return resync(q, CsvProblem::kStrayQuote, field);
    }
    const char* x = q;
    while (x < w && !special_[static_cast<unsigned char>(*x)]) ++x;
    if (x == w) {
      if (!input_ends) return unended();
      const char* fe = (x > q && x[-1] == '\r') ? x - 1 : x;
      fields_.push_back({q, static_cast<uint32_t>(fe - q), false, false});
      return finish(fe, x);
    }
    if (*x == '"') return resync(x, CsvProblem::kStrayQuote, field);
    if (*x == sep) {
      fields_.push_back({q, static_cast<uint32_t>(x - q), false, false});
      q = x + 1;
      continue;
    }
    const char* fe = (x > q && x[-1] == '\r') ? x - 1 : x;  // '\n', CRLF
    fields_.push_back({q, static_cast<uint32_t>(fe - q), false, false});
    return finish(fe, x + 1);
  }
}

namespace {

// Where the chunks of buf[pos, n) start: pos, then after the first line break
// outside quotes past each even cut, the quote state at a cut coming from the
// parity of the quotes before it.
std::vector<size_t> plan_chunks(const char* buf, size_t pos, size_t n, const CsvSyntax& syntax,
                                int threads) {
  const size_t len = n - pos;
  const size_t per = std::max<size_t>(syntax.min_chunk_bytes, 1);
  const int m = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, len / per)));
  std::vector<size_t> starts{pos};
  if (m == 1) return starts;
  std::vector<size_t> cut(static_cast<size_t>(m) + 1);
  for (int j = 0; j <= m; ++j) cut[size_t(j)] = pos + len * size_t(j) / size_t(m);
  std::vector<uint64_t> quotes(static_cast<size_t>(m), 0);
  parallel_for(m, m, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      quotes[size_t(j)] =
          static_cast<uint64_t>(std::count(buf + cut[size_t(j)], buf + cut[size_t(j) + 1], '"'));
  });
  bool inside = false;
  for (int j = 1; j < m; ++j) {
    inside ^= (quotes[size_t(j) - 1] & 1) != 0;
    bool in = inside;
    size_t x = cut[size_t(j)];
    for (; x < n; ++x) {
      if (buf[x] == '"') {
        in = !in;
      } else if (buf[x] == '\n' && !in) {
        break;
      }
    }
    if (x + 1 >= n) break;
    if (x + 1 > starts.back()) starts.push_back(x + 1);
  }
  return starts;
}

}  // namespace

CsvBlockResult scan_csv_block(const char* buf, size_t start, size_t n, bool at_eof,
                              uint64_t first_line, const CsvSyntax& syntax, int threads,
                              const std::function<void(int, CsvScanner&)>& scan,
                              const std::function<void(int, uint64_t)>& commit) {
  CsvBlockResult res;
  res.consumed = start;
  size_t pos = start;
  uint64_t line = first_line;
  struct ChunkEnd {
    size_t pos = 0;
    uint64_t lines = 0;
    CsvScanner::Status status = CsvScanner::Status::kDone;
  };
  while (pos < n) {
    const std::vector<size_t> starts = plan_chunks(buf, pos, n, syntax, threads);
    const int m = static_cast<int>(starts.size());
    std::vector<ChunkEnd> ends(static_cast<size_t>(m));
    parallel_for(m, m, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const size_t stop = k + 1 < m ? starts[size_t(k) + 1] : n;
        CsvScanner sc(buf + starts[size_t(k)], buf + stop, buf + n, at_eof, syntax);
        scan(static_cast<int>(k), sc);
        ends[size_t(k)] = {static_cast<size_t>(sc.pos() - buf), sc.lines(), sc.status()};
      }
    });
    bool replan = false;
    for (int k = 0; k < m; ++k) {
      const ChunkEnd& e = ends[size_t(k)];
      commit(k, line);
      line += e.lines;
      pos = e.pos;
      res.consumed = pos;
      res.lines = line - first_line;
      if (e.status == CsvScanner::Status::kTooLong) {
        res.too_long = true;
        return res;
      }
      if (e.status == CsvScanner::Status::kNeedMore) return res;
      if (k + 1 < m && pos != starts[size_t(k) + 1]) {
        replan = true;  // the next chunk's start was a guess that did not hold
        break;
      }
    }
    if (!replan) return res;
  }
  return res;
}

std::vector<CsvTextRecord> parse_csv_text(const std::string& text, char separator) {
  CsvSyntax syntax;
  syntax.separator = separator;
  syntax.max_record_bytes = text.size() + 1;
  const char* b = text.data();
  if (text.size() >= 3 && std::memcmp(b, "\xEF\xBB\xBF", 3) == 0) b += 3;
  CsvScanner sc(b, text.data() + text.size(), text.data() + text.size(), true, syntax);
  std::vector<CsvTextRecord> out;
  CsvRecord r;
  std::string scratch;
  while (sc.next(&r)) {
    CsvTextRecord t;
    t.line = r.line + 1;
    t.problem = r.problem;
    t.text.assign(r.begin, r.end);
    for (size_t k = 0; k < r.num_fields; ++k)
      t.fields.emplace_back(csv_value(r.fields[k], &scratch));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace ncf
