// Raw inputs for ncf_prep: format detection, the line parsers for MovieLens
// (u.data, ratings.dat, ratings.csv) and the NCF paper's files, and the parse,
// remap and split stages of each; prep_stages.h's shared stages draw the eval
// negatives and write the dataset.
//
// Parsing is the slow part on ml-25m (25M lines, ~650 MB): files are mmapped,
// split at line boundaries over threads, and fields are cut by hand and read
// with std::from_chars. Line numbers come from a newline count per chunk taken
// before parsing, so an error names the exact 1-based line whatever the split.
#include "data/sources.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/check.h"
#include "common/parallel.h"
#include "data/prep_stages.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kExcerptChars = 80;      // offending text shown in messages
constexpr size_t kSniffBytes = 64 << 10;  // what detect_format reads of a file
constexpr size_t kBytesPerParseThread = 8 << 20;
constexpr double kMaxRating = 5.0;
constexpr const char* kCsvHeader = "userId,movieId,rating,timestamp";
constexpr const char* kNcfTrain = ".train.rating";
constexpr const char* kNcfTest = ".test.rating";
constexpr const char* kNcfNegative = ".test.negative";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Printable, bounded copy of a piece of a line: separators stay visible.
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

// Line end without '\r' and trailing blanks (CRLF files, stray trailing tabs).
const char* trim_right(const char* b, const char* e) {
  while (e > b && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) --e;
  return e;
}

const char* skip_bom(const char* b, const char* e) {
  if (e - b >= 3 && std::memcmp(b, "\xEF\xBB\xBF", 3) == 0) return b + 3;
  return b;
}

// ------------------------------------------------------------ mapped file ---

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
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
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* begin() const { return data_; }
  const char* end() const { return data_ + size_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// --------------------------------------------------------- line splitting ---

struct LineChunk {
  const char* b;
  const char* e;
  uint64_t first_line;  // 1-based number of the chunk's first line
  uint64_t lines;       // lines that start in the chunk
};

// Splits [b, e) into about `parts` chunks of whole lines and numbers them.
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

// First failure of a chunk; the earliest chunk's is the one reported.
struct LineFailure {
  bool failed = false;
  uint64_t line = 0;
  std::string reason;
  std::string text;
};

[[noreturn]] void throw_line_failure(const std::string& file, const LineFailure& f) {
  NCF_FAIL(file, ":", f.line, ": malformed line: ", f.reason, ": \"", f.text, "\"");
}

// --------------------------------------------------------- field parsing ---

struct RatingSyntax {
  const char* sep;  // "\t", "::" or ","
  size_t sep_len;
  const char* sep_desc;  // for messages
  bool header;           // a CSV header line may come first
};

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

// Whole field [b, e) as an integer; false with *why set otherwise.
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
      if (std::string(b, te) != kCsvHeader) {
        LineFailure f{true, 1, detail::concat("expected the header ", kCsvHeader), excerpt(b, te)};
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

// ------------------------------------------------------------- detection ---

const char* format_description(InputFormat f) {
  switch (f) {
    case InputFormat::kMl100k:
      return "tab-separated user TAB item TAB rating TAB timestamp (u.data)";
    case InputFormat::kMlDat:
      return "'::'-separated user::item::rating::timestamp (ratings.dat)";
    case InputFormat::kMlCsv:
      return "comma-separated userId,movieId,rating,timestamp (ratings.csv)";
    case InputFormat::kNcfPaper:
      return "NCF-paper files NAME.train.rating, NAME.test.rating, NAME.test.negative";
    default:
      return "auto-detected";
  }
}

// First non-blank line of a file (BOM and '\r' removed), for sniffing.
std::string first_line_of(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    int err = errno;
    NCF_FAIL("cannot open ", path, ": ", std::strerror(err));
  }
  std::string buf(kSniffBytes, '\0');
  size_t n = std::fread(buf.data(), 1, buf.size(), f);
  bool read_error = std::ferror(f);
  std::fclose(f);
  if (read_error) NCF_FAIL("cannot read ", path);
  if (n == 0) NCF_FAIL(path, ": empty file");
  const char* b = skip_bom(buf.data(), buf.data() + n);
  const char* e = buf.data() + n;
  while (b < e) {
    const void* nl = std::memchr(b, '\n', static_cast<size_t>(e - b));
    const char* le = nl ? static_cast<const char*>(nl) : e;
    const char* te = trim_right(b, le);
    if (te > b) return std::string(b, te);
    b = nl ? le + 1 : e;
  }
  if (n < buf.size()) NCF_FAIL(path, ": empty file (only blank lines)");
  return std::string();
}

// What a line looks like: kAuto when it looks like none of the formats.
InputFormat classify_line(const std::string& line) {
  if (line.find("::") != std::string::npos) return InputFormat::kMlDat;
  if (line == kCsvHeader || line.find(',') != std::string::npos) return InputFormat::kMlCsv;
  if (line.find('\t') != std::string::npos) return InputFormat::kMl100k;
  return InputFormat::kAuto;
}

const char* looks_like(InputFormat f) {
  switch (f) {
    case InputFormat::kMl100k:
      return "tab-separated (u.data or NCF-paper .rating)";
    case InputFormat::kMlDat:
      return "'::'-separated (ratings.dat)";
    case InputFormat::kMlCsv:
      return "comma-separated (ratings.csv)";
    default:
      return "none of the known formats";
  }
}

bool is_movielens(InputFormat f) {
  return f == InputFormat::kMl100k || f == InputFormat::kMlDat || f == InputFormat::kMlCsv;
}

bool exists_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Checks the three NCF-paper files of `prefix` exist, are non-empty and that
// the train file is tab-separated.
void check_ncf_prefix(const std::string& prefix) {
  for (const char* suffix : {kNcfTrain, kNcfTest, kNcfNegative}) {
    std::string p = prefix + suffix;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) {
      int err = errno;
      NCF_FAIL("cannot open ", p, " (NCF-paper prefix ", prefix, "): ", std::strerror(err));
    }
    if (st.st_size == 0) NCF_FAIL(p, ": empty file");
  }
  std::string train = prefix + kNcfTrain;
  std::string line = first_line_of(train);
  if (classify_line(line) != InputFormat::kMl100k)
    NCF_FAIL(train, ": NCF-paper train file should be ", format_description(InputFormat::kMl100k),
             ", but the first line looks ", looks_like(classify_line(line)), ": \"",
             excerpt(line.data(), line.data() + line.size()), "\"");
}

std::string ncf_prefix_of(const std::string& file) {
  for (const char* suffix : {kNcfTrain, kNcfTest, kNcfNegative})
    if (ends_with(file, suffix)) return file.substr(0, file.size() - std::strlen(suffix));
  return std::string();
}

InputFormat detect_file(const std::string& path, InputFormat want, std::string* resolved) {
  const std::string prefix = ncf_prefix_of(path);
  if (!prefix.empty() && (want == InputFormat::kAuto || want == InputFormat::kNcfPaper)) {
    check_ncf_prefix(prefix);
    *resolved = prefix;
    return InputFormat::kNcfPaper;
  }
  if (want == InputFormat::kNcfPaper)
    NCF_FAIL(path, ": --format ncf-paper wants ", format_description(InputFormat::kNcfPaper),
             " (pass the prefix NAME or one of those files)");
  const std::string line = first_line_of(path);
  const InputFormat seen = classify_line(line);
  const std::string shown = excerpt(line.data(), line.data() + line.size());
  if (want != InputFormat::kAuto) {
    if (seen != want)
      NCF_FAIL(path, ": --format ", format_name(want), " expects ", format_description(want),
               ", but the first line looks ", looks_like(seen), ": \"", shown, "\"");
    *resolved = path;
    return want;
  }
  if (seen == InputFormat::kAuto)
    NCF_FAIL(path, ": unknown input format: the first line \"", shown,
             "\" is none of u.data (TAB), ratings.dat ('::'), ratings.csv (','), and the name is "
             "not NAME.train.rating");
  *resolved = path;
  return seen;
}

InputFormat detect_dir(const std::string& dir, InputFormat want, std::string* resolved) {
  struct Candidate {
    std::string path;
    InputFormat fmt;
  };
  std::vector<Candidate> found;
  const std::pair<const char*, InputFormat> known[] = {{"u.data", InputFormat::kMl100k},
                                                       {"ratings.dat", InputFormat::kMlDat},
                                                       {"ratings.csv", InputFormat::kMlCsv}};
  for (const auto& [name, fmt] : known) {
    std::string p = dir + "/" + name;
    if (exists_file(p)) found.push_back({p, fmt});
  }
  std::vector<std::string> prefixes;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (ends_with(name, kNcfTrain) && name.size() > std::strlen(kNcfTrain))
      prefixes.push_back(dir + "/" + name.substr(0, name.size() - std::strlen(kNcfTrain)));
  }
  if (ec) NCF_FAIL("cannot list ", dir, ": ", ec.message());
  std::sort(prefixes.begin(), prefixes.end());
  for (const auto& p : prefixes) found.push_back({p, InputFormat::kNcfPaper});

  if (want != InputFormat::kAuto) {
    found.erase(std::remove_if(found.begin(), found.end(),
                               [&](const Candidate& c) { return c.fmt != want; }),
                found.end());
    if (found.empty())
      NCF_FAIL(dir, ": --format ", format_name(want), " but the directory holds no ",
               want == InputFormat::kNcfPaper ? "NAME.train.rating"
               : want == InputFormat::kMl100k ? "u.data"
               : want == InputFormat::kMlDat  ? "ratings.dat"
                                              : "ratings.csv");
  }
  if (found.empty())
    NCF_FAIL(dir,
             ": unknown input format: the directory holds none of u.data, ratings.dat, "
             "ratings.csv, NAME.train.rating");
  if (found.size() > 1) {
    std::string names;
    for (const auto& c : found) names += (names.empty() ? "" : ", ") + c.path;
    NCF_FAIL(dir, ": several inputs in one directory (", names,
             "); pass the file or NCF-paper prefix itself",
             want == InputFormat::kAuto ? " or --format" : "");
  }
  if (found[0].fmt == InputFormat::kNcfPaper) {
    check_ncf_prefix(found[0].path);
    *resolved = found[0].path;
    return InputFormat::kNcfPaper;
  }
  return detect_file(found[0].path, want, resolved);
}

// ------------------------------------------------------------ id mapping ---

// Raw ids → dense 0-based ids in ascending raw order. A direct table when the
// raw range is small (MovieLens: ids up to a few 100k), a sorted list otherwise.
class DenseIds {
 public:
  // ids: every occurrence (repeats allowed), all >= 0.
  explicit DenseIds(std::vector<int64_t> ids) {
    if (ids.empty()) return;
    auto [mn, mx] = std::minmax_element(ids.begin(), ids.end());
    min_ = *mn;
    const uint64_t range = static_cast<uint64_t>(*mx - *mn) + 1;
    if (range <= std::max<uint64_t>(4 * ids.size(), 1u << 20) && range < (1ull << 31)) {
      table_.assign(range, -1);
      for (int64_t v : ids) table_[v - min_] = 0;
      int64_t next = 0;
      for (auto& t : table_)
        if (t == 0) t = static_cast<int32_t>(next++);
      size_ = next;
    } else {
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      sorted_ = std::move(ids);
      size_ = static_cast<int64_t>(sorted_.size());
    }
  }
  int64_t size() const { return size_; }
  // raw[d] for every dense id d: the ascending distinct inputs.
  std::vector<int64_t> raw_ids() const {
    if (table_.empty()) return sorted_;
    std::vector<int64_t> raw;
    raw.reserve(size_t(size_));
    for (size_t k = 0; k < table_.size(); ++k)
      if (table_[k] >= 0) raw.push_back(min_ + int64_t(k));
    return raw;
  }
  // Dense id of a raw id that was among the inputs.
  int64_t operator()(int64_t raw) const {
    if (!table_.empty()) return table_[raw - min_];
    return std::lower_bound(sorted_.begin(), sorted_.end(), raw) - sorted_.begin();
  }

 private:
  int64_t min_ = 0, size_ = 0;
  std::vector<int32_t> table_;
  std::vector<int64_t> sorted_;
};

std::string basename_of(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return fs::path(s).filename().string();
}

// Data set name for metadata "source": the folder name when it looks like a
// GroupLens release (ml-20m/ratings.csv), else the file name.
std::string movielens_name(const std::string& file) {
  std::string parent = basename_of(fs::path(file).parent_path().string());
  if (parent.rfind("ml-", 0) == 0) return parent;
  return basename_of(file);
}

}  // namespace

// ----------------------------------------------------------------- public ---

InputFormat parse_input_format(const std::string& name) {
  if (name == "auto") return InputFormat::kAuto;
  if (name == "ml-100k") return InputFormat::kMl100k;
  if (name == "ml-1m" || name == "ml-10m" || name == "ml-1m/ml-10m") return InputFormat::kMlDat;
  if (name == "ml-20m" || name == "ml-25m" || name == "ml-20m/ml-25m") return InputFormat::kMlCsv;
  if (name == "ncf-paper") return InputFormat::kNcfPaper;
  NCF_FAIL("unknown input format \"", name,
           "\" (expected auto, ml-100k, ml-1m, ml-10m, ml-20m, ml-25m or ncf-paper)");
}

const char* format_name(InputFormat f) {
  switch (f) {
    case InputFormat::kAuto:
      return "auto";
    case InputFormat::kMl100k:
      return "ml-100k";
    case InputFormat::kMlDat:
      return "ml-1m/ml-10m";
    case InputFormat::kMlCsv:
      return "ml-20m/ml-25m";
    case InputFormat::kNcfPaper:
      return "ncf-paper";
  }
  return "?";
}

InputFormat detect_format(const std::string& path, InputFormat want, std::string* resolved) {
  std::string dummy;
  if (!resolved) resolved = &dummy;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return detect_dir(path, want, resolved);
    return detect_file(path, want, resolved);
  }
  const int err = errno;
  // Not a file: maybe an NCF-paper prefix such as dir/ml-1m.
  if (exists_file(path + kNcfTrain)) {
    if (want != InputFormat::kAuto && want != InputFormat::kNcfPaper)
      NCF_FAIL(path, " is an NCF-paper prefix (", path, kNcfTrain, " exists), not --format ",
               format_name(want), " input");
    check_ncf_prefix(path);
    *resolved = path;
    return InputFormat::kNcfPaper;
  }
  NCF_FAIL("cannot open ", path, ": ", std::strerror(err));
}

std::vector<Rating> read_movielens(const std::string& file, InputFormat fmt) {
  if (fmt == InputFormat::kAuto) {
    std::string resolved;
    fmt = detect_format(file, fmt, &resolved);
    NCF_CHECK(is_movielens(fmt), file, " is not a MovieLens ratings file (", format_name(fmt), ")");
    return parse_ratings(resolved, syntax_of(fmt), resolve_threads(0));
  }
  NCF_CHECK(is_movielens(fmt), "read_movielens: not a MovieLens format: ", format_name(fmt));
  return parse_ratings(file, syntax_of(fmt), resolve_threads(0));
}

// ------------------------------------------------------------ MovieLens ---

namespace {

// Ratings grouped by user: dense users in ascending raw id, each user's raw
// items in file order, and the item of the user's latest rating.
struct UserGroups {
  uint64_t num_ratings = 0;
  std::vector<uint64_t> off;      // num_users + 1
  std::vector<int64_t> items;     // raw items, user by user
  std::vector<int64_t> raw_user;  // dense → raw user id
  std::vector<int64_t> latest;    // raw item of the latest rating
};

// A MovieLens file with dense ids: kept users 0 .. U-1, items 0 .. I-1 (both in
// ascending raw id), each user's distinct items (CSR, ascending) and latest item.
struct DenseRatings {
  uint64_t num_items = 0;
  uint64_t raw_users = 0, duplicates = 0, dropped = 0;
  std::vector<uint64_t> pos_off;  // U + 1
  std::vector<int32_t> pos;
  std::vector<int32_t> latest;    // U
  std::vector<int64_t> raw_user;  // U: the original id of each dense user, ascending
  std::vector<int64_t> raw_item;  // I: the same for items
  uint64_t num_users() const { return latest.size(); }
};

// Remap stage, users: a counting sort by user, stable so file order stays
// within a user; the latest rating is picked on the way, and iterating in file
// order with >= makes the later line win a timestamp tie.
UserGroups group_by_user(std::vector<Rating> ratings) {
  UserGroups g;
  const uint64_t n = ratings.size();
  g.num_ratings = n;
  std::vector<int64_t> raw_ids(n);
  for (uint64_t k = 0; k < n; ++k) raw_ids[k] = ratings[k].user;
  const DenseIds all_users(std::move(raw_ids));
  const uint64_t num_users = static_cast<uint64_t>(all_users.size());
  std::vector<uint32_t> user_of(n);
  g.off.assign(num_users + 1, 0);
  for (uint64_t k = 0; k < n; ++k) {
    user_of[k] = static_cast<uint32_t>(all_users(ratings[k].user));
    ++g.off[user_of[k] + 1];
  }
  for (uint64_t u = 0; u < num_users; ++u) g.off[u + 1] += g.off[u];
  g.items.resize(n);
  g.raw_user.resize(num_users);
  g.latest.resize(num_users);
  std::vector<int64_t> latest_ts(num_users, std::numeric_limits<int64_t>::min());
  std::vector<uint64_t> cursor(g.off.begin(), g.off.end() - 1);
  for (uint64_t k = 0; k < n; ++k) {
    const Rating& r = ratings[k];
    const uint32_t u = user_of[k];
    g.items[cursor[u]++] = r.item;
    g.raw_user[u] = r.user;
    if (r.timestamp >= latest_ts[u]) {
      latest_ts[u] = r.timestamp;
      g.latest[u] = r.item;
    }
  }
  return g;
}

// Remap stage, items: a repeated (user, item) counts once (the latest item is
// the latest rating overall, so also that item's latest), users with fewer than
// min_interactions distinct items are dropped, and the kept users' items become
// dense. The item map is monotone, so each sorted list stays sorted.
DenseRatings remap_ids(UserGroups g, uint32_t min_interactions, int threads,
                       const std::string& file) {
  DenseRatings d;
  const uint64_t raw_users = g.raw_user.size();
  d.raw_users = raw_users;
  std::vector<uint64_t> distinct(raw_users);
  parallel_ranges(threads, raw_users, [&](uint64_t b, uint64_t e) {
    for (uint64_t u = b; u < e; ++u) {
      auto first = g.items.begin() + g.off[u], last = g.items.begin() + g.off[u + 1];
      std::sort(first, last);
      distinct[u] = static_cast<uint64_t>(std::unique(first, last) - first);
    }
  });
  uint64_t kept = 0, nnz = 0;
  for (uint64_t u = 0; u < raw_users; ++u) {
    d.duplicates += (g.off[u + 1] - g.off[u]) - distinct[u];
    if (distinct[u] >= min_interactions) {
      ++kept;
      nnz += distinct[u];
    }
  }
  d.dropped = raw_users - kept;
  if (kept == 0)
    NCF_FAIL(file, ": no usable user: all ", raw_users, " users have fewer than ", min_interactions,
             " distinct rated items (one is held out for test, the rest train)");
  if (kept > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(file, ": ", kept, " users do not fit int32 ids");

  std::vector<int64_t> kept_items;
  kept_items.reserve(nnz);
  for (uint64_t u = 0; u < raw_users; ++u)
    if (distinct[u] >= min_interactions)
      kept_items.insert(kept_items.end(), g.items.begin() + g.off[u],
                        g.items.begin() + g.off[u] + distinct[u]);
  const DenseIds items(std::move(kept_items));
  d.num_items = static_cast<uint64_t>(items.size());
  d.raw_item = items.raw_ids();
  if (d.num_items > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(file, ": ", d.num_items, " items do not fit int32 ids");

  d.pos_off.assign(kept + 1, 0);
  std::vector<uint64_t> src_user(kept);  // kept → pre-drop dense user
  for (uint64_t u = 0, k = 0; u < raw_users; ++u)
    if (distinct[u] >= min_interactions) {
      src_user[k] = u;
      d.pos_off[k + 1] = d.pos_off[k] + distinct[u];
      ++k;
    }
  d.pos.resize(nnz);
  d.latest.resize(kept);
  d.raw_user.resize(kept);
  parallel_ranges(threads, kept, [&](uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t u = src_user[k];
      for (uint64_t j = 0; j < distinct[u]; ++j)
        d.pos[d.pos_off[k] + j] = static_cast<int32_t>(items(g.items[g.off[u] + j]));
      d.latest[k] = static_cast<int32_t>(items(g.latest[u]));
      d.raw_user[k] = g.raw_user[u];
    }
  });
  return d;
}

// Split stage: leave-one-out, each user's latest item held out, the rest train.
SplitUsers leave_one_out(const DenseRatings& d) {
  SplitUsers s;
  s.num_users = d.num_users();
  s.sizes = [&d](uint64_t u, uint64_t* np, uint64_t* nt) {
    *np = d.pos_off[u + 1] - d.pos_off[u];
    *nt = *np - 1;
  };
  s.split = [&d](UserBlock* b, uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = b->first_user + j;
      const int32_t* p = d.pos.data() + d.pos_off[u];
      const uint64_t np = d.pos_off[u + 1] - d.pos_off[u];
      std::copy(p, p + np, b->positives_of(j));
      int32_t* train = b->train_of(j);
      for (uint64_t q = 0; q < np; ++q)
        if (p[q] != d.latest[u]) *train++ = p[q];
      b->eval_of(j)[0] = d.latest[u];
    }
  };
  return s;
}

}  // namespace

DatasetMeta prepare_movielens(const std::string& path, InputFormat fmt, const std::string& out_dir,
                              const PrepOptions& opt) {
  const PrepProgress progress{opt.progress, "prep", Clock::now()};
  const int threads = resolve_threads(opt.threads);
  std::string file;
  const InputFormat f = detect_format(path, fmt, &file);
  if (f == InputFormat::kNcfPaper)
    NCF_FAIL(path, " holds NCF-paper files (", file, kNcfTrain, "): use --format ncf-paper");
  if (opt.min_interactions < 1)
    NCF_FAIL("min_interactions must be >= 1, got ", opt.min_interactions);

  std::vector<Rating> ratings = parse_ratings(file, syntax_of(f), threads);
  const uint64_t num_ratings = ratings.size();
  if (opt.progress)
    std::fprintf(stderr, "prep: read %llu ratings from %s in %.1f s\n",
                 static_cast<unsigned long long>(num_ratings), file.c_str(), progress.seconds());
  if (num_ratings >= (1ull << 32))
    NCF_FAIL(file, ": ", num_ratings, " ratings, more than this reader handles (2^32)");
  const DenseRatings d =
      remap_ids(group_by_user(std::move(ratings)), opt.min_interactions, threads, file);
  const uint64_t U = d.num_users(), I = d.num_items;
  if (opt.progress)
    std::fprintf(stderr,
                 "prep: %llu users (%llu dropped with < %u items), %llu items, %llu duplicate "
                 "ratings removed (%.1f s)\n",
                 static_cast<unsigned long long>(U), static_cast<unsigned long long>(d.dropped),
                 opt.min_interactions, static_cast<unsigned long long>(I),
                 static_cast<unsigned long long>(d.duplicates), progress.seconds());

  DatasetPlan plan;
  plan.source = "movielens:" + movielens_name(file);
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = d.pos.size() - U;
  plan.num_positives = d.pos.size();
  plan.eval_negatives = opt.eval_negatives;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = opt.seed;
  plan.dropped_users = d.dropped;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.raw_users = &d.raw_user;
  plan.raw_items = &d.raw_item;
  plan.generator = {{"input", file},
                    {"format", format_name(f)},
                    {"ratings", num_ratings},
                    {"duplicates_removed", d.duplicates},
                    {"raw_users", d.raw_users},
                    {"min_interactions", opt.min_interactions}};
  EvalNegatives negatives{I, opt.eval_negatives, opt.seed, nullptr, [&](uint64_t u) {
                            return detail::concat(file, ": raw user ", d.raw_user[u]);
                          }};
  return assemble_dataset(out_dir, plan, leave_one_out(d), negatives, threads, progress);
}

// ------------------------------------------------------------ NCF paper ---

namespace {

// PREFIX.test.negative: "(user,item)" then TAB-separated negative item ids.
struct NegativeFile {
  uint64_t E = 0;  // negatives per line (the same on every line)
  std::vector<int64_t> user, item;
  std::vector<uint64_t> line;      // 1-based line of each entry
  std::vector<int32_t> negatives;  // lines x E
};

bool parse_negative_line(const char* b, const char* e, int64_t* user, int64_t* item,
                         std::vector<int32_t>* negs, std::string* why) {
  if (*b != '(') {
    *why = "expected \"(user,item)\" as the first field";
    return false;
  }
  const char* close = static_cast<const char*>(std::memchr(b, ')', static_cast<size_t>(e - b)));
  const char* comma =
      close ? static_cast<const char*>(std::memchr(b, ',', static_cast<size_t>(close - b)))
            : nullptr;
  if (!close || !comma) {
    *why = "expected \"(user,item)\" as the first field";
    return false;
  }
  if (!field_int(b + 1, comma, "user id", false, user, why) ||
      !field_int(comma + 1, close, "item id", false, item, why))
    return false;
  if (*item > std::numeric_limits<int32_t>::max()) {
    *why = detail::concat("item id ", *item, " does not fit int32");
    return false;
  }
  const char* p = close + 1;
  while (p < e) {
    if (*p != '\t') {
      *why = "expected TAB-separated negative item ids after \"(user,item)\"";
      return false;
    }
    ++p;
    const void* q = std::memchr(p, '\t', static_cast<size_t>(e - p));
    const char* fe = q ? static_cast<const char*>(q) : e;
    int64_t v;
    if (!field_int(p, fe, "negative item id", false, &v, why)) return false;
    if (v > std::numeric_limits<int32_t>::max()) {
      *why = detail::concat("negative item id ", v, " does not fit int32");
      return false;
    }
    negs->push_back(static_cast<int32_t>(v));
    p = fe;
  }
  return true;
}

NegativeFile read_negative_file(const std::string& file) {
  MappedFile m(file);
  NegativeFile nf;
  const char* b = skip_bom(m.begin(), m.end());
  const char* e = m.end();
  uint64_t line = 1;
  std::string why;
  std::vector<int32_t> negs;
  while (b < e) {
    const void* nl = std::memchr(b, '\n', static_cast<size_t>(e - b));
    const char* le = nl ? static_cast<const char*>(nl) : e;
    const char* te = trim_right(b, le);
    if (te > b) {
      int64_t u, i;
      negs.clear();
      if (!parse_negative_line(b, te, &u, &i, &negs, &why))
        throw_line_failure(file, {true, line, why, excerpt(b, te)});
      if (nf.user.empty()) {
        nf.E = negs.size();
      } else if (negs.size() != nf.E) {
        throw_line_failure(
            file, {true, line,
                   detail::concat(negs.size(), " negatives where line ", nf.line[0], " has ", nf.E),
                   excerpt(b, te)});
      }
      nf.user.push_back(u);
      nf.item.push_back(i);
      nf.line.push_back(line);
      nf.negatives.insert(nf.negatives.end(), negs.begin(), negs.end());
    }
    ++line;
    b = nl ? le + 1 : e;
  }
  if (nf.user.empty()) NCF_FAIL(file, ": empty file (only blank lines)");
  return nf;
}

// The NCF paper's three files, parsed and checked against each other. Ids are
// the files' own: users 0 .. U-1 in test-file order, items up to the largest seen.
struct PaperFiles {
  std::string prefix;
  std::vector<Rating> test;   // one per user, user u on entry u
  NegativeFile negatives;     // user u's E negatives on entry u
  std::vector<Rating> train;  // train pairs in file order
  uint64_t num_items = 0;
};

// The given split, grouped by user: distinct train items (sorted) and the test item.
struct PaperUsers {
  std::vector<uint64_t> off;  // U + 1, into train_items
  std::vector<int32_t> train_items;
  std::vector<uint64_t> train_n;  // distinct train items of user u (first of its range)
  std::vector<uint64_t> pos_n;    // distinct(train ∪ {test})
  std::vector<int32_t> test;
  uint64_t train_lines = 0, duplicates = 0, test_in_train = 0, neg_is_test = 0, neg_in_train = 0;
  uint64_t num_train = 0, num_positives = 0;
};

// Parse stage: the three files, with every cross-file check.
PaperFiles parse_paper_files(const std::string& prefix, uint32_t eval_negatives, int threads) {
  const std::string train_file = prefix + kNcfTrain;
  const std::string test_file = prefix + kNcfTest;
  const std::string neg_file = prefix + kNcfNegative;
  const RatingSyntax tab = syntax_of(InputFormat::kNcfPaper);
  PaperFiles p;
  p.prefix = prefix;

  // The test file fixes the users: one line per user, 0 .. U-1 in order.
  p.test = parse_ratings(test_file, tab, threads);
  const std::vector<Rating>& test = p.test;
  const uint64_t U = test.size();
  int64_t max_item = -1;
  for (uint64_t u = 0; u < U; ++u) {
    if (test[u].user != static_cast<int64_t>(u))
      NCF_FAIL(test_file, ":", test[u].line, ": user ", test[u].user, " where user ", u,
               " was expected (one test line per user, users 0.. in order)");
    max_item = std::max(max_item, test[u].item);
  }
  if (U > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(test_file, ": ", U, " users do not fit int32 ids");

  p.negatives = read_negative_file(neg_file);
  const NegativeFile& neg = p.negatives;
  if (neg.E != eval_negatives)
    NCF_FAIL(neg_file, ": has ", neg.E, " negatives per user but ", eval_negatives,
             " eval negatives were requested (pass --eval_negatives ", neg.E,
             " or leave it unset)");
  for (uint64_t k = 0; k < neg.user.size(); ++k) {
    if (k >= U)
      NCF_FAIL(neg_file, ":", neg.line[k], ": user ", neg.user[k], " is not in ", test_file,
               " (which has users 0..", U - 1, ")");
    if (neg.user[k] != static_cast<int64_t>(k))
      NCF_FAIL(neg_file, ":", neg.line[k], ": user ", neg.user[k], " where user ", k,
               " was expected (same order as ", test_file, ")");
    if (neg.item[k] != test[k].item)
      NCF_FAIL(neg_file, ":", neg.line[k], ": test item ", neg.item[k], " of user ", k, " but ",
               test_file, ":", test[k].line, " has ", test[k].item);
  }
  if (neg.user.size() < U)
    NCF_FAIL(neg_file, ": has ", neg.user.size(), " users but ", test_file, " has ", U, "; user ",
             neg.user.size(), " (", test_file, ":", test[neg.user.size()].line, ") is missing");
  for (int32_t v : neg.negatives) max_item = std::max<int64_t>(max_item, v);

  p.train = parse_ratings(train_file, tab, threads);
  std::vector<uint64_t> per_user(U, 0);
  for (const Rating& r : p.train) {
    if (r.user >= static_cast<int64_t>(U))
      NCF_FAIL(train_file, ":", r.line, ": user ", r.user, " is not in ", test_file,
               " (which has users 0..", U - 1, ")");
    ++per_user[r.user];
    max_item = std::max(max_item, r.item);
  }
  for (uint64_t u = 0; u < U; ++u)
    if (per_user[u] == 0)
      NCF_FAIL(train_file, ": user ", u, " has no training pairs but is in ", test_file, ":",
               test[u].line);
  if (max_item >= std::numeric_limits<int32_t>::max())
    NCF_FAIL(prefix, ": item id ", max_item, " does not fit int32");
  p.num_items = static_cast<uint64_t>(max_item) + 1;
  return p;
}

// Remap stage: the ids stay; train pairs are grouped by user and a repeated
// pair is kept once. Counts what the metadata reports about the given split.
PaperUsers group_paper_users(PaperFiles* p) {
  PaperUsers g;
  const uint64_t U = p->test.size();
  const NegativeFile& neg = p->negatives;
  g.off.assign(U + 1, 0);
  for (const Rating& r : p->train) ++g.off[r.user + 1];
  for (uint64_t u = 0; u < U; ++u) g.off[u + 1] += g.off[u];
  g.train_items.resize(p->train.size());
  {
    std::vector<uint64_t> cursor(g.off.begin(), g.off.end() - 1);
    for (const Rating& r : p->train) g.train_items[cursor[r.user]++] = static_cast<int32_t>(r.item);
  }
  g.train_lines = p->train.size();
  std::vector<Rating>().swap(p->train);

  g.train_n.resize(U);
  g.pos_n.resize(U);
  g.test.resize(U);
  for (uint64_t u = 0; u < U; ++u) {
    auto first = g.train_items.begin() + g.off[u], last = g.train_items.begin() + g.off[u + 1];
    std::sort(first, last);
    g.train_n[u] = static_cast<uint64_t>(std::unique(first, last) - first);
    g.duplicates += (g.off[u + 1] - g.off[u]) - g.train_n[u];
    g.test[u] = static_cast<int32_t>(p->test[u].item);
    const bool has_test = std::binary_search(first, first + g.train_n[u], g.test[u]);
    g.test_in_train += has_test;
    g.pos_n[u] = g.train_n[u] + (has_test ? 0 : 1);
    const int32_t* ng = neg.negatives.data() + u * neg.E;
    for (uint64_t j = 0; j < neg.E; ++j) {
      g.neg_is_test += ng[j] == g.test[u];
      g.neg_in_train += std::binary_search(first, first + g.train_n[u], ng[j]);
    }
    g.num_train += g.train_n[u];
    g.num_positives += g.pos_n[u];
  }
  return g;
}

// Split stage: the files' own split, positives = train ∪ {test}.
SplitUsers paper_split(const PaperUsers& g) {
  SplitUsers s;
  s.num_users = g.test.size();
  s.sizes = [&g](uint64_t u, uint64_t* np, uint64_t* nt) {
    *np = g.pos_n[u];
    *nt = g.train_n[u];
  };
  s.split = [&g](UserBlock* b, uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = b->first_user + j;
      const int32_t* tr = g.train_items.data() + g.off[u];
      const int32_t* tr_end = tr + g.train_n[u];
      const int32_t t = g.test[u];
      std::copy(tr, tr_end, b->train_of(j));
      // Sorted merge of the train items and the test item, which may be among them.
      const int32_t* at = std::lower_bound(tr, tr_end, t);
      int32_t* pos = std::copy(tr, at, b->positives_of(j));
      if (at == tr_end || *at != t) *pos++ = t;
      std::copy(at, tr_end, pos);
      b->eval_of(j)[0] = t;
    }
  };
  return s;
}

}  // namespace

DatasetMeta prepare_ncf_paper(const std::string& prefix_in, const std::string& out_dir,
                              const PrepOptions& opt) {
  const PrepProgress progress{opt.progress, "prep", Clock::now()};
  const int threads = resolve_threads(opt.threads);
  std::string prefix;
  detect_format(prefix_in, InputFormat::kNcfPaper, &prefix);
  PaperFiles files = parse_paper_files(prefix, opt.eval_negatives, threads);
  const PaperUsers users = group_paper_users(&files);
  const uint64_t U = users.test.size(), I = files.num_items, E = files.negatives.E;
  if (opt.progress)
    std::fprintf(stderr,
                 "prep: %llu users, %llu items, %llu train pairs, %llu eval negatives each "
                 "(%.1f s)\n",
                 static_cast<unsigned long long>(U), static_cast<unsigned long long>(I),
                 static_cast<unsigned long long>(users.num_train),
                 static_cast<unsigned long long>(E), progress.seconds());

  DatasetPlan plan;
  plan.source = "ncf-paper:" + basename_of(prefix);
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = users.num_train;
  plan.num_positives = users.num_positives;
  plan.eval_negatives = static_cast<uint32_t>(E);
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = opt.seed;
  plan.dropped_users = 0;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.generator = {{"input", prefix},
                    {"format", format_name(InputFormat::kNcfPaper)},
                    {"train_lines", users.train_lines},
                    {"duplicates_removed", users.duplicates},
                    {"test_items_in_train", users.test_in_train},
                    {"negatives_equal_to_test", users.neg_is_test},
                    {"negatives_in_train", users.neg_in_train}};
  EvalNegatives negatives{I, static_cast<uint32_t>(E), opt.seed, files.negatives.negatives.data(),
                          nullptr};
  return assemble_dataset(out_dir, plan, paper_split(users), negatives, threads, progress);
}

}  // namespace ncf
