// The ranges of the programs' numeric flags: one description that --help
// states (a CLI11 check) and that every refusal repeats, naming the flag and
// the value, whether the value came from the command line, a preset or a
// checkpoint's manifest.
//
// The command line's text is parsed here, strictly, before CLI11 converts it:
// CLI11 2.1 wraps "-1" into an unsigned flag, saturates on overflow, reads
// "010" as octal and takes "nan" for a floating-point flag.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace ncf {

class FlagRange {
 public:
  // Integers in [lo, hi].
  static FlagRange ints(uint64_t lo, uint64_t hi);
  // Finite numbers in [lo, hi]; open_low / open_high make an end open.
  static FlagRange reals(double lo, double hi);
  FlagRange& open_low();
  FlagRange& open_high();
  // Also every negative value, a marker whose meaning this names ("never").
  FlagRange& or_negative(const char* meaning);

  // What --help says: "in [1, 2048]", "in (0, 1000]", "negative (never) or in [0, 1]".
  std::string describe() const;
  // "" when `flag` (e.g. "--seed") may take the value, else the refusal,
  // which names the flag and the value.
  std::string refusal(const std::string& flag, __int128 v) const;
  std::string refusal(const std::string& flag, double v) const;
  // The same for the text of a command line; an accepted integer is rewritten
  // in plain decimal for CLI11's conversion.
  std::string refusal_of_text(const std::string& flag, std::string* text) const;

  // Whether every value in range converts to T without loss.
  template <typename T>
  bool fits() const {
    if constexpr (std::is_floating_point_v<T>) return !integral_;
    // Negative markers are parsed as int64: only an int64 holds them all.
    else if (!integral_ || (negative_ && !std::is_same_v<T, int64_t>))
      return false;
    else
      return ilo_ <= ihi_ && ihi_ <= uint64_t(std::numeric_limits<T>::max());
  }
  bool integral() const { return integral_; }

 private:
  std::string refused(const std::string& flag, const std::string& shown, bool below) const;
  bool integral_ = true;
  uint64_t ilo_ = 0, ihi_ = 0;
  double lo_ = 0, hi_ = 0;
  bool lo_open_ = false, hi_open_ = false;
  const char* negative_ = nullptr;
};

namespace detail {
template <typename T>
struct FlagElement {
  using type = T;
};
template <typename T>
struct FlagElement<std::vector<T>> {
  using type = T;
};
}  // namespace detail

// The CLI11 check of a flag held in a T (or a vector of T, checked element by
// element): --help shows range.describe(), a refusal names the flag. Attach it
// with Option::transform, not check: CLI11 discards what a check() rewrites,
// and the rewrite is what makes CLI11 convert the value that was checked.
template <typename T>
CLI::Validator range_check(const std::string& flag, const FlagRange& range) {
  using E = typename detail::FlagElement<T>::type;
  if (!range.fits<E>())
    throw std::logic_error("flag " + flag + ": range " + range.describe() +
                           " does not fit its C++ type");
  return CLI::Validator(
      [flag, range](std::string& text) { return range.refusal_of_text(flag, &text); },
      range.describe());
}

// add_option with its range check (see range_check).
template <typename T>
CLI::Option* add_ranged(CLI::App& app, const std::string& flag, T& value, const std::string& help,
                        const FlagRange& range) {
  return app.add_option(flag, value, help)->transform(range_check<T>(flag, range));
}

// CLI11 reports a failed check as "NAME: MESSAGE", with no name for a hidden
// flag; a range check's message names the flag itself. Throws it as ncf::Error
// (the programs' usual "PROGRAM: error:" line and exit code 1) when `e` is
// one; returns otherwise.
void throw_if_range_refusal(const CLI::ParseError& e);

// CLI11 splits a list flag's value at its delimiter and drops the empty
// pieces, so "--layers 64,,8" would be read as 64,8. Refuses (ncf::Error
// naming the flag and the value) a value of one of `flags` in argv, as
// "--flag V" or "--flag=V", with an empty entry between, before or after
// `delimiter`s. Call before CLI::App::parse.
void refuse_empty_list_entries(int argc, const char* const* argv,
                               const std::vector<std::string>& flags, char delimiter = ',');

}  // namespace ncf
