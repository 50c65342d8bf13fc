// Fuzz target: parse_csv_timestamp (integer seconds or ISO 8601 with optional
// fraction and offset), the one typed field of interaction logs whose parser
// does its own arithmetic, and the --separator / --header flag parsers.
//
// Input: the text of a timestamp field.
// Properties: a parsed "YYYY-MM-DD[T ]hh:mm:ss" (with an optional Z) is the
// C library's timegm of the same fields, in microseconds; an accepted
// integer timestamp is that integer in microseconds.
#include <charconv>
#include <ctime>
#include <string>

#include "data/source_csv.h"
#include "fuzz_util.h"

using namespace ncf;

namespace {

bool digits(const std::string& s, size_t at, size_t n, int* v) {
  if (at + n > s.size()) return false;
  int x = 0;
  for (size_t k = at; k < at + n; ++k) {
    if (s[k] < '0' || s[k] > '9') return false;
    x = x * 10 + (s[k] - '0');
  }
  *v = x;
  return true;
}

// The fields of exactly "YYYY-MM-DD?hh:mm:ss" or the same with a trailing Z.
bool plain_iso(const std::string& s, struct tm* t) {
  if (s.size() != 19 && !(s.size() == 20 && (s[19] == 'Z' || s[19] == 'z'))) return false;
  int y, mo, d, h, mi, se;
  if (!digits(s, 0, 4, &y) || s[4] != '-' || !digits(s, 5, 2, &mo) || s[7] != '-' ||
      !digits(s, 8, 2, &d) || !(s[10] == 'T' || s[10] == 't' || s[10] == ' ') ||
      !digits(s, 11, 2, &h) || s[13] != ':' || !digits(s, 14, 2, &mi) || s[16] != ':' ||
      !digits(s, 17, 2, &se))
    return false;
  *t = {};
  t->tm_year = y - 1900;
  t->tm_mon = mo - 1;
  t->tm_mday = d;
  t->tm_hour = h;
  t->tm_min = mi;
  t->tm_sec = se;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  int64_t micros = 0;
  std::string why;
  const bool ok = parse_csv_timestamp(text, &micros, &why);
  if (!ok && why.empty()) fuzz::property_failed("a refused timestamp without a reason");
  struct tm t;
  if (ok && plain_iso(text, &t)) {
    const int64_t want = int64_t(timegm(&t)) * 1000000;
    if (want != micros)
      fuzz::property_failed("\"" + text + "\" parses to " + std::to_string(micros) +
                            " us, timegm gives " + std::to_string(want));
  }
  int64_t seconds = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ok && ec == std::errc() && end == text.data() + text.size() && micros != seconds * 1000000)
    fuzz::property_failed("integer timestamp \"" + text + "\" parses to " + std::to_string(micros) +
                          " us");
  // The flag parsers take user text too.
  fuzz::refused_or_ran("", [&] { parse_csv_separator(text); });
  fuzz::refused_or_ran("", [&] { parse_csv_header(text); });
  return 0;
}
