// What every text source of ncf_prep reads with: a memory-mapped file, its
// split into numbered chunks of whole lines for the parse threads, bounded
// excerpts of offending text for messages, and the delimited rating-line reader
// (user SEP item SEP rating SEP timestamp) that MovieLens files and the NCF
// paper's files share. Errors name the file and the 1-based line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/sources.h"

namespace ncf {

// ---------------------------------------------------------------- strings ---

bool ends_with(const std::string& s, const std::string& suffix);
// The last component of a path, trailing slashes ignored.
std::string basename_of(const std::string& path);
// Printable, bounded copy of [b, e) for messages: control characters escaped,
// separators visible, "..." past 80 characters.
std::string excerpt(const char* b, const char* e);
// Line end without '\r' and trailing blanks (CRLF files, stray trailing tabs).
const char* trim_right(const char* b, const char* e);
// Past a UTF-8 byte order mark, if [b, e) starts with one.
const char* skip_bom(const char* b, const char* e);

// ------------------------------------------------------------ mapped file ---

// A whole file mapped read-only. Refuses a missing, unreadable, empty file or
// a directory, naming the path.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
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

// Splits [b, e) into about `parts` chunks of whole lines (at least 8 MiB each)
// and numbers them, counting newlines on the pool.
std::vector<LineChunk> split_lines(const char* b, const char* e, uint64_t first_line, int parts);

// First failure of a chunk; the earliest chunk's is the one reported.
struct LineFailure {
  bool failed = false;
  uint64_t line = 0;
  std::string reason;
  std::string text;
};

// "FILE:LINE: malformed line: REASON: "TEXT"".
[[noreturn]] void throw_line_failure(const std::string& file, const LineFailure& f);

// ---------------------------------------------------------- rating lines ---

constexpr const char* kMlCsvHeader = "userId,movieId,rating,timestamp";

struct RatingSyntax {
  const char* sep;  // "\t", "::" or ","
  size_t sep_len;
  const char* sep_desc;  // for messages
  bool header;           // a CSV header line may come first
};

// The line syntax of a MovieLens format or of the NCF paper's files.
RatingSyntax syntax_of(InputFormat f);

// Whole field [b, e) as an integer; false with *why set otherwise.
bool field_int(const char* b, const char* e, const char* name, bool allow_negative, int64_t* v,
               std::string* why);

// Every rating line of a file, parsed on `threads` threads; blank lines are
// skipped, the first malformed line (the earliest in the file) is reported.
std::vector<Rating> parse_ratings(const std::string& file, const RatingSyntax& s, int threads);

}  // namespace ncf
