// ncf_recommend's --users and --pairs lists: see recommend_lists.h. Moved
// here unchanged from ncf_recommend_main.cc.
#include "train/recommend_lists.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/check.h"
#include "data/text_input.h"

namespace ncf {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") + 1 - a);
}

// An integer id, the whole of `s`; false when it is not one.
bool parse_id(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  size_t used = 0;
  try {
    *v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == s.size();
}

// An id as a message shows it: bounded, control characters escaped.
std::string shown(const std::string& id) { return excerpt(id.data(), id.data() + id.size()); }

bool blank(const CsvTextRecord& r) { return r.fields.size() == 1 && trim(r.fields[0]).empty(); }

}  // namespace

int32_t dense_or_fail(const IdMap& map, const std::string& text, const char* what,
                      const std::string& where, const std::string& data_dir,
                      const std::string& bad_integer) {
  std::optional<int64_t> d;
  if (map.strings()) {
    d = map.find(text);
  } else {
    int64_t v = 0;
    if (!parse_id(trim(text), &v)) NCF_FAIL(bad_integer);
    d = map.dense(v);
  }
  if (!d)
    NCF_FAIL(where, ": ", what, " ", map.strings() ? shown(text) : trim(text),
             " is not in the dataset ", data_dir, " (", map.size(), " ", what, "s)");
  return int32_t(*d);
}

std::vector<CsvTextRecord> read_list_file(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) NCF_FAIL(flag, " ", path, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<CsvTextRecord> recs = parse_csv_text(ss.str(), ',');
  for (const auto& r : recs)
    if (r.problem != CsvProblem::kNone)
      NCF_FAIL(path, ":", r.line, ": ",
               r.problem == CsvProblem::kStrayQuote ? "stray quote" : "unterminated quote",
               " (a quoted id is \"...\", with \"\" for a quote inside): '", shown(r.text), "'");
  return recs;
}

std::vector<int32_t> read_users(const std::string& users, const std::string& data_dir,
                                const IdMap& map) {
  std::vector<int32_t> out;
  if (users == "all") {
    out.resize(size_t(map.size()));
    for (size_t u = 0; u < out.size(); ++u) out[u] = int32_t(u);
    return out;
  }
  // A list is not a file name: one of 256 characters or more (about 60 ids)
  // makes stat fail with ENAMETOOLONG, which the throwing overload would turn
  // into an exception naming no flag.
  std::error_code not_a_file;
  if (fs::is_regular_file(users, not_a_file)) {
    for (const CsvTextRecord& r : read_list_file("--users", users)) {
      if (blank(r) || (r.line == 1 && r.fields.size() == 1 && trim(r.fields[0]) == "user"))
        continue;
      const std::string where = users + ":" + std::to_string(r.line);
      if (r.fields.size() != 1)
        NCF_FAIL(where, ": expected one user id a line, got '", shown(r.text), "'",
                 map.strings() ? " (quote an id that holds a comma)" : "");
      out.push_back(dense_or_fail(map, r.fields[0], "user", where, data_dir,
                                  where + ": expected a user id, got '" + trim(r.text) + "'"));
    }
    if (out.empty()) NCF_FAIL("--users ", users, ": the file lists no user");
    return out;
  }
  int k = 0;
  for (const CsvTextRecord& r : parse_csv_text(users, ','))
    for (const std::string& tok : r.fields) {
      ++k;
      if (r.problem != CsvProblem::kNone)
        NCF_FAIL("--users '", shown(users), "': a quote must enclose a whole id (entry ", k, ")");
      out.push_back(dense_or_fail(map, tok, "user", "--users entry " + std::to_string(k), data_dir,
                                  detail::concat("--users '", users,
                                                 "' is neither all, an existing file, nor a "
                                                 "comma-separated list of user ids (entry ",
                                                 k, " is '", tok, "')")));
    }
  if (out.empty()) NCF_FAIL("--users '", users, "' lists no user");
  return out;
}

void read_pairs(const std::string& pairs, const std::string& data_dir, const IdMaps& maps,
                std::vector<int32_t>* users, std::vector<int32_t>* items) {
  const bool strings = maps.user.strings() || maps.item.strings();
  for (const CsvTextRecord& r : read_list_file("--pairs", pairs)) {
    if (blank(r)) continue;
    if (r.line == 1 && r.fields.size() == 2 && trim(r.fields[0]) == "user" &&
        trim(r.fields[1]) == "item")
      continue;
    const std::string where = pairs + ":" + std::to_string(r.line);
    const std::string expected = where + ": expected 'user,item' (two " +
                                 (strings ? "ids" : "integer ids") + "), got '" +
                                 (strings ? shown(r.text) : trim(r.text)) + "'";
    if (r.fields.size() != 2)
      NCF_FAIL(expected, strings ? " (quote an id that holds a comma)" : "");
    users->push_back(dense_or_fail(maps.user, r.fields[0], "user", where, data_dir, expected));
    items->push_back(dense_or_fail(maps.item, r.fields[1], "item", where, data_dir, expected));
  }
  if (users->empty()) NCF_FAIL("--pairs ", pairs, ": the file holds no pair");
}

}  // namespace ncf
