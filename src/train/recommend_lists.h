// ncf_recommend's lists of ids: --users (all, a file of one id a line, or an
// inline comma-separated list) and --pairs (a file of 'user,item' lines), read
// as CSV (csv_reader.h) and turned into dense ids through the dataset's id maps
// (id_map.h). Kept apart from the program's main so the fuzz target
// fuzz/fuzz_recommend_lists.cc calls exactly what ncf_recommend calls. Bad input
// is an ncf::Error naming the flag or the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/csv_reader.h"
#include "data/id_map.h"

namespace ncf {

// The dense id of a user or item given as text (an integer for integer and
// identity maps, the string itself for string maps), or an error naming where
// it came from (`where`, the dataset `data_dir`). `bad_integer` is the message
// for text that is no integer id.
int32_t dense_or_fail(const IdMap& map, const std::string& text, const char* what,
                      const std::string& where, const std::string& data_dir,
                      const std::string& bad_integer);

// The records of the list file `path` given to `flag`; a quoting problem is
// named with its line.
std::vector<CsvTextRecord> read_list_file(const std::string& flag, const std::string& path);

// --users: "all", an existing file (one id a line, an optional header "user"),
// or a comma-separated list of ids.
std::vector<int32_t> read_users(const std::string& users, const std::string& data_dir,
                                const IdMap& map);

// --pairs: a file of 'user,item' lines (an optional header "user,item").
void read_pairs(const std::string& pairs, const std::string& data_dir, const IdMaps& maps,
                std::vector<int32_t>* users, std::vector<int32_t>* items);

}  // namespace ncf
