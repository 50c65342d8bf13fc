// Input formats of ncf_prep: their names and the detection of what a path
// holds. Each source reads its files in its own file (source_movielens.cc,
// source_ncf_paper.cc, ...) and ends with the shared stages of prep_stages.h.
#include "data/sources.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/check.h"
#include "data/text_input.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;

constexpr size_t kSniffBytes = 64 << 10;  // what detect_format reads of a file

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
    case InputFormat::kCsv:
      return "an interaction log described by --columns";
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
  if (line == kMlCsvHeader || line.find(',') != std::string::npos) return InputFormat::kMlCsv;
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

}  // namespace

// ----------------------------------------------------------------- public ---

InputFormat parse_input_format(const std::string& name) {
  if (name == "auto") return InputFormat::kAuto;
  if (name == "ml-100k") return InputFormat::kMl100k;
  if (name == "ml-1m" || name == "ml-10m" || name == "ml-1m/ml-10m") return InputFormat::kMlDat;
  if (name == "ml-20m" || name == "ml-25m" || name == "ml-20m/ml-25m") return InputFormat::kMlCsv;
  if (name == "ncf-paper") return InputFormat::kNcfPaper;
  if (name == "csv") return InputFormat::kCsv;
  NCF_FAIL("unknown input format \"", name,
           "\" (expected auto, ml-100k, ml-1m, ml-10m, ml-20m, ml-25m, ncf-paper or csv)");
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
    case InputFormat::kCsv:
      return "csv";
  }
  return "?";
}

InputFormat detect_format(const std::string& path, InputFormat want, std::string* resolved) {
  std::string dummy;
  if (!resolved) resolved = &dummy;
  struct stat st;
  if (want == InputFormat::kCsv) {
    // An interaction log is read as the user describes it (--columns): no sniffing.
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      NCF_FAIL("cannot open ", path, ": ", std::strerror(err));
    }
    if (S_ISDIR(st.st_mode))
      NCF_FAIL(path, ": --format csv takes the interaction file itself, not a directory");
    *resolved = path;
    return InputFormat::kCsv;
  }
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

bool is_movielens(InputFormat f) {
  return f == InputFormat::kMl100k || f == InputFormat::kMlDat || f == InputFormat::kMlCsv;
}

}  // namespace ncf
