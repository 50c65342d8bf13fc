// RFC 4180 records: the tokenizer (CsvScanner) and the parallel split of a
// block of text into chunks that start at record boundaries (scan_csv_block).
//
// Syntax: records end at LF or CRLF; fields are separated by one byte (',' by
// default); a field that starts with '"' is quoted: it ends at the next '"' not
// doubled, may hold separators and line breaks, and "" inside it stands for one
// '"'. A quote anywhere else (`5" screen`, `"a"b`) is a stray quote. A bad
// record ends at the end of the line where the problem was found (for an
// unterminated quote: the line where the quote opened), so one bad record never
// swallows the rows after it. A record must end within max_record_bytes of its
// start; a quoted field still open at that point (or at the end of the input) is
// an unterminated quote, and an unquoted line that long stops the parse.
//
// Parallel split: the quotes of each chunk are counted to know whether a chunk
// starts inside a quoted field; each chunk is then taken to start after the
// first line break outside quotes. That guess holds for every well-formed file;
// it is checked anyway (the previous chunk must end exactly there), and a chunk
// whose guess was wrong is parsed again from where its predecessor ended. So the
// records, and their 1-based line numbers, are those of one sequential pass
// whatever the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ncf {

struct CsvSyntax {
  char separator = ',';
  size_t max_record_bytes = size_t(1) << 20;
  size_t min_chunk_bytes = size_t(1) << 20;  // smallest piece given to a thread
};

struct CsvField {
  const char* data = nullptr;  // a quoted field: the bytes between its quotes
  uint32_t size = 0;
  bool quoted = false;
  bool doubled = false;  // quoted and holding "" pairs: see csv_value
};

// The field's value: its bytes, each "" of a quoted field made one '"'.
// Uses *scratch only for fields that hold "" pairs.
std::string_view csv_value(const CsvField& f, std::string* scratch);

enum class CsvProblem : uint8_t { kNone, kStrayQuote, kUnterminatedQuote };

struct CsvRecord {
  uint64_t line = 0;  // line of its first byte, counted from the scanner's start (0-based)
  const char* begin = nullptr;  // its bytes, without the line break
  const char* end = nullptr;
  const CsvField* fields = nullptr;  // none when problem is set
  size_t num_fields = 0;
  CsvProblem problem = CsvProblem::kNone;
  size_t problem_field = 0;  // 0-based field where the problem is
  bool blank() const { return begin == end; }
};

// Tokenizes the records that start in [begin, stop) of a buffer ending at end.
class CsvScanner {
 public:
  enum class Status { kMore, kDone, kNeedMore, kTooLong };

  // `begin` must be a record boundary. at_eof: `end` is the end of the input.
  CsvScanner(const char* begin, const char* stop, const char* end, bool at_eof,
             const CsvSyntax& syntax);
  // The next record; false when none starts before stop (kDone), when the next
  // one runs past the buffer (kNeedMore: more input is needed, pos() is its
  // start), or when it is longer than max_record_bytes without a quoted field
  // to blame (kTooLong: pos() is its start, lines() its line).
  bool next(CsvRecord* r);
  Status status() const { return status_; }
  const char* pos() const { return pos_; }
  uint64_t lines() const { return lines_; }  // line breaks between begin and pos()

 private:
  enum class Step { kRecord, kNeedMore, kTooLong };
  Step parse(CsvRecord* r, const char** next);
  const char* pos_;
  const char* stop_;
  const char* end_;
  bool at_eof_;
  CsvSyntax syntax_;
  uint64_t lines_ = 0;
  Status status_ = Status::kMore;
  std::vector<CsvField> fields_;
  bool special_[256] = {};  // separator, '\n', '"'
};

struct CsvBlockResult {
  size_t consumed = 0;    // records end here: [consumed, n) is an incomplete record
  uint64_t lines = 0;     // line breaks in [start, consumed)
  bool too_long = false;  // a record at `consumed` is longer than max_record_bytes
};

// Parses the records of buf[start, n) on up to `threads` threads. scan(slot,
// scanner) runs on a pool thread for each chunk: it takes the chunk's records
// with scanner.next() into the caller's per-slot storage (slot < threads).
// commit(slot, first_line) then runs on the calling thread, in file order, for
// each chunk that starts where the previous one ended; first_line is the
// 1-based line of the chunk's start (lines of records are relative to it). A
// slot whose chunk is not committed is scanned again (the caller resets it in
// scan). The chunk holding the end of the parsed records ends the call.
CsvBlockResult scan_csv_block(const char* buf, size_t start, size_t n, bool at_eof,
                              uint64_t first_line, const CsvSyntax& syntax, int threads,
                              const std::function<void(int slot, CsvScanner& scanner)>& scan,
                              const std::function<void(int slot, uint64_t first_line)>& commit);

// All records of a small in-memory text (lists of ids for ncf_recommend), one
// sequential pass; blank lines are kept as records with one empty field.
struct CsvTextRecord {
  uint64_t line = 0;  // 1-based
  std::vector<std::string> fields;
  CsvProblem problem = CsvProblem::kNone;
  std::string text;  // the record's bytes, for messages
};
std::vector<CsvTextRecord> parse_csv_text(const std::string& text, char separator);

}  // namespace ncf
