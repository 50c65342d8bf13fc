// The text helpers and the delimited rating-line reader: see text_input.h.
//
// Parsing is the slow part on ml-25m (25M lines, ~650 MB): files are mmapped,
// split at line boundaries over threads, and fields are cut by hand and read
// with std::from_chars. Line numbers come from a newline count per chunk taken
// before parsing, so an error names the exact 1-based line whatever the split.
#include "data/text_input.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/check.h"
#include "common/parallel.h"

namespace ncf {
namespace {

constexpr size_t kExcerptChars = 80;  // offending text shown in messages
constexpr size_t kBytesPerParseThread = 8 << 20;
constexpr double kMaxRating = 5.0;

}  // namespace

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string excerpt(const char* b, const char* e) {
  std::string s;
  for (const char* p = b; p < e && s.size() < kExcerptChars; ++p) {
    unsigned char c = static_cast<unsigned char>(*p);
    if (c == '\t') {
      s += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    } else {
      s += static_cast<char>(c);
    }
  }
  if (static_cast<size_t>(e - b) > kExcerptChars) s += "...";
  return s;
}

const char* trim_right(const char* b, const char* e) {
  while (e > b && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) --e;
  return e;
}

const char* skip_bom(const char* b, const char* e) {
  if (e - b >= 3 && std::memcmp(b, "\xEF\xBB\xBF", 3) == 0) return b + 3;
  return b;
}

std::string basename_of(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return std::filesystem::path(s).filename().string();
}

// ------------------------------------------------------------ mapped file ---

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    NCF_FAIL("cannot open ", path, ": ", std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    NCF_FAIL("cannot stat ", path, ": ", std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    NCF_FAIL("cannot read ", path, ": is a directory");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    NCF_FAIL(path, ": empty file");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) NCF_FAIL("cannot map ", path, ": ", std::strerror(err));
  ::madvise(p, size_, MADV_SEQUENTIAL);
  data_ = static_cast<const char*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

// --------------------------------------------------------- line splitting ---

std::vector<LineChunk> split_lines(const char* b, const char* e, uint64_t first_line, int parts) {
  std::vector<LineChunk> chunks;
  const size_t n = static_cast<size_t>(e - b);
  parts = std::max(1, std::min<int>(parts, static_cast<int>(n / kBytesPerParseThread) + 1));
  const char* at = b;
  for (int p = 1; p <= parts && at < e; ++p) {
    const char* cut = (p == parts) ? e : b + n * p / parts;
    if (cut < at) cut = at;
    if (cut < e) {
      const void* nl = std::memchr(cut, '\n', static_cast<size_t>(e - cut));
      cut = nl ? static_cast<const char*>(nl) + 1 : e;
    }
    if (cut > at) chunks.push_back({at, cut, 0, 0});
    at = cut;
  }
  parallel_for(int(chunks.size()), int64_t(chunks.size()), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      LineChunk& c = chunks[size_t(k)];
      c.lines = static_cast<uint64_t>(std::count(c.b, c.e, '\n'));
      if (c.e > c.b && c.e[-1] != '\n') ++c.lines;  // last line without a newline
    }
  });
  uint64_t line = first_line;
  for (auto& c : chunks) {
    c.first_line = line;
    line += c.lines;
  }
  return chunks;
}

[[noreturn]] void throw_line_failure(const std::string& file, const LineFailure& f) {
  NCF_FAIL(file, ":", f.line, ": malformed line: ", f.reason, ": \"", f.text, "\"");
}

// --------------------------------------------------------- field parsing ---

RatingSyntax syntax_of(InputFormat f) {
  switch (f) {
    case InputFormat::kMl100k:
    case InputFormat::kNcfPaper:
      return {"\t", 1, "TAB", false};
    case InputFormat::kMlDat:
      return {"::", 2, "'::'", false};
    case InputFormat::kMlCsv:
      return {",", 1, "','", true};
    default:
      break;
  }
  NCF_FAIL("no line syntax for format ", format_name(f));
}

namespace {

const char* find_sep(const char* p, const char* e, const RatingSyntax& s) {
  for (;;) {
    const void* q = std::memchr(p, s.sep[0], static_cast<size_t>(e - p));
    if (!q) return e;
    const char* c = static_cast<const char*>(q);
    if (s.sep_len == 1) return c;
    if (e - c >= static_cast<ptrdiff_t>(s.sep_len) && std::memcmp(c, s.sep, s.sep_len) == 0)
      return c;
    p = c + 1;
  }
}

}  // namespace

bool field_int(const char* b, const char* e, const char* name, bool allow_negative, int64_t* v,
               std::string* why) {
  if (b == e) {
    *why = detail::concat("empty ", name, " field");
    return false;
  }
  auto [q, ec] = std::from_chars(b, e, *v);
  if (ec == std::errc::result_out_of_range) {
    *why = detail::concat(name, " \"", excerpt(b, e), "\" is out of range");
    return false;
  }
  if (ec != std::errc() || q != e) {
    *why = detail::concat(name, " \"", excerpt(b, e), "\" is not an integer");
    return false;
  }
  if (!allow_negative && *v < 0) {
    *why = detail::concat("negative ", name, " ", *v);
    return false;
  }
  return true;
}

namespace {

bool field_rating(const char* b, const char* e, double* v, std::string* why) {
  if (b == e) {
    *why = "empty rating field";
    return false;
  }
  auto [q, ec] = std::from_chars(b, e, *v);
  if (ec != std::errc() || q != e) {
    *why = detail::concat("rating \"", excerpt(b, e), "\" is not a number");
    return false;
  }
  if (!(*v >= 0.0 && *v <= kMaxRating)) {  // NaN fails too
    *why = detail::concat("rating ", excerpt(b, e), " outside [0, 5]");
    return false;
  }
  return true;
}

// user SEP item SEP rating SEP timestamp, [b, e) already trimmed.
bool parse_rating_line(const char* b, const char* e, const RatingSyntax& s, Rating* r,
                       std::string* why) {
  const char* fb[4];
  const char* fe[4];
  const char* p = b;
  for (int k = 0; k < 3; ++k) {
    const char* q = find_sep(p, e, s);
    if (q == e) {
      *why = detail::concat("expected 4 fields separated by ", s.sep_desc, ", found ", k + 1);
      return false;
    }
    fb[k] = p;
    fe[k] = q;
    p = q + s.sep_len;
  }
  fb[3] = p;
  fe[3] = e;
  if (find_sep(p, e, s) != e) {
    *why = detail::concat("more than 4 fields separated by ", s.sep_desc);
    return false;
  }
  double rating;
  return field_int(fb[0], fe[0], "user id", false, &r->user, why) &&
         field_int(fb[1], fe[1], "item id", false, &r->item, why) &&
         field_rating(fb[2], fe[2], &rating, why) &&
         field_int(fb[3], fe[3], "timestamp", false, &r->timestamp, why);
}

// Parses the whole lines of one chunk into out[0..); returns how many ratings.
size_t parse_rating_chunk(const LineChunk& c, const RatingSyntax& s, Rating* out,
                          LineFailure* fail) {
  size_t n = 0;
  uint64_t line = c.first_line;
  const char* b = c.b;
  std::string why;
  while (b < c.e) {
    const void* nl = std::memchr(b, '\n', static_cast<size_t>(c.e - b));
    const char* le = nl ? static_cast<const char*>(nl) : c.e;
    const char* te = trim_right(b, le);
    if (te > b) {
      if (!parse_rating_line(b, te, s, &out[n], &why)) {
        *fail = {true, line, why, excerpt(b, te)};
        return n;
      }
      out[n++].line = line;
    }
    ++line;
    b = nl ? le + 1 : c.e;
  }
  return n;
}

}  // namespace

std::vector<Rating> parse_ratings(const std::string& file, const RatingSyntax& s, int threads) {
  MappedFile m(file);
  const char* b = skip_bom(m.begin(), m.end());
  const char* e = m.end();
  uint64_t first_line = 1;
  {
    // A CSV header may open the file; any other text in its place is reported
    // as line 1 rather than as a bad user id.
    const void* nl = std::memchr(b, '\n', static_cast<size_t>(e - b));
    const char* le = nl ? static_cast<const char*>(nl) : e;
    const char* te = trim_right(b, le);
    const bool letter =
        te > b && ((*b >= 'A' && *b <= 'Z') || (*b >= 'a' && *b <= 'z') || *b == '"');
    if (s.header && letter) {
      if (std::string(b, te) != kMlCsvHeader) {
        LineFailure f{true, 1, detail::concat("expected the header ", kMlCsvHeader),
                      excerpt(b, te)};
        throw_line_failure(file, f);
      }
      b = nl ? le + 1 : e;
      first_line = 2;
    }
  }
  std::vector<LineChunk> chunks = split_lines(b, e, first_line, threads);
  uint64_t total_lines = 0;
  for (const auto& c : chunks) total_lines += c.lines;

  // One slot per line; each chunk fills from its first line's slot, blank lines
  // leave gaps that are closed afterwards.
  std::vector<Rating> out(total_lines);
  std::vector<size_t> got(chunks.size(), 0);
  std::vector<LineFailure> fails(chunks.size());
  parallel_for(int(chunks.size()), int64_t(chunks.size()), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      got[k] = parse_rating_chunk(chunks[k], s, out.data() + (chunks[k].first_line - first_line),
                                  &fails[k]);
  });
  for (const auto& f : fails)
    if (f.failed) throw_line_failure(file, f);
  size_t n = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const size_t at = chunks[k].first_line - first_line;
    if (at != n) std::copy(out.begin() + at, out.begin() + at + got[k], out.begin() + n);
    n += got[k];
  }
  out.resize(n);
  if (out.empty()) NCF_FAIL(file, ": empty file (no ratings, only blank lines or a header)");
  return out;
}

}  // namespace ncf
