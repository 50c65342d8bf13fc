// Dataset metadata: metadata.json written, read and checked (dataset.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <type_traits>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"
#include "data/dataset.h"
#include "data/format.h"

namespace ncf {

// ---------------------------------------------------------------- metadata ---

uint64_t DatasetMeta::num_train_records() const {
  return train_record_rows ? (num_train + train_record_rows - 1) / train_record_rows : 0;
}

std::vector<const ShardInfo*> DatasetMeta::shards_of(const std::string& kind) const {
  std::vector<const ShardInfo*> out;
  for (const auto& s : shards)
    if (s.kind == kind) out.push_back(&s);
  return out;
}

nlohmann::json DatasetMeta::to_json() const {
  nlohmann::json j;
  j["format_version"] = format_version;
  j["dataset_id"] = dataset_id;
  j["source"] = source;
  j["num_users"] = num_users;
  j["num_items"] = num_items;
  j["num_train"] = num_train;
  j["num_positives"] = num_positives;
  j["num_eval_users"] = num_eval_users;
  j["eval_negatives"] = eval_negatives;
  if (eval_masks_given) j["eval_masks"] = "given";
  if (!eval_sampling.empty()) j["eval_sampling"] = eval_sampling;
  j["train_record_rows"] = train_record_rows;
  j["train_frame_bytes"] = train_frame_bytes;
  j["eval_frame_bytes"] = eval_frame_bytes;
  j["dropped_users"] = dropped_users;
  j["seed"] = seed;
  j["generator"] = generator;
  nlohmann::json sh = nlohmann::json::array();
  for (const auto& s : shards)
    sh.push_back({{"name", s.name},
                  {"kind", s.kind},
                  {"first_record", s.first_record},
                  {"num_records", s.num_records},
                  {"num_valid_rows", s.num_valid_rows},
                  {"bytes", s.bytes},
                  {"crc32c", s.crc32c}});
  j["shards"] = sh;
  j["positives"] = {
      {"name", kPositivesFile}, {"bytes", positives_bytes}, {"crc32c", positives_crc32c}};
  if (!id_maps.empty()) {
    nlohmann::json maps;
    for (size_t k = 0; k < id_maps.size(); ++k)
      maps[k == 0 ? "user" : "item"] = id_map_json(id_maps[k]);
    j["id_maps"] = maps;
  }
  if (!activity.empty())
    j["activity"] = {{"user", id_map_json(activity[0])}, {"item", id_map_json(activity[1])}};
  if (!lineage.is_null()) {
    j["lineage"] = lineage;
    if (!dropped_ids.empty())
      j["lineage"]["dropped_ids"] = {{"user", id_map_json(dropped_ids[0])},
                                     {"item", id_map_json(dropped_ids[1])}};
  }
  return j;
}

uint64_t DatasetMeta::generation() const {
  return lineage.is_object() ? lineage.value("generation", uint64_t{0}) : 0;
}

std::vector<std::string> DatasetMeta::ancestors() const {
  if (!lineage.is_object() || !lineage.contains("ancestors")) return {};
  return lineage.at("ancestors").get<std::vector<std::string>>();
}

namespace {

std::string hex32(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

template <typename T>
T get_field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.is_object() || !j.contains(key)) NCF_FAIL(path, ": metadata field '", key, "' is missing");
  const nlohmann::json& v = j.at(key);
  if constexpr (std::is_integral_v<T>) {
    // Counts, sizes and CRCs are JSON integers the field's type holds:
    // nlohmann's get<T> would convert a float (undefined behaviour when it is
    // out of range), wrap a negative and cut a wide value, each silently.
    static_assert(std::is_unsigned_v<T>, "metadata integers are unsigned");
    const bool integer = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    if (!integer || v.get<uint64_t>() > std::numeric_limits<T>::max())
      NCF_FAIL(path, ": metadata field '", key, "' must be an integer in [0, ",
               uint64_t(std::numeric_limits<T>::max()), "], got ", v.dump());
    return static_cast<T>(v.get<uint64_t>());
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      NCF_FAIL(path, ": metadata field '", key, "' has the wrong type (", v.dump(), ")");
    }
  }
}

}  // namespace

nlohmann::json id_map_json(const IdMapInfo& info) {
  nlohmann::json e = {
      {"name", info.name}, {"count", info.count}, {"bytes", info.bytes}, {"crc32c", info.crc32c}};
  if (info.strings) e["kind"] = "string";
  if (!info.ascending) e["order"] = "lineage";
  return e;
}

IdMapInfo id_map_from_json(const nlohmann::json& e, const std::string& path,
                           const std::string& field) {
  IdMapInfo info;
  info.name = get_field<std::string>(e, "name", path);
  info.count = get_field<uint64_t>(e, "count", path);
  info.bytes = get_field<uint64_t>(e, "bytes", path);
  info.crc32c = get_field<uint32_t>(e, "crc32c", path);
  if (e.contains("kind")) {
    const std::string kind = get_field<std::string>(e, "kind", path);
    if (kind != "string" && kind != "int64")
      NCF_FAIL(path, ": ", field, ".kind is '", kind, "' (expected int64 or string)");
    info.strings = kind == "string";
  }
  if (e.contains("order")) {
    const std::string order = get_field<std::string>(e, "order", path);
    if (order != "lineage" && order != "ascending")
      NCF_FAIL(path, ": ", field, ".order is '", order, "' (expected ascending or lineage)");
    info.ascending = order == "ascending";
  }
  if (info.name.empty() || info.name.find('/') != std::string::npos || info.name == "." ||
      info.name == "..")
    NCF_FAIL(path, ": ", field, ".name '", info.name, "' is not a plain file name");
  return info;
}

namespace {

// The counts and the eval and record layout fields.
void scalars_from_json(const nlohmann::json& j, const std::string& path, DatasetMeta& m) {
  m.format_version = get_field<uint32_t>(j, "format_version", path);
  if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion)
    NCF_FAIL(path, ": format_version ", m.format_version, " is not supported (this build reads ",
             kOldestFormatVersion, " to ", kFormatVersion, "): re-run this build's ncf_prep");
  m.dataset_id = get_field<std::string>(j, "dataset_id", path);
  m.source = get_field<std::string>(j, "source", path);
  m.num_users = get_field<uint64_t>(j, "num_users", path);
  m.num_items = get_field<uint64_t>(j, "num_items", path);
  m.num_train = get_field<uint64_t>(j, "num_train", path);
  m.num_positives = get_field<uint64_t>(j, "num_positives", path);
  m.num_eval_users = get_field<uint64_t>(j, "num_eval_users", path);
  m.eval_negatives = get_field<uint32_t>(j, "eval_negatives", path);
  if (j.contains("eval_masks")) {
    const auto masks = get_field<std::string>(j, "eval_masks", path);
    if (masks != "given")
      NCF_FAIL(path, ": metadata field 'eval_masks' is '", masks, "', expected 'given' or absent");
    m.eval_masks_given = true;
  }
  if (j.contains("eval_sampling")) {
    m.eval_sampling = get_field<std::string>(j, "eval_sampling", path);
    if (m.eval_sampling != "distinct" && m.eval_sampling != "with_replacement" &&
        m.eval_sampling != "given")
      NCF_FAIL(path, ": metadata field 'eval_sampling' is '", m.eval_sampling,
               "', expected 'distinct', 'with_replacement' or 'given'");
    // Masks a source gave came with its own lists: drawn lists carry ours.
    if (m.eval_masks_given && m.eval_sampling != "given")
      NCF_FAIL(path, ": metadata says 'eval_masks': 'given' with 'eval_sampling': '",
               m.eval_sampling, "'; given masks come only with given eval lists");
  }
  m.train_record_rows = get_field<uint32_t>(j, "train_record_rows", path);
  m.train_frame_bytes = get_field<uint64_t>(j, "train_frame_bytes", path);
  m.eval_frame_bytes = get_field<uint64_t>(j, "eval_frame_bytes", path);
  m.dropped_users = get_field<uint64_t>(j, "dropped_users", path);
  m.seed = get_field<uint64_t>(j, "seed", path);
  if (j.contains("generator")) m.generator = j["generator"];
}

// The shard list and positives.bin's size and CRC.
void files_from_json(const nlohmann::json& j, const std::string& path, DatasetMeta& m) {
  const auto& sh = j.contains("shards") ? j["shards"] : nlohmann::json();
  if (!sh.is_array()) NCF_FAIL(path, ": metadata field 'shards' is missing or not a list");
  for (const auto& s : sh) {
    ShardInfo si;
    si.name = get_field<std::string>(s, "name", path);
    si.kind = get_field<std::string>(s, "kind", path);
    si.first_record = get_field<uint64_t>(s, "first_record", path);
    si.num_records = get_field<uint64_t>(s, "num_records", path);
    si.num_valid_rows = get_field<uint64_t>(s, "num_valid_rows", path);
    si.bytes = get_field<uint64_t>(s, "bytes", path);
    si.crc32c = get_field<uint32_t>(s, "crc32c", path);
    if (si.kind != "train" && si.kind != "eval")
      NCF_FAIL(path, ": shard '", si.name, "' has unknown kind '", si.kind, "'");
    if (si.name.find('/') != std::string::npos)
      NCF_FAIL(path, ": shard name '", si.name, "' must be a plain file name");
    m.shards.push_back(si);
  }
  const auto& pos = j.contains("positives") ? j["positives"] : nlohmann::json();
  m.positives_bytes = get_field<uint64_t>(pos, "bytes", path);
  m.positives_crc32c = get_field<uint32_t>(pos, "crc32c", path);
}

// The id maps, the activity files and the lineage (with its dropped ids).
void ids_from_json(const nlohmann::json& j, const std::string& path, DatasetMeta& m) {
  if (j.contains("id_maps")) {
    const auto& maps = j["id_maps"];
    for (const char* which : {"user", "item"}) {
      if (!maps.is_object() || !maps.contains(which))
        NCF_FAIL(path, ": metadata field 'id_maps' has no '", which, "' entry");
      const IdMapInfo info = id_map_from_json(maps[which], path, std::string("id_maps.") + which);
      const uint64_t want = which[0] == 'u' ? m.num_users : m.num_items;
      // int64: 8 bytes an id; string: the offsets and at least a byte an id.
      const bool size_fits =
          info.strings ? info.bytes >= info.count * 9 + 8 : info.bytes == info.count * 8;
      if (info.name.find('/') != std::string::npos || info.count != want || !size_fits)
        NCF_FAIL(path, ": id_maps.", which, " (", info.name, ", ", info.count, " ids, ", info.bytes,
                 " bytes) does not fit ", want, " ", which, "s");
      m.id_maps.push_back(info);
    }
  }
  // Per-id files beside the maps: [user, item] entries of the map layout.
  auto pair_of_files = [&](const nlohmann::json& e, const std::string& field, bool counted,
                           bool strings_ok, std::vector<IdMapInfo>* out) {
    for (const char* which : {"user", "item"}) {
      if (!e.is_object() || !e.contains(which))
        NCF_FAIL(path, ": metadata field '", field, "' has no '", which, "' entry");
      IdMapInfo info = id_map_from_json(e[which], path, field + "." + which);
      const uint64_t want = which[0] == 'u' ? m.num_users : m.num_items;
      if ((counted && (info.count != want || info.bytes != info.count * 16)) ||
          (!strings_ok && info.strings))
        NCF_FAIL(path, ": ", field, ".", which, " (", info.name, ", ", info.count, " ids, ",
                 info.bytes, " bytes) does not fit ", want, " ", which, "s");
      out->push_back(info);
    }
  };
  if (j.contains("activity")) pair_of_files(j["activity"], "activity", true, false, &m.activity);
  if (j.contains("lineage")) {
    m.lineage = j["lineage"];
    if (!m.lineage.is_object() || !m.lineage.contains("generation") ||
        !m.lineage["generation"].is_number_unsigned() || !m.lineage.contains("ancestors") ||
        !m.lineage["ancestors"].is_array() || !m.lineage.contains("parent") ||
        !m.lineage["parent"].is_object())
      NCF_FAIL(path, ": metadata field 'lineage' needs generation, parent and ancestors");
    for (const auto& a : m.lineage["ancestors"])
      if (!a.is_string()) NCF_FAIL(path, ": lineage.ancestors holds ", a.dump(), ", not an id");
    if (m.lineage.contains("dropped_ids")) {
      pair_of_files(m.lineage["dropped_ids"], "lineage.dropped_ids", false, true, &m.dropped_ids);
      m.lineage.erase("dropped_ids");
    }
    if (m.format_version < 3)
      NCF_FAIL(path, ": a 'lineage' in a format version ", m.format_version,
               " dataset (extensions are version 3)");
  }
}

// Internal consistency, so readers can trust the numbers.
void check_meta(const std::string& path, const DatasetMeta& m) {
  if (m.num_eval_users > m.num_users || (m.num_eval_users < m.num_users && m.format_version < 3))
    NCF_FAIL(path, ": num_eval_users ", m.num_eval_users, " with num_users ", m.num_users,
             " (only an extension, format version 3, evaluates fewer users than it has)");

  if (m.num_users == 0 || m.num_items == 0)
    NCF_FAIL(path, ": num_users ", m.num_users, " and num_items ", m.num_items, " must be > 0");
  if (m.num_users > INT32_MAX || m.num_items > INT32_MAX)
    NCF_FAIL(path, ": ids must fit int32 (num_users ", m.num_users, ", num_items ", m.num_items,
             ")");
  if (m.train_record_rows == 0 || m.train_record_rows > kMaxRecordRows)
    NCF_FAIL(path, ": train_record_rows ", m.train_record_rows, " is outside [1, ", kMaxRecordRows,
             "]");
  if (m.eval_negatives > kMaxEvalNegatives)
    NCF_FAIL(path, ": eval_negatives ", m.eval_negatives, " is more than ", kMaxEvalNegatives);
  uint64_t recs = 0, rows = 0;
  for (const ShardInfo* s : m.shards_of("train")) {
    if (s->first_record != recs)
      NCF_FAIL(path, ": shard ", s->name, " first_record ", s->first_record, ", expected ", recs);
    recs += s->num_records;
    rows += s->num_valid_rows;
  }
  if (recs != m.num_train_records() || rows != m.num_train)
    NCF_FAIL(path, ": train shards hold ", recs, " records / ", rows, " rows but num_train ",
             m.num_train, " with ", m.train_record_rows, " rows per record needs ",
             m.num_train_records(), " records");
  recs = 0;
  for (const ShardInfo* s : m.shards_of("eval")) {
    if (s->first_record != recs)
      NCF_FAIL(path, ": shard ", s->name, " first_record ", s->first_record, ", expected ", recs);
    recs += s->num_records;
  }
  if (recs != m.num_eval_users)
    NCF_FAIL(path, ": eval shards hold ", recs, " records but num_eval_users is ",
             m.num_eval_users);
}

}  // namespace

DatasetMeta DatasetMeta::from_json(const nlohmann::json& j, const std::string& path) {
  DatasetMeta m;
  scalars_from_json(j, path, m);
  files_from_json(j, path, m);
  ids_from_json(j, path, m);
  check_meta(path, m);
  return m;
}

DatasetMeta DatasetMeta::load(const std::string& dir) {
  std::string path = dir + "/" + kMetadataFile;
  std::ifstream f(path);
  if (!f) NCF_FAIL("cannot open dataset metadata ", path, ": ", std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    NCF_FAIL(path, ": not valid JSON at byte ", e.byte, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {
    // The parser throws more than parse_error: a number beyond every JSON
    // number type (1e999) is an out_of_range error.
    NCF_FAIL(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) NCF_FAIL(path, ": not a JSON object");
  // The file's own checksum, before any value in it is used: over the compact
  // dump of everything else (keys sorted), so a changed value anywhere is
  // caught and whitespace is not. Only format version 1 was written without
  // one: a version 2 file that lost the field (or whose version changed) is
  // refused, so one damaged byte cannot pass as an older dataset.
  if (!j.contains("crc32c")) {
    const auto v = j.find("format_version");
    if (v == j.end() || !v->is_number_unsigned() || v->get<uint64_t>() != 1)
      NCF_FAIL(path,
               ": no crc32c field (not written by this ncf_prep): re-run ncf_prep to write the "
               "dataset again");
    DatasetMeta m = from_json(j, path);
    m.unsealed_warning =
        path +
        ": dataset format version 1 (an older ncf_prep): its metadata has no checksum of its "
        "own, so a changed value in it cannot be detected (the shards and positives.bin are "
        "still checked against their CRCs); re-run ncf_prep to write version " +
        std::to_string(kFormatVersion);
    return m;
  }
  // A CRC is an integer below 2^32 (get<uint32_t> would take 4294967297 as 1).
  const nlohmann::json& sealed = j.at("crc32c");
  if (!sealed.is_number_unsigned() || sealed.get<uint64_t>() > 0xffffffffull)
    NCF_FAIL(path, ": metadata field 'crc32c' has the wrong type (", sealed.dump(),
             "): re-run ncf_prep");
  const uint32_t stored = static_cast<uint32_t>(sealed.get<uint64_t>());
  const uint32_t computed = metadata_crc32c(j);
  if (computed != stored)
    NCF_FAIL(path, ": the content does not match its crc32c (", hex32(stored), " stored, ",
             hex32(computed),
             " computed): the file changed after ncf_prep wrote it; re-run ncf_prep");
  j.erase("crc32c");
  return from_json(j, path);
}

void DatasetMeta::save(const std::string& dir) const {
  nlohmann::json j = to_json();
  j["crc32c"] = metadata_crc32c(j);
  write_file_atomic(dir + "/" + kMetadataFile, j.dump(2) + "\n");
}

uint32_t metadata_crc32c(const nlohmann::json& j) {
  std::string canonical;
  if (j.is_object() && j.contains("crc32c")) {
    nlohmann::json rest = j;
    rest.erase("crc32c");
    canonical = rest.dump();
  } else {
    canonical = j.dump();
  }
  return crc32c(canonical.data(), canonical.size());
}

}  // namespace ncf
