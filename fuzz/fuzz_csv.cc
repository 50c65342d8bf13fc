// Fuzz target: interaction logs (`ncf_prep --format csv`) through
// prepare_csv: the block reader (plain or gzip), the RFC 4180 scanner and its
// parallel chunking, the header and column rules, timestamps and ratings, bad
// rows, id interning and ranking, then the writer and the string id maps.
//
// Input: a mode byte, a knobs byte (fuzz::small_prep; bits 6-7 also pick the
// longest row: 1 MiB, 64, 300 or 17 bytes), then the --columns text,
// fuzz::kFileSep, and the file.
//   mode bits 0-1: --separator , ; TAB |     bits 2-3: --header auto yes no auto
//   bit 4: --min_rating 3                     bit 5: --skip_bad_rows
//   bit 6: the file is gzip-compressed here (a fuzzed file that starts with
//          1f 8b is read as gzip anyway)
//   bit 7: differential: prepared a second time with 2 threads and blocks of
//          5 .. 36 bytes (chunks of a quarter of that), which must give the same
//          dataset, byte for byte, or the same error.
// Property: a prepared dataset passes verify_dataset.
#include <zlib.h>

#include <filesystem>

#include "data/dataset.h"
#include "data/source_csv.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

std::string gzip(const std::string& in) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK)
    fuzz::property_failed("deflateInit2");
  std::string out(deflateBound(&z, uLong(in.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) fuzz::property_failed("deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// Every file of a prepared dataset, by name.
std::vector<std::pair<std::string, std::string>> dataset_files(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    files.emplace_back(e.path().filename().string(), fuzz::read_file(e.path().string()));
  std::sort(files.begin(), files.end());
  return files;
}

// "" when it prepared the dataset, else the refusal.
std::string run(const std::string& file, const CsvOptions& csv, const std::string& out,
                const PrepOptions& opt, size_t block_bytes, const std::string& in_dir) {
  CsvOptions c = csv;
  c.block_bytes = block_bytes;
  // Refusals name the file, or the flag whose (fuzzed) value is wrong.
  return fuzz::refusal({in_dir, "--columns", "--min_rating", "--header", "--separator"},
                       [&] { prepare_csv(file, c, out, opt); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size < 2) return 0;
  const uint8_t mode = data[0], knobs = data[1];
  std::vector<std::string> parts = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 2, size - 2), fuzz::kFileSep);
  parts.resize(2);
  CsvOptions csv;
  csv.columns = parts[0];
  static const char kSeps[4] = {',', ';', '\t', '|'};
  csv.separator = kSeps[mode & 3];
  static const CsvHeader kHeaders[4] = {CsvHeader::kAuto, CsvHeader::kYes, CsvHeader::kNo,
                                        CsvHeader::kAuto};
  csv.header = kHeaders[(mode >> 2) & 3];
  if (mode & 0x10) csv.min_rating = 3.0;
  csv.skip_bad_rows = mode & 0x20;
  static const size_t kRowBytes[4] = {size_t(1) << 20, 64, 300, 17};
  csv.max_row_bytes = kRowBytes[knobs >> 6];

  const std::string in_dir = fuzz::in_scratch("in");
  std::filesystem::create_directory(in_dir);
  const std::string file = in_dir + (mode & 0x40 ? "/log.csv.gz" : "/log.csv");
  fuzz::write_file(file, mode & 0x40 ? gzip(parts[1]) : parts[1]);
  const PrepOptions opt = fuzz::small_prep(knobs);
  const std::string out1 = fuzz::in_scratch("out1");
  const std::string one = run(file, csv, out1, opt, 4096, in_dir);
  if (one.empty()) fuzz::check_prepared(out1);

  if (mode & 0x80) {
    PrepOptions opt2 = opt;
    opt2.threads = 2;
    const std::string out2 = fuzz::in_scratch("out2");
    const std::string two = run(file, csv, out2, opt2, 5 + knobs % 32, in_dir);
    // A refusal is a sentence without a source location, so the same message
    // whichever block (the header's parse or the rows') meets the row.
    if (one != two)
      fuzz::property_failed("threads and block size change the outcome:\n  " +
                            (one.empty() ? std::string("ok") : one) + "\n  " +
                            (two.empty() ? std::string("ok") : two));
    if (one.empty() && dataset_files(out1) != dataset_files(out2))
      fuzz::property_failed("threads and block size change the dataset's bytes");
  }
  return 0;
}
