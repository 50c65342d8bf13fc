// Fuzz target: ncf_recommend's --users and --pairs lists (train/
// recommend_lists.h): the CSV text reader (parse_csv_text), the header and
// blank-line rules, integer and string ids through the dataset's id maps.
//
// Input: files separated by fuzz::kFileSep:
//   0: a mode byte, then the list (the --users value, or the file's text);
//   1: the user ids, 2: the item ids, one a line: the maps built from them
//      (sorted, repeats dropped) are string maps when mode bit 2 (users) /
//      bit 3 (items) is set, integer maps of the lines that are integers
//      otherwise, or identity maps of that many ids when bit 4 is set.
//   mode % 4: 0 --users given inline, 1 --users naming a file that holds the
//   list, 2 --pairs naming that file, 3 --users all.
// Property: every id read is a dense id of its map.
#include <algorithm>
#include <charconv>
#include <filesystem>

#include "data/id_map.h"
#include "fuzz_util.h"
#include "train/recommend_lists.h"

using namespace ncf;

namespace {

IdMap make_map(const std::string& text, bool strings, bool identity) {
  std::vector<std::string> lines = fuzz::split(text, "\n");
  if (identity) return IdMap(int64_t(lines.size()));
  if (strings) {
    std::sort(lines.begin(), lines.end());
    lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
    StringList ids;
    for (const std::string& s : lines)
      if (!s.empty()) ids.push_back(s);
    return IdMap(std::move(ids));
  }
  std::vector<int64_t> raw;
  for (const std::string& s : lines) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) raw.push_back(v);
  }
  std::sort(raw.begin(), raw.end());
  raw.erase(std::unique(raw.begin(), raw.end()), raw.end());
  return IdMap(std::move(raw));
}

void in_map(const std::vector<int32_t>& ids, const IdMap& map) {
  for (int32_t d : ids)
    if (d < 0 || d >= map.size()) fuzz::property_failed("a listed id outside its map");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<std::string> parts = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), fuzz::kFileSep);
  parts.resize(3);
  const IdMaps maps{make_map(parts[1], mode & 4, mode & 16),
                    make_map(parts[2], mode & 8, mode & 16)};
  const std::string data_dir = fuzz::in_scratch("data");
  const std::string list = fuzz::in_scratch("list.csv");
  switch (mode % 4) {
    case 0:
      // An inline list (not "all", and no path, which would name a file):
      // its refusals name the flag, and the entry, instead of a file.
      {
        std::error_code ec;
        if (parts[0] == "all" || parts[0].find('/') != std::string::npos ||
            std::filesystem::exists(parts[0], ec))
          break;
      }
      fuzz::refused_or_ran("--users",
                           [&] { in_map(read_users(parts[0], data_dir, maps.user), maps.user); });
      break;
    case 1:
      fuzz::write_file(list, parts[0]);
      fuzz::refused_or_ran(list, [&] { in_map(read_users(list, data_dir, maps.user), maps.user); });
      break;
    case 2: {
      fuzz::write_file(list, parts[0]);
      std::vector<int32_t> users, items;
      if (!fuzz::refused_or_ran(list, [&] { read_pairs(list, data_dir, maps, &users, &items); }))
        break;
      if (users.size() != items.size()) fuzz::property_failed("pairs of unequal lengths");
      in_map(users, maps.user);
      in_map(items, maps.item);
      break;
    }
    case 3:
      in_map(read_users("all", data_dir, maps.user), maps.user);
      break;
  }
  return 0;
}
