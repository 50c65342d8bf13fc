// What every fuzz target shares: the per-process scratch directory the input's
// files are written to (tmpfs when there is one, since the parsers read files
// and directories, never memory), the input cut into files and records at
// separator lines, TFRecord framing with correct CRCs (so structure-aware
// targets get past the checksums to the decoders behind them), small ncf_prep
// options with the check that what it wrote verifies, and the rule that
// decides what a finding is.
//
// The rule: an input may be refused only with a refusal (NCF_FAIL,
// NCF_REQUIRE) whose message names the file it is about; any other exception
// escapes the target and libFuzzer reports it (std::bad_alloc from a size read
// from the input, std::out_of_range, a nlohmann::json exception), as it reports
// crashes, sanitizer errors, timeouts and memory beyond its limits. A refusal
// that names no file is reported too, with its message, and so is an input
// that reaches an internal check (NCF_CHECK, "check failed: ... (file:line)"):
// what input can reach is a refusal, or the check is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/check.h"
#include "data/sources.h"

namespace ncf::fuzz {

// Separates the files of an input ("\n" on both sides so text seeds stay
// readable) and, inside a file that the target frames, its records.
constexpr std::string_view kFileSep = "\n=ncf-fuzz-file=\n";
constexpr std::string_view kRecordSep = "\n=ncf-fuzz-record=\n";

// The input cut at every `sep`: n separators give n + 1 parts.
std::vector<std::string> split(std::string_view in, std::string_view sep);

// This process's scratch directory (created once; /dev/shm when writable,
// else $TMPDIR or /tmp), emptied by reset_scratch() before each input.
const std::string& scratch();
void reset_scratch();
// scratch() + "/" + name.
std::string in_scratch(const std::string& name);

void write_file(const std::string& path, std::string_view bytes);
std::string read_file(const std::string& path);
// A name the target may create inside the scratch directory: no '/', not
// empty, not "." or ".." (the file names an input lists are its own data).
bool safe_name(const std::string& name);

// The records framed as shard files and TF-MG shards are:
// uint64 length | masked CRC of it | payload | masked CRC of the payload.
std::string frame_records(const std::vector<std::string>& payloads);

// CRC-32C of bytes (what metadata.json and manifest.json list for a file).
uint32_t crc_of(std::string_view bytes);

// A checkpoint directory at `path` (created) from an input's parts, as
// fuzz_checkpoint and fuzz_trained_model read them: parts[0] is manifest.json,
// parts[1..] the bytes of the files its "files" list names, in that order
// (names safe_name refuses, and manifest.json itself, are skipped). With `fix`
// each listed file's bytes and crc32c are set to its own; with `reseal` the
// manifest gets its crc32c again. Returns the files written: name, bytes.
std::vector<std::pair<std::string, std::string>> write_checkpoint(
    const std::string& path, const std::vector<std::string>& parts, bool reseal, bool fix);

// A byte of the input's header, or 0 past its end.
inline uint8_t byte_at(std::string_view in, size_t k) {
  return k < in.size() ? static_cast<uint8_t>(in[k]) : 0;
}

// NCF_FUZZ_VERBOSE=1 prints every refusal (to see how far seeds get).
bool verbose();

// Runs fn; an ncf::Error is an expected refusal when it is one (not located:
// no internal check, no library failure) and its message holds one of `names`
// (the file or directory the input was written to, or the flag the fuzzed text
// stands for), a finding otherwise; no names accepts any refusal's message.
// Returns the refusal's message, or "" when fn returned normally.
template <typename Fn>
std::string refusal(std::initializer_list<std::string_view> names, Fn&& fn) {
  try {
    fn();
    return std::string();
  } catch (const ncf::Error& e) {
    const std::string what = e.what();
    if (verbose()) std::fprintf(stderr, "fuzz: refused: %s\n", what.c_str());
    if (e.located()) {
      std::fprintf(stderr, "fuzz: the input reached an internal check, not a refusal:\n  %s\n",
                   what.c_str());
      std::abort();
    }
    bool named = names.size() == 0;
    for (std::string_view n : names) named = named || what.find(n) != std::string::npos;
    if (!named) {
      std::fprintf(stderr, "fuzz: a refusal that does not name %s:\n  %s\n",
                   std::string(*names.begin()).c_str(), what.c_str());
      std::abort();
    }
    return what.empty() ? std::string("(an error without a message)") : what;
  }
}
template <typename Fn>
std::string refusal(std::string_view name, Fn&& fn) {
  return name.empty() ? refusal({}, static_cast<Fn&&>(fn)) : refusal({name}, static_cast<Fn&&>(fn));
}

// The same, true when fn returned normally.
template <typename Fn>
bool refused_or_ran(std::string_view name, Fn&& fn) {
  return refusal(name, static_cast<Fn&&>(fn)).empty();
}
template <typename Fn>
bool refused_or_ran(std::initializer_list<std::string_view> names, Fn&& fn) {
  return refusal(names, static_cast<Fn&&>(fn)).empty();
}

// ncf_prep's options for a fuzzed source, small so an input runs in about a
// millisecond: one thread, records of 3 rows, 2 shards a kind, 1 + knobs % 3
// eval negatives, min_interactions 2 + (knobs / 4) % 2 (ncf_prep's smallest
// is 2).
PrepOptions small_prep(uint8_t knobs);

// A dataset ncf_prep wrote from fuzzed input must pass its own verify
// (verify_dataset: every shard, positives.bin, the id maps): a property.
void check_prepared(const std::string& out_dir);

// A broken property of a successful run (a dataset ncf_prep wrote that its own
// verify refuses, a round trip that changes a value): always a finding.
[[noreturn]] void property_failed(const std::string& what);

}  // namespace ncf::fuzz
