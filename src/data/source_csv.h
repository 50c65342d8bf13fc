// Users' own interaction logs → dataset (ncf_prep --format csv): one row per
// interaction, ids that are arbitrary strings (hashes, SKUs, ISBNs), an
// optional timestamp and rating, as CSV (csv_reader.h: RFC 4180 quoting, any
// one-byte separator, CRLF, a UTF-8 BOM), plain or gzip-compressed, at 10^8
// rows with bounded memory.
//
// Stages: parse (blocks of the file over threads, split at record boundaries),
// intern (each distinct id string gets a key; 64 hash shards, each owned by one
// thread), rank (keys sorted by the strings' bytes), then interactions.h's
// remap and split (the MovieLens rules: a repeated pair once, each user's
// latest interaction held out, the later row winning a tie, --min_interactions)
// and prep_stages.h's eval negatives and writer. Dense ids follow the ascending
// byte order of the id strings; the strings are kept as user_ids.str and
// item_ids.str (dataset.h). Nothing depends on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "data/block_reader.h"
#include "data/dataset.h"
#include "data/sources.h"

namespace ncf {

enum class CsvHeader { kAuto, kYes, kNo };

struct CsvOptions {
  // "user=C,item=C[,timestamp=C][,rating=C]", each C a header name or a 0-based position.
  std::string columns;
  char separator = ',';
  CsvHeader header = CsvHeader::kAuto;
  std::optional<double> min_rating;  // rows rated below it are skipped (a rating column needed)
  bool skip_bad_rows = false;        // count and skip bad rows instead of stopping
  // --csv_max_row_bytes: a row (a record, quoted line breaks and all) must end
  // within this many bytes; a longer one stops the parse, a quote still open
  // there is an unterminated quote.
  size_t max_row_bytes = size_t(1) << 20;
  // --csv_block_bytes: the file is read (and inflated) in blocks of this size.
  size_t block_bytes = BlockReader::kDefaultBlockBytes;
};

// The largest --csv_max_row_bytes and --csv_block_bytes; the smallest is 1.
constexpr size_t kMaxCsvSizeFlag = size_t(1) << 30;

// --separator: one character, or "\t" / "tab" for TAB. Not '"', CR or LF.
char parse_csv_separator(const std::string& text);
// --header: yes, no or auto.
CsvHeader parse_csv_header(const std::string& text);

// A timestamp field: integer seconds since the epoch, or ISO 8601
// (2019-03-04, 2019-03-04T05:06:07, 2019-03-04 05:06:07, optional fractional
// seconds, optional Z or ±hh:mm / ±hhmm / ±hh offset; no offset means UTC), as
// microseconds since the epoch, UTC. Surrounding spaces are ignored. False,
// with *why, when the text is none of these or out of range.
bool parse_csv_timestamp(std::string_view text, int64_t* micros, std::string* why);

// Reads `file` (a .gz one by its content) and writes the dataset to out_dir.
DatasetMeta prepare_csv(const std::string& file, const CsvOptions& csv, const std::string& out_dir,
                        const PrepOptions& opt);

}  // namespace ncf
