// Flag ranges: see flag_range.h.
#include "train/flag_range.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/check.h"

namespace ncf {

namespace {

std::string decimal(__int128 v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  unsigned __int128 m = neg ? -(unsigned __int128)v : (unsigned __int128)v;
  std::string s;
  for (; m > 0; m /= 10) s.insert(s.begin(), char('0' + int(m % 10)));
  return neg ? "-" + s : s;
}

std::string real(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

// Where a refusal is thrown on as ncf::Error: its messages start so.
constexpr const char* kRefusalStart = "flag --";

}  // namespace

FlagRange FlagRange::ints(uint64_t lo, uint64_t hi) {
  FlagRange r;
  r.integral_ = true;
  r.ilo_ = lo;
  r.ihi_ = hi;
  return r;
}

FlagRange FlagRange::reals(double lo, double hi) {
  FlagRange r;
  r.integral_ = false;
  r.lo_ = lo;
  r.hi_ = hi;
  return r;
}

FlagRange& FlagRange::open_low() {
  lo_open_ = true;
  return *this;
}

FlagRange& FlagRange::open_high() {
  hi_open_ = true;
  return *this;
}

FlagRange& FlagRange::or_negative(const char* meaning) {
  negative_ = meaning;
  return *this;
}

std::string FlagRange::describe() const {
  const std::string interval =
      integral_ ? "[" + decimal(ilo_) + ", " + decimal(ihi_) + "]"
                : (lo_open_ ? "(" : "[") + real(lo_) + ", " + real(hi_) + (hi_open_ ? ")" : "]");
  return (negative_ ? std::string("negative (") + negative_ + ") or in " : std::string("in ")) +
         interval;
}

// Below a lower bound that is the only one the value breaks, the message says
// that bound ("must be > 0"), then the whole range; otherwise the range.
std::string FlagRange::refused(const std::string& flag, const std::string& shown,
                               bool below) const {
  std::string msg = kRefusalStart + flag.substr(2) + " must be ";
  if (below && !negative_) {
    const bool positive =
        integral_ ? ilo_ == 1 : (lo_open_ && lo_ == 0);  // "> 0" reads best for these
    msg += positive    ? std::string("> 0")
           : integral_ ? ">= " + decimal(ilo_)
                       : (lo_open_ ? "> " : ">= ") + real(lo_);
    return msg + ", got " + shown + "; its range is " + describe().substr(3);  // past "in "
  }
  return msg + describe() + ", got " + shown;
}

std::string FlagRange::refusal(const std::string& flag, __int128 v) const {
  if (!integral_) return refusal(flag, double(v));
  if (v < 0 && negative_) return "";
  if (v >= __int128(ilo_) && v <= __int128(ihi_)) return "";
  return refused(flag, decimal(v), v < __int128(ilo_));
}

std::string FlagRange::refusal(const std::string& flag, double v) const {
  if (integral_) {
    if (std::nearbyint(v) == v && std::fabs(v) < 1e38) return refusal(flag, __int128(v));
    return kRefusalStart + flag.substr(2) + " must be an integer " + describe() + ", got " +
           real(v);
  }
  if (!std::isfinite(v))
    return kRefusalStart + flag.substr(2) + " must be a finite number " + describe() + ", got " +
           real(v);
  if (v < 0 && negative_) return "";
  const bool above_lo = lo_open_ ? v > lo_ : v >= lo_;
  const bool below_hi = hi_open_ ? v < hi_ : v <= hi_;
  if (above_lo && below_hi) return "";
  return refused(flag, real(v), !above_lo);
}

std::string FlagRange::refusal_of_text(const std::string& flag, std::string* text) const {
  // Spaces around a value are no part of it ("--layers '256, 128'").
  const size_t first = text->find_first_not_of(" \t");
  const std::string s = first == std::string::npos
                            ? ""
                            : text->substr(first, text->find_last_not_of(" \t") + 1 - first);
  const std::string kind = integral_ ? " must be an integer " : " must be a finite number ";
  const std::string not_number =
      kRefusalStart + flag.substr(2) + kind + describe() + ", got '" + s + "'";
  if (integral_) {
    // [+-]digits, nothing else; magnitudes past 2^64 saturate (out of any range).
    size_t at = 0;
    const bool neg = !s.empty() && s[0] == '-';
    if (!s.empty() && (s[0] == '-' || s[0] == '+')) at = 1;
    if (at == s.size()) return not_number;
    unsigned __int128 mag = 0;
    for (size_t k = at; k < s.size(); ++k) {
      if (s[k] < '0' || s[k] > '9') return not_number;
      mag = mag * 10 + unsigned(s[k] - '0');
      if (mag > (unsigned __int128)(1) << 65) mag = (unsigned __int128)(1) << 65;
    }
    const __int128 v = neg ? -__int128(mag) : __int128(mag);
    const bool fits_int64 = v >= __int128(std::numeric_limits<int64_t>::min());
    if (v < 0 && negative_ && fits_int64) {
      *text = decimal(v);
      return "";
    }
    if (v >= __int128(ilo_) && v <= __int128(ihi_)) {
      *text = decimal(v);
      return "";
    }
    return refused(flag, s, v < __int128(ilo_));
  }
  // strtod takes "nan" and "inf"; neither is a value here.
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return not_number;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return not_number;
  const bool above_lo = lo_open_ ? v > lo_ : v >= lo_;
  const bool below_hi = hi_open_ ? v < hi_ : v <= hi_;
  if ((v < 0 && negative_) || (above_lo && below_hi)) {
    *text = s;
    return "";
  }
  return refused(flag, s, !above_lo);
}

void throw_if_range_refusal(const CLI::ParseError& e) {
  if (dynamic_cast<const CLI::ValidationError*>(&e) == nullptr) return;
  const std::string what = e.what();
  const std::string prefix = std::string(": ") + kRefusalStart;
  const size_t at = what.find(prefix);
  if (at == std::string::npos) return;
  NCF_FAIL(what.substr(at + 2));
}

void refuse_empty_list_entries(int argc, const char* const* argv,
                               const std::vector<std::string>& flags, char delimiter) {
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg == "--") return;  // what follows is no flag
    for (const std::string& flag : flags) {
      std::string value;
      if (arg == flag && k + 1 < argc)
        value = argv[k + 1];
      else if (arg.rfind(flag + "=", 0) == 0)
        value = arg.substr(flag.size() + 1);
      else
        continue;
      if (value.find(delimiter) == std::string::npos) continue;
      size_t start = 0;
      while (true) {
        const size_t end = value.find(delimiter, start);
        const std::string entry = value.substr(start, end - start);
        if (entry.find_first_not_of(" \t") == std::string::npos)
          NCF_FAIL("flag ", flag, " has an empty entry in '", value, "'");
        if (end == std::string::npos) break;
        start = end + 1;
      }
    }
  }
}

}  // namespace ncf
