// `ncf_prep --verify`: walks every record of a dataset directory with the same
// checks the readers apply, plus whole-file sizes and CRCs; and the mapping of
// positives.bin.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "data/dataset.h"
#include "data/shard_format.h"

namespace ncf {

namespace {

void check_file_against_meta(const std::string& path, uint64_t bytes, uint32_t crc) {
  uint64_t got_bytes;
  uint32_t got_crc;
  file_crc32c(path, &got_bytes, &got_crc);
  if (got_bytes != bytes)
    NCF_FAIL(path, ": file has ", got_bytes, " bytes but the metadata says ", bytes);
  if (got_crc != crc)
    NCF_FAIL(path, ": file CRC-32C ", got_crc, " does not match the metadata's ", crc);
}

}  // namespace

VerifySummary verify_dataset(const std::string& dir, bool show_progress) {
  auto t0 = std::chrono::steady_clock::now();
  VerifySummary sum;
  DatasetMeta meta = DatasetMeta::load(dir);
  const uint64_t R = meta.train_record_rows, L = uint64_t(meta.eval_negatives) + 1;
  std::vector<int32_t> users(R), items(std::max<uint64_t>(R, L));
  std::vector<uint8_t> mask(L);
  std::string payload;
  const uint64_t N = meta.num_train_records();
  for (const char* kind : {"train", "eval"}) {
    auto shards = meta.shards_of(kind);
    const bool train = std::strcmp(kind, "train") == 0;
    for (uint32_t s = 0; s < shards.size(); ++s) {
      ShardCursor cur(dir, meta, kind, s);
      const ShardInfo& si = cur.info();
      const std::string& path = cur.path();
      uint64_t rows = 0, off = 0;
      for (uint64_t k = 0; cur.next(&payload, &off); ++k) {
        const uint64_t g = si.first_record + k;
        if (train) {
          const uint64_t valid = train_record_valid_rows(meta, g);
          decode_train_record(payload, meta, valid, path, off, users.data(), items.data());
          rows += valid;
        } else {
          decode_eval_record(payload, meta, g, path, off, items.data(), mask.data());
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
  if (sum.train_records != N)
    NCF_FAIL(dir, ": found ", sum.train_records, " train records, the metadata needs ", N);

  // positives.bin: sizes, CRC, then every list sorted, distinct and in range.
  std::string pos_path = dir + "/" + kPositivesFile;
  check_file_against_meta(pos_path, meta.positives_bytes, meta.positives_crc32c);
  PositiveLists pos(dir, meta);
  for (uint64_t u = 0; u < pos.num_users(); ++u) {
    int64_t a = pos.offsets()[u], b = pos.offsets()[u + 1];
    if (a > b || b > static_cast<int64_t>(pos.nnz()))
      NCF_FAIL(pos_path, ": offsets of user ", u, " are [", a, ", ", b, ")");
    if (a == b) NCF_FAIL(pos_path, ": user ", u, " has no positives");
    for (int64_t k = a; k < b; ++k) {
      int32_t it = pos.items()[k];
      if (it < 0 || static_cast<uint64_t>(it) >= meta.num_items)
        NCF_FAIL(pos_path, " at byte offset ",
                 PositivesLayout::items_offset(meta.num_users) + 4 * k, ": item id ", it,
                 " of user ", u, " out of range [0, ", meta.num_items, ")");
      if (k > a && it <= pos.items()[k - 1])
        NCF_FAIL(pos_path, " at byte offset ",
                 PositivesLayout::items_offset(meta.num_users) + 4 * k, ": positives of user ", u,
                 " are not sorted and distinct");
    }
  }
  sum.bytes += meta.positives_bytes;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

PositiveLists::PositiveLists(const std::string& dir, const DatasetMeta& meta) {
  std::string path = dir + "/" + kPositivesFile;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) NCF_FAIL("cannot open ", path, ": ", std::strerror(errno));
  struct stat st;
  ::fstat(fd, &st);
  const uint64_t want = PositivesLayout::file_bytes(meta.num_users, meta.num_positives);
  if (static_cast<uint64_t>(st.st_size) != want) {
    ::close(fd);
    NCF_FAIL(path, ": file has ", st.st_size, " bytes, the metadata implies ", want);
  }
  map_bytes_ = want;
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    NCF_FAIL("mmap failed on ", path, ": ", std::strerror(errno));
  }
  const auto* h = static_cast<const PositivesLayout::Header*>(map_);
  if (std::memcmp(h->magic, PositivesLayout::kMagic, 8) != 0)
    NCF_FAIL(path, " at byte 0: bad magic (not a positives file)");
  if (h->num_users != meta.num_users || h->nnz != meta.num_positives)
    NCF_FAIL(path, " at byte 8: header says ", h->num_users, " users / ", h->nnz,
             " positives, the metadata ", meta.num_users, " / ", meta.num_positives);
  num_users_ = h->num_users;
  nnz_ = h->nnz;
  offsets_ = reinterpret_cast<const int64_t*>(static_cast<const char*>(map_) + sizeof(*h));
  items_ = reinterpret_cast<const int32_t*>(static_cast<const char*>(map_) +
                                            PositivesLayout::items_offset(num_users_));
  if (offsets_[0] != 0 || offsets_[num_users_] != static_cast<int64_t>(nnz_))
    NCF_FAIL(path, ": offsets run from ", offsets_[0], " to ", offsets_[num_users_],
             ", expected 0 to ", nnz_);
}

PositiveLists::~PositiveLists() {
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace ncf
