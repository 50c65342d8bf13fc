// `ncf_prep --verify`: walks every record of a dataset directory through the
// same ShardCursor and decoders the readers use, plus whole-file sizes and CRCs.
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/check.h"
#include "common/file_io.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/id_map.h"

namespace ncf {

namespace {

void check_file_against_meta(const std::string& path, uint64_t bytes, uint32_t crc) {
  uint64_t got_bytes;
  uint32_t got_crc;
  file_crc32c(path, &got_bytes, &got_crc);
  if (got_bytes != bytes)
    NCF_FAIL(path, ": file has ", got_bytes, " bytes but the metadata says ", bytes,
             "; re-run ncf_prep");
  if (got_crc != crc) {
    char msg[80];
    std::snprintf(msg, sizeof msg, "file CRC-32C 0x%08x does not match the metadata's 0x%08x",
                  got_crc, crc);
    NCF_FAIL(path, ": ", msg, "; re-run ncf_prep");
  }
}

// An extension's lineage (extend.h): its counts add up; with the parent where
// the metadata says it is (and of the recorded id), the parent's kept ids come
// first in the parent's order, the new ones are not the parent's, and the
// dropped ones are the parent's ids (or new ones) absent here. Returns a line
// for the summary.
std::string check_lineage(const std::string& dir, const DatasetMeta& meta, const IdMaps& maps) {
  const std::string path = dir + "/" + kMetadataFile;
  const nlohmann::json& l = meta.lineage;
  const nlohmann::json& parent = l.at("parent");
  const std::vector<std::string> ancestors = meta.ancestors();
  if (ancestors.empty() || ancestors[0] != parent.value("dataset_id", ""))
    NCF_FAIL(path, ": lineage.ancestors does not start with the parent ",
             parent.value("dataset_id", "?"));
  uint64_t kept[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const char* which = k == 0 ? "users" : "items";
    const nlohmann::json& c = l.at(which);
    const uint64_t n = k == 0 ? meta.num_users : meta.num_items;
    kept[k] = c.at("kept").get<uint64_t>();
    const uint64_t p = c.at("parent").get<uint64_t>();
    if (kept[k] + c.at("new").get<uint64_t>() != n ||
        kept[k] + c.at("dropped").get<uint64_t>() != p ||
        p != parent.at(k == 0 ? "num_users" : "num_items").get<uint64_t>())
      NCF_FAIL(path, ": lineage.", which, " ", c.dump(), " does not add up to ", n, " ", which,
               " and the parent's ", p);
    if (!meta.dropped_ids.empty() &&
        meta.dropped_ids[size_t(k)].count !=
            c.at("dropped").get<uint64_t>() + c.at("new_dropped").get<uint64_t>())
      NCF_FAIL(path, ": ", meta.dropped_ids[size_t(k)].name, " lists ",
               meta.dropped_ids[size_t(k)].count, " ids, lineage.", which, " counts ",
               c.at("dropped").get<uint64_t>() + c.at("new_dropped").get<uint64_t>());
  }
  const std::string pdir = parent.value("path", "");
  std::error_code ec;
  if (pdir.empty() || !std::filesystem::exists(pdir + "/" + kMetadataFile, ec))
    return detail::concat("lineage counts checked; the parent ", parent.at("dataset_id"),
                          " is not at ", pdir, " to compare ids with");
  const DatasetMeta pm = DatasetMeta::load(pdir);
  if (pm.dataset_id != parent.at("dataset_id").get<std::string>())
    return detail::concat("lineage counts checked; ", pdir, " now holds dataset ", pm.dataset_id,
                          ", not the parent ", parent.at("dataset_id"));
  const IdMaps pmaps = load_id_maps(pdir, pm);
  for (int k = 0; k < 2; ++k) {
    const IdMap& now = k == 0 ? maps.user : maps.item;
    const IdMap& before = k == 0 ? pmaps.user : pmaps.item;
    int64_t last = -1;
    for (int64_t d = 0; d < now.size(); ++d) {
      const int64_t p = before.find_same(now, d);
      const bool known = uint64_t(d) < kept[k];
      if (known != (p >= 0) || (known && p <= last))
        NCF_FAIL(dir, ": ", k == 0 ? "user" : "item", " ", now.text(d), " (dense id ", d, ") is ",
                 p >= 0 ? detail::concat("the parent's ", p) : "not the parent's",
                 ", but the lineage has the parent's kept ids first, in the parent's order, then "
                 "the new ones");
      if (known) last = p;
    }
  }
  // The dropped ids: none is here; the parent's among them are as many as
  // the lineage says it dropped.
  if (!meta.dropped_ids.empty()) {
    const IdMaps dropped = load_id_maps(
        meta.dropped_ids, meta.dropped_ids[0].count, meta.dropped_ids[1].count,
        [&](const std::string& name, int64_t off, void* data, size_t n) {
          FileHandle(dir + "/" + name, O_RDONLY).read_at(off, data, n);
        },
        [&](const std::string& name) { return FileHandle(dir + "/" + name, O_RDONLY).size(); },
        dir);
    for (int k = 0; k < 2; ++k) {
      const IdMap& gone = k == 0 ? dropped.user : dropped.item;
      const IdMap& now = k == 0 ? maps.user : maps.item;
      const IdMap& before = k == 0 ? pmaps.user : pmaps.item;
      uint64_t of_parent = 0;
      for (int64_t d = 0; d < gone.size(); ++d) {
        if (now.find_same(gone, d) >= 0)
          NCF_FAIL(dir, ": ", meta.dropped_ids[size_t(k)].name, " lists ", gone.text(d),
                   ", which the dataset still has");
        of_parent += before.find_same(gone, d) >= 0;
      }
      const char* which = k == 0 ? "users" : "items";
      if (of_parent != l.at(which).at("dropped").get<uint64_t>())
        NCF_FAIL(dir, ": ", meta.dropped_ids[size_t(k)].name, " lists ", of_parent,
                 " of the parent's ids, lineage.", which, ".dropped says ",
                 l.at(which).at("dropped").get<uint64_t>());
    }
  }
  return detail::concat("lineage checked against the parent ", pm.dataset_id, " (", pdir, ")");
}

}  // namespace

VerifySummary verify_dataset(const std::string& dir, bool show_progress) {
  auto t0 = std::chrono::steady_clock::now();
  VerifySummary sum;
  DatasetMeta meta = DatasetMeta::load(dir);
  sum.warning = meta.unsealed_warning;
  const uint64_t record_rows = meta.train_record_rows, L = uint64_t(meta.eval_negatives) + 1;
  std::vector<int32_t> users(record_rows), items(std::max<uint64_t>(record_rows, L));
  std::vector<uint8_t> mask(L);
  const bool distinct = meta.eval_sampling == eval_sampling_name(EvalSampling::kDistinct);
  std::string payload;
  int64_t last_user = -1;  // of the previous eval record
  for (const char* kind : {"train", "eval"}) {
    auto shards = meta.shards_of(kind);
    const bool train = std::strcmp(kind, "train") == 0;
    for (uint32_t s = 0; s < shards.size(); ++s) {
      ShardCursor cur(dir, meta, kind, s);
      const ShardInfo& si = cur.info();
      const std::string& path = cur.path();
      uint64_t rows = 0, off = 0;
      if (!train && s == 0) last_user = -1;
      for (uint64_t k = 0; cur.next(&payload, &off); ++k) {
        const uint64_t g = si.first_record + k;
        if (train) {
          const uint64_t valid = train_record_valid_rows(meta, g);
          decode_train_record(payload, meta, valid, path, off, users.data(), items.data());
          rows += valid;
        } else {
          last_user =
              decode_eval_record(payload, meta, g, last_user, path, off, items.data(), mask.data());
          // The metadata's word for how the lists were drawn is checked where
          // the list can show it: distinct lists repeat nothing.
          if (distinct) {
            const size_t j = size_t(std::find(mask.begin(), mask.end(), 0) - mask.begin());
            if (j < L)
              NCF_FAIL(path, " at byte offset ", off, ": the eval list of user ", last_user,
                       " repeats item ", items[j], " at position ", j,
                       ", but the metadata says its negatives are distinct");
          }
          rows += L;
        }
      }
      if (rows != si.num_valid_rows)
        NCF_FAIL(path, ": ", rows, " valid rows but the metadata says ", si.num_valid_rows);
      check_file_against_meta(path, si.bytes, si.crc32c);
      (train ? sum.train_records : sum.eval_records) += si.num_records;
      if (train) sum.train_rows += rows;
      sum.bytes += si.bytes;
      ++sum.num_shards;
      if (show_progress)
        std::fprintf(stderr, "\rverify: %s ok (%llu records)        ", si.name.c_str(),
                     static_cast<unsigned long long>(si.num_records));
    }
  }
  if (show_progress) std::fprintf(stderr, "\n");
  if (sum.train_records != meta.num_train_records())
    NCF_FAIL(dir, ": found ", sum.train_records, " train records, the metadata needs ",
             meta.num_train_records());

  // positives.bin: sizes, CRC, then every list sorted, distinct and in range.
  const std::string pos_path = dir + "/" + kPositivesFile;
  check_file_against_meta(pos_path, meta.positives_bytes, meta.positives_crc32c);
  check_positive_lists(PositiveLists(dir, meta), meta, pos_path);
  sum.bytes += meta.positives_bytes;
  // The id maps: sizes, CRCs, ascending (or distinct) ids.
  const IdMaps maps = load_id_maps(dir, meta);
  for (const IdMapInfo& m : meta.id_maps) sum.bytes += m.bytes;
  // The files beside them: each id's activity, an extension's dropped ids.
  for (const std::vector<IdMapInfo>* files : {&meta.activity, &meta.dropped_ids})
    for (const IdMapInfo& f : *files) {
      check_file_against_meta(dir + "/" + f.name, f.bytes, f.crc32c);
      sum.bytes += f.bytes;
    }
  if (meta.lineage.is_object()) sum.lineage = check_lineage(dir, meta, maps);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace ncf
