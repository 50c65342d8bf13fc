// See checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <system_error>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"
#include "data/dataset.h"  // metadata_crc32c: manifests are sealed the same way

namespace ncf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormatName = "ncf_dist checkpoint";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kOldPrefix = ".tmp-old-";  // a replaced checkpoint of the same step
constexpr size_t kChunkBytes = size_t(8) << 20;

std::string hex32(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, x);
  return buf;
}

// The step of a committed checkpoint's directory name, or -1.
int64_t step_of(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() != prefix.size() + 12 || name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// True for the names of the directories a writer leaves unfinished:
// .tmp-step-N and .tmp-old-step-N.
bool unfinished_name(const std::string& name) {
  for (const std::string prefix : {kOldPrefix, kTmpPrefix})
    if (name.rfind(prefix, 0) == 0 && step_of(name.substr(prefix.size())) >= 0) return true;
  return false;
}

// Removes `path`, a checkpoint directory this program wrote, and returns "";
// or leaves it as it is and returns why it is not one. `committed`: a step-N
// directory, which must hold its manifest and the files it lists and nothing
// else; otherwise an unfinished one, which must hold regular files only. A
// symbolic link is never removed nor followed.
std::string remove_own_directory(const fs::path& path, bool committed) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (ec) return "cannot inspect it: " + ec.message();
  if (fs::is_symlink(st)) return "it is a symbolic link";
  if (!fs::is_directory(st)) return "it is not a directory";
  std::set<std::string> listed;
  if (committed) {
    try {
      const CheckpointManifest m =
          CheckpointManifest::load((path / kCheckpointManifestFile).string());
      listed.insert(kCheckpointManifestFile);
      for (const CheckpointFile& f : m.files) listed.insert(f.name);
    } catch (const std::exception& e) {
      return "its manifest does not load (" + message_of(e) + ")";
    }
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const fs::file_status s = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_symlink(s)) return "it holds a symbolic link, " + name;
    if (!fs::is_regular_file(s)) return "it holds " + name + ", which is not a regular file";
    if (committed && listed.count(name) == 0)
      return "it holds " + name + ", which its manifest does not list";
    files.push_back(it->path());
  }
  if (ec) return "cannot list it: " + ec.message();
  for (const fs::path& f : files) {
    fs::remove(f, ec);
    if (ec) return "cannot remove " + f.filename().string() + ": " + ec.message();
  }
  fs::remove(path, ec);  // fails, and says so, if something appeared meanwhile
  if (ec) return "cannot remove it: " + ec.message();
  return "";
}

// What makes the committed checkpoint at `path` fail to load that is seen
// without reading its data ("" when nothing is): its manifest, and every
// file's presence and size. Retention counts only checkpoints that pass, so
// that damaged ones never take the place of one that loads.
std::string quick_fault(const fs::path& path) {
  CheckpointManifest m;
  std::error_code ec;
  if (!fs::exists(path / kCheckpointManifestFile, ec))
    return std::string("it is not sealed (no ") + kCheckpointManifestFile + ")";
  try {
    m = CheckpointManifest::load((path / kCheckpointManifestFile).string());
  } catch (const std::exception& e) {
    return "its manifest does not load (" + message_of(e) + ")";
  }
  for (const CheckpointFile& f : m.files) {
    std::error_code ec;
    const fs::file_status st = fs::status(path / f.name, ec);
    if (ec || !fs::is_regular_file(st)) return "file " + f.name + " is missing";
    const uintmax_t size = fs::file_size(path / f.name, ec);
    if (ec) return "file " + f.name + " cannot be read: " + ec.message();
    if (int64_t(size) != f.bytes)
      return "file " + f.name + " has " + std::to_string(size) + " bytes, the manifest says " +
             std::to_string(f.bytes);
  }
  return "";
}

// A note said once per process: retention runs at every checkpoint and would
// otherwise repeat the same lines.
bool first_time(const std::string& note) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(note).second;
}

// Committed checkpoints in dir, newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = step_of(name);
    if (step >= 0 && e.is_directory(ec)) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// An integer field in [lo, hi]: a fraction, a string or a value out of range
// is refused (nlohmann's get<> would cast it silently).
int64_t int_field(const nlohmann::json& j, const char* key, const std::string& path, int64_t lo,
                  int64_t hi) {
  if (!j.is_object() || !j.contains(key))
    NCF_FAIL(path, ": field \"", key, "\" is missing from the checkpoint manifest");
  const nlohmann::json& v = j.at(key);
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))) {
    const int64_t x = v.get<int64_t>();
    if (x >= lo && x <= hi) return x;
  }
  NCF_FAIL(path, ": field \"", key, "\" of the checkpoint manifest must be an integer in [", lo,
           ", ", hi, "], got ", v.dump());
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.is_object() || !j.contains(key))
    NCF_FAIL(path, ": field \"", key, "\" is missing from the checkpoint manifest");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    NCF_FAIL(path, ": field \"", key, "\" of the checkpoint manifest has the wrong type (",
             j.at(key).dump(), ")");
  }
}

}  // namespace

nlohmann::json CheckpointManifest::to_json() const {
  nlohmann::json fj = nlohmann::json::array();
  for (const CheckpointFile& f : files)
    fj.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  nlohmann::json j = {{"format", kFormatName},
                      {"version", kCheckpointFormatVersion},
                      {"step", step},
                      {"epoch", epoch},
                      {"epoch_step", epoch_step},
                      {"world", world},
                      {"dataset_id", dataset_id},
                      {"config", config},
                      {"tables", tables},
                      {"files", fj}};
  if (!id_maps.empty()) {
    nlohmann::json maps = nlohmann::json::array();
    for (const IdMapInfo& info : id_maps) maps.push_back(id_map_json(info));
    j["id_maps"] = maps;
  }
  if (!init_from.is_null()) j["init_from"] = init_from;
  return j;
}

CheckpointManifest CheckpointManifest::from_json(const nlohmann::json& j, const std::string& path) {
  if (field<std::string>(j, "format", path) != kFormatName)
    NCF_FAIL(path, ": not an ncf_dist checkpoint manifest (format ", j.at("format").dump(), ")");
  const nlohmann::json& v = j.at("version");
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kCheckpointFormatVersion)
    NCF_FAIL(path, ": checkpoint format version ", v.dump(), "; this build reads versions 1 to ",
             kCheckpointFormatVersion);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  CheckpointManifest m;
  m.step = int_field(j, "step", path, 0, kMax);
  m.epoch = int_field(j, "epoch", path, 0, kMax);
  m.epoch_step = int_field(j, "epoch_step", path, 0, kMax);
  m.world = int(int_field(j, "world", path, 1, std::numeric_limits<int>::max()));
  m.dataset_id = field<std::string>(j, "dataset_id", path);
  m.config = field<nlohmann::json>(j, "config", path);
  m.tables = field<nlohmann::json>(j, "tables", path);
  if (!m.config.is_object())
    NCF_FAIL(path, ": field \"config\" of the checkpoint manifest must be an object, got ",
             m.config.dump());
  if (!m.tables.is_array())
    NCF_FAIL(path, ": field \"tables\" of the checkpoint manifest must be an array, got ",
             m.tables.dump());
  const nlohmann::json files = field<nlohmann::json>(j, "files", path);
  if (!files.is_array())
    NCF_FAIL(path, ": field \"files\" of the checkpoint manifest must be an array, got ",
             files.dump());
  std::set<std::string> names;
  for (const nlohmann::json& f : files) {
    CheckpointFile cf;
    cf.name = field<std::string>(f, "name", path);
    cf.bytes = int_field(f, "bytes", path, 0, kMax);
    cf.crc32c = uint32_t(int_field(f, "crc32c", path, 0, 0xffffffffll));
    // The names are joined to the checkpoint's directory: only a plain name
    // keeps every read inside it.
    if (cf.name.empty() || cf.name == "." || cf.name == ".." ||
        cf.name.find('/') != std::string::npos || cf.name.find('\0') != std::string::npos ||
        cf.name == kCheckpointManifestFile)
      NCF_FAIL(path, ": file name ", nlohmann::json(cf.name).dump(-1, ' ', true),
               " in the checkpoint manifest is not a plain file name of the checkpoint (no '/', "
               "not \".\" or \"..\", not ",
               kCheckpointManifestFile, ")");
    if (!names.insert(cf.name).second)
      NCF_FAIL(path, ": file ", cf.name, " is listed twice in the checkpoint manifest");
    m.files.push_back(cf);
  }
  if (j.contains("id_maps")) {
    const nlohmann::json& maps = j.at("id_maps");
    if (!maps.is_array() || maps.size() != 2)
      NCF_FAIL(path,
               ": field \"id_maps\" of the checkpoint manifest must be a list of 2 maps, got ",
               maps.dump());
    for (size_t k = 0; k < 2; ++k) {
      IdMapInfo info = id_map_from_json(maps[k], path, k == 0 ? "id_maps[0]" : "id_maps[1]");
      const CheckpointFile& f = m.file(info.name, path);
      if (f.bytes != int64_t(info.bytes) || f.crc32c != info.crc32c)
        NCF_FAIL(path, ": id map ", info.name, " (", info.bytes, " bytes, CRC ", hex32(info.crc32c),
                 ") is not the file the manifest lists (", f.bytes, " bytes, CRC ", hex32(f.crc32c),
                 ")");
      m.id_maps.push_back(info);
    }
  }
  if (j.contains("init_from")) m.init_from = j.at("init_from");
  return m;
}

int64_t checkpoint_table_rows(const CheckpointManifest& m, const std::string& table,
                              const std::string& path) {
  for (const nlohmann::json& t : m.tables)
    if (t.is_object() && t.value("name", "") == table) {
      const auto rows = t.find("rows");
      if (rows == t.end() || !rows->is_number_integer() || rows->get<int64_t>() < 0)
        NCF_FAIL("checkpoint ", path, ": table ", table, " has no valid \"rows\"");
      return rows->get<int64_t>();
    }
  NCF_FAIL("checkpoint ", path, " has no table ", table);
}

CheckpointManifest CheckpointManifest::load(const std::string& path) {
  const std::string text = read_text_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    NCF_FAIL(path, ": not valid JSON at byte ", e.byte, ": ", e.what());
  }
  if (!j.is_object()) NCF_FAIL(path, ": not a JSON object");
  // Its own checksum before any value in it is used, as metadata.json's.
  std::string unsealed;
  const auto crc = j.find("crc32c");
  if (crc == j.end()) {
    const auto v = j.find("version");
    if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != 1)
      NCF_FAIL(path,
               ": no crc32c field: the checkpoint manifest was not written by this ncf_dist, or "
               "was edited");
    unsealed = path +
               ": checkpoint format version 1 (an older ncf_dist): its manifest has no checksum "
               "of its own, so an edit in it cannot be detected (its files are still checked "
               "against their sizes and CRCs)";
  } else {
    if (!crc->is_number_unsigned() || crc->get<uint64_t>() > 0xffffffffull)
      NCF_FAIL(path, ": field \"crc32c\" of the checkpoint manifest has the wrong type (",
               crc->dump(), ")");
    const uint32_t stored = uint32_t(crc->get<uint64_t>());
    const uint32_t computed = checkpoint_manifest_crc32c(j);
    if (stored != computed)
      NCF_FAIL(path, ": the content does not match its crc32c (", hex32(stored), " stored, ",
               hex32(computed), " computed): the manifest changed after ncf_dist wrote it");
    j.erase("crc32c");
  }
  CheckpointManifest m = from_json(j, path);
  m.unsealed_warning = unsealed;
  return m;
}

uint32_t checkpoint_manifest_crc32c(const nlohmann::json& j) { return metadata_crc32c(j); }

const CheckpointFile& CheckpointManifest::file(const std::string& name,
                                               const std::string& path) const {
  for (const CheckpointFile& f : files)
    if (f.name == name) return f;
  NCF_FAIL("checkpoint ", path, " has no file ", name);
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%012lld", static_cast<long long>(step));
  return buf;
}

// ------------------------------------------------------------------ writer ---

CheckpointWriter::CheckpointWriter(Communicator& comm, const std::string& dir, int64_t step)
    : comm_(comm), dir_(dir) {
  const std::string name = checkpoint_name(step);
  tmp_ = (fs::path(dir) / (kTmpPrefix + name)).string();
  final_ = (fs::path(dir) / name).string();
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) NCF_FAIL("flag --checkpoint_dir: cannot create ", dir, ": ", ec.message());
    if (fs::exists(fs::symlink_status(tmp_, ec))) {
      const std::string why = remove_own_directory(tmp_, false);
      if (!why.empty())
        NCF_FAIL("cannot write checkpoint ", name, ": ", tmp_,
                 " is in the way and is not an unfinished checkpoint of this program (", why,
                 "); move it elsewhere");
    }
    fs::create_directory(tmp_, ec);
    if (ec) NCF_FAIL("cannot create ", tmp_, ": ", ec.message());
  }
  comm.barrier();
}

void CheckpointWriter::write(const std::string& name, int64_t bytes, int64_t offset,
                             const void* data, size_t n) {
  begin_part(name, bytes, offset, int64_t(n));
  append(data, n);
  end_part();
}

void CheckpointWriter::begin_part(const std::string& name, int64_t bytes, int64_t offset,
                                  int64_t n) {
  NCF_CHECK(part_name_.empty(), "checkpoint file ", name, ": file ", part_name_, " is still open");
  NCF_CHECK(offset >= 0 && n >= 0 && offset + n <= bytes, "checkpoint file ", name, ": part [",
            offset, ", ", offset + n, ") outside its ", bytes, " bytes");
  const std::string path = (fs::path(tmp_) / name).string();
  // Rank 0 creates and sizes the file; then every rank writes its part.
  if (comm_.rank() == 0) FileHandle(path, O_WRONLY | O_CREAT | O_TRUNC).truncate(bytes);
  comm_.barrier();
  part_name_ = name;
  part_bytes_ = bytes;
  part_offset_ = offset;
  part_n_ = n;
  part_at_ = 0;
  part_crc_ = 0;
  part_flushed_ = off_t(offset);
  if (n > 0) part_file_ = FileHandle(path, O_WRONLY);
}

void CheckpointWriter::append(const void* data, size_t n) {
  NCF_CHECK(part_at_ + int64_t(n) <= part_n_, "checkpoint file ", part_name_, ": ",
            part_at_ + int64_t(n), " bytes appended to a part of ", part_n_);
  // In pieces, each checksummed and handed to writeback at once, so dirty
  // pages never pile up until the kernel throttles the writer; once the piece
  // before is on disk its pages leave the page cache, so a checkpoint of many
  // GB does not push out what training uses or make every new page cost a
  // reclaim. end_part's fsync waits for the last of them.
  const char* p = static_cast<const char*>(data);
  for (size_t at = 0; at < n;) {
    const size_t k = std::min(kChunkBytes, n - at);
    part_crc_ = crc32c_extend(part_crc_, p + at, k);
    const off_t here = off_t(part_offset_ + part_at_);
    part_file_.write_at(here, p + at, k);
    ::sync_file_range(part_file_.fd(), here, off_t(k), SYNC_FILE_RANGE_WRITE);
    if (part_flushed_ < here) {
      ::sync_file_range(
          part_file_.fd(), part_flushed_, here - part_flushed_,
          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(part_file_.fd(), part_flushed_, here - part_flushed_, POSIX_FADV_DONTNEED);
    }
    part_flushed_ = here;
    at += k;
    part_at_ += int64_t(k);
  }
}

void CheckpointWriter::end_part() {
  NCF_CHECK(part_at_ == part_n_, "checkpoint file ", part_name_, ": ", part_at_, " of the part's ",
            part_n_, " bytes were written");
  if (part_n_ > 0) {
    part_file_.sync();
    part_file_.close();
  }
  const std::string name = part_name_;
  part_name_.clear();
  part_flushed_ = 0;
  const std::vector<int64_t> parts =
      gather_all<int64_t>(comm_, {part_offset_, part_n_, int64_t(part_crc_)});
  // The parts must tile the file in rank order; their CRCs then combine.
  uint32_t file_crc = 0;
  int64_t at = 0;
  for (int p = 0; p < comm_.world(); ++p) {
    const int64_t off = parts[3 * p], len = parts[3 * p + 1];
    if (len == 0) continue;
    NCF_CHECK(off == at, "checkpoint file ", name, ": rank ", p, " wrote [", off, ", ", off + len,
              ") but the parts before it end at ", at);
    file_crc = crc32c_combine(file_crc, uint32_t(parts[3 * p + 2]), uint64_t(len));
    at += len;
  }
  NCF_CHECK(at == part_bytes_, "checkpoint file ", name, ": the ranks wrote ", at, " of its ",
            part_bytes_, " bytes");
  files_.push_back({name, part_bytes_, file_crc});
  bytes_ += part_bytes_;
}

std::string CheckpointWriter::commit(CheckpointManifest manifest, int keep) {
  manifest.files = files_;
  comm_.barrier();  // every part is written and fsynced
  if (comm_.rank() == 0) {
    nlohmann::json j = manifest.to_json();
    j["crc32c"] = checkpoint_manifest_crc32c(j);
    write_file_atomic((fs::path(tmp_) / kCheckpointManifestFile).string(), j.dump(1) + "\n");
    sync_directory(tmp_);
    std::error_code ec;
    if (fs::exists(final_, ec)) {
      // The same step written again (a resumed run that stopped where its
      // checkpoint was taken): the new one replaces it only once it is whole.
      const std::string old =
          (fs::path(dir_) / (kOldPrefix + fs::path(final_).filename().string())).string();
      if (fs::exists(fs::symlink_status(old, ec))) {
        const std::string why = remove_own_directory(old, false);
        if (!why.empty())
          NCF_FAIL("cannot replace ", final_, ": ", old,
                   " is in the way and is not an unfinished checkpoint of this program (", why,
                   "); move it elsewhere");
      }
      fs::rename(final_, old, ec);
      if (ec) NCF_FAIL("cannot move ", final_, " aside: ", ec.message());
    }
    fs::rename(tmp_, final_, ec);
    if (ec) NCF_FAIL("cannot rename ", tmp_, " to ", final_, ": ", ec.message());
    sync_directory(dir_);
    // Retention: the newest `keep` committed checkpoints stay (the one just
    // written always); older ones and unfinished ones go, as far as they are
    // this program's. Symbolic links are neither removed nor counted.
    std::vector<std::pair<int64_t, fs::path>> committed;
    std::vector<fs::path> unfinished;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (step_of(name) >= 0)
        committed.emplace_back(step_of(name), it->path());
      else if (unfinished_name(name))
        unfinished.push_back(it->path());
    }
    std::sort(committed.begin(), committed.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    auto leave = [&](const fs::path& p, const std::string& why) {
      const std::string note = "retention left " + p.string() + " alone: " + why;
      if (first_time(note)) notes_.push_back(note);
    };
    auto damaged_at = [&](const fs::path& p) -> const DamagedCheckpoint* {
      for (const DamagedCheckpoint& d : damaged_)
        if (fs::path(d.path).filename() == p.filename()) return &d;
      return nullptr;
    };
    int kept = 0;
    for (const auto& [step, p] : committed) {
      std::error_code lec;
      if (fs::is_symlink(fs::symlink_status(p, lec))) {
        leave(p, "it is a symbolic link (neither removed nor counted among the kept)");
      } else if (p.filename() == fs::path(final_).filename()) {
        ++kept;
      } else if (const DamagedCheckpoint* d = damaged_at(p)) {
        leave(p, "it did not load when this run started (" + d->why +
                     "); neither removed nor counted among the --keep_checkpoints");
      } else if (const std::string why = quick_fault(p); !why.empty()) {
        leave(p, why + "; neither removed nor counted among the --keep_checkpoints");
      } else if (kept < std::max(keep, 1)) {
        ++kept;
      } else {
        const std::string why = remove_own_directory(p, true);
        if (!why.empty()) leave(p, why);
      }
    }
    for (const fs::path& p : unfinished) {
      const std::string why = remove_own_directory(p, false);
      if (!why.empty()) leave(p, why);
    }
    sync_directory(dir_);
  }
  comm_.barrier();
  return final_;
}

void CheckpointWriter::set_damaged(const std::vector<DamagedCheckpoint>& damaged) {
  damaged_ = damaged;
}

// ------------------------------------------------------------------ reader ---

CheckpointReader::CheckpointReader(std::string path, CheckpointManifest manifest)
    : path_(std::move(path)), manifest_(std::move(manifest)) {}

IdMaps CheckpointReader::id_maps() const {
  const int64_t users = checkpoint_table_rows(manifest_, "user", path_);
  const int64_t items = checkpoint_table_rows(manifest_, "item", path_);
  return load_id_maps(
      manifest_.id_maps, uint64_t(users), uint64_t(items),
      [&](const std::string& name, int64_t off, void* data, size_t n) { read(name, off, data, n); },
      [&](const std::string& name) { return bytes(name); }, path_);
}

void CheckpointReader::read(const std::string& name, int64_t offset, void* data, size_t n) const {
  const CheckpointFile& f = manifest_.file(name, path_);
  NCF_CHECK(offset >= 0 && offset + int64_t(n) <= f.bytes, "checkpoint ", path_, ": file ", name,
            " has ", f.bytes, " bytes; asked for [", offset, ", ", offset + int64_t(n), ")");
  if (n == 0) return;
  FileHandle(path_ + "/" + name, O_RDONLY).read_at(offset, data, n);
}

std::string check_checkpoint(Communicator& comm, const std::string& path,
                             CheckpointManifest* manifest) {
  // Every rank parses the manifest itself (the file system is shared).
  std::string why;
  CheckpointManifest m;
  const std::string mpath = (fs::path(path) / kCheckpointManifestFile).string();
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    why = "no such checkpoint directory";
  else if (!fs::exists(mpath, ec))
    why = std::string("no ") + kCheckpointManifestFile + " (unfinished)";
  // A refusal of the manifest or a file becomes the reason the checkpoint is
  // skipped or refused (quoted without its rank); an internal error stays one.
  if (why.empty()) try {
      m = CheckpointManifest::load(mpath);
    } catch (const Error& e) {
      if (e.located()) throw;
      why = e.message();
    } catch (const std::exception& e) {
      why = e.what();
    }
  int64_t ranks_failing = 0;
  for (int64_t x : gather_all<int64_t>(comm, {why.empty() ? 0 : 1})) ranks_failing += x;
  if (!why.empty()) return why;
  if (ranks_failing > 0) return "its manifest could not be read on every rank";
  // Each rank checksums its byte block of every file; the CRCs combine.
  const int W = comm.world(), r = comm.rank();
  std::vector<int64_t> mine;
  std::string local_error;
  std::vector<char> buf;
  for (const CheckpointFile& f : m.files) {
    int64_t first = 0, count = 0;
    block_range(f.bytes, W, r, &first, &count);
    uint32_t crc = 0;
    int64_t size = -1;
    try {
      FileHandle fh((fs::path(path) / f.name).string(), O_RDONLY);
      size = fh.size();
      if (size == f.bytes) {
        buf.resize(std::min<size_t>(kChunkBytes, size_t(count)));
        for (int64_t at = 0; at < count; at += int64_t(buf.size())) {
          const size_t k = size_t(std::min<int64_t>(int64_t(buf.size()), count - at));
          fh.read_at(first + at, buf.data(), k);
          crc = crc32c_extend(crc, buf.data(), k);
        }
      }
    } catch (const std::exception& e) {
      size = -1;  // a read that fails part way is no checksum of the file
      if (local_error.empty()) local_error = e.what();
    }
    mine.insert(mine.end(), {size, int64_t(crc), count});
  }
  const std::vector<int64_t> all = gather_all(comm, mine);
  const size_t per_rank = mine.size();
  for (size_t k = 0; k < m.files.size(); ++k) {
    const CheckpointFile& f = m.files[k];
    uint32_t crc = 0;
    for (int p = 0; p < W; ++p) {
      const int64_t* x = &all[size_t(p) * per_rank + 3 * k];
      if (x[0] < 0)
        return "file " + f.name + " cannot be read" +
               (p == r && !local_error.empty() ? " (" + local_error + ")" : "");
      if (x[0] != f.bytes)
        return "file " + f.name + " has " + std::to_string(x[0]) + " bytes, the manifest says " +
               std::to_string(f.bytes);
      crc = crc32c_combine(crc, uint32_t(x[1]), uint64_t(x[2]));
    }
    if (crc != f.crc32c)
      return "file " + f.name + " has CRC-32C " + hex32(crc) + ", the manifest says " +
             hex32(f.crc32c);
  }
  if (manifest) *manifest = m;
  return "";
}

CheckpointDirListing list_checkpoint_dir(const std::string& dir) {
  CheckpointDirListing out;
  for (const auto& [step, path] : list_checkpoints(dir)) {
    std::error_code ec;
    if (fs::exists(fs::path(path) / kCheckpointManifestFile, ec))
      out.sealed.emplace_back(step, path);
    else
      out.unsealed.emplace_back(step, path);
  }
  return out;
}

namespace {

// Rank 0's listing of `dir`, the same on every rank (a file system's caches
// may show ranks different listings; every rank must check the same
// checkpoints in the same order, or the collectives would not match): each
// step-N directory, newest first, with whether it is sealed.
std::vector<std::pair<int64_t, bool>> shared_listing(Communicator& comm, const std::string& dir) {
  std::vector<int64_t> codes;
  if (comm.rank() == 0) {
    const CheckpointDirListing l = list_checkpoint_dir(dir);
    for (const auto& [step, path] : l.sealed) codes.push_back(step * 2 + 1);
    for (const auto& [step, path] : l.unsealed) codes.push_back(step * 2);
    std::sort(codes.begin(), codes.end(), std::greater<int64_t>());
  }
  int64_t n = int64_t(codes.size());
  all_reduce_sum_on(comm, Device::kCpu, &n, 1, DType::kInt64);
  codes.resize(size_t(n), 0);
  if (n > 0) all_reduce_sum_on(comm, Device::kCpu, codes.data(), codes.size(), DType::kInt64);
  std::vector<std::pair<int64_t, bool>> out;
  for (int64_t c : codes) out.emplace_back(c / 2, c % 2 == 1);
  return out;
}

// "DIR/step-…60: why; DIR/step-…40: why"
std::string damaged_list(const std::vector<DamagedCheckpoint>& bad) {
  std::string s;
  for (const DamagedCheckpoint& d : bad) s += (s.empty() ? "" : "; ") + d.path + ": " + d.why;
  return s;
}

std::string sealed_count(size_t n) {
  return std::to_string(n) + " sealed checkpoint" + (n == 1 ? "" : "s");
}

// The newest sealed checkpoint in `dir` that loads, or none; the sealed ones
// newer than it (all of them when none loads) in *bad, and lines for the log.
std::optional<CheckpointReader> newest_loadable(Communicator& comm, const std::string& dir,
                                                std::vector<std::string>* log,
                                                std::vector<DamagedCheckpoint>* bad,
                                                size_t* unsealed) {
  bad->clear();
  *unsealed = 0;
  for (const auto& [step, sealed] : shared_listing(comm, dir)) {
    const std::string path = (fs::path(dir) / checkpoint_name(step)).string();
    if (!sealed) {
      ++*unsealed;
      log->push_back("skipping " + path + ": not sealed (no " + kCheckpointManifestFile +
                     ": a checkpoint that was never finished)");
      continue;
    }
    CheckpointManifest m;
    const std::string why = check_checkpoint(comm, path, &m);
    if (why.empty()) {
      std::string line = "resuming from " + path + " (step " + std::to_string(m.step) + ", epoch " +
                         std::to_string(m.epoch + 1) + " after " + std::to_string(m.epoch_step) +
                         " of its steps)";
      if (bad->size() == 1)
        line += "; the newer sealed checkpoint named above does not load and stays in " + dir;
      else if (bad->size() > 1)
        line += "; the " + std::to_string(bad->size()) +
                " newer sealed checkpoints named above do not load and stay in " + dir;
      log->push_back(line);
      if (!m.unsealed_warning.empty()) log->push_back("warning: " + m.unsealed_warning);
      return CheckpointReader(path, m);
    }
    bad->push_back({path, why});
    log->push_back("warning: skipping sealed checkpoint " + path + ", which does not load: " + why);
  }
  return std::nullopt;
}

}  // namespace

std::optional<CheckpointReader> find_checkpoint(Communicator& comm, const std::string& resume,
                                                const std::string& dir,
                                                std::vector<std::string>* log,
                                                std::vector<DamagedCheckpoint>* damaged) {
  if (damaged) damaged->clear();
  if (resume == "never") return std::nullopt;
  CheckpointManifest m;
  if (resume != "auto" && resume != "auto_or_restart") {
    const std::string why = check_checkpoint(comm, resume, &m);
    if (!why.empty()) NCF_FAIL("flag --resume ", resume, ": cannot load this checkpoint: ", why);
    log->push_back("resuming from " + resume + " (step " + std::to_string(m.step) + ")");
    if (!m.unsealed_warning.empty()) log->push_back("warning: " + m.unsealed_warning);
    return CheckpointReader(resume, m);
  }
  NCF_CHECK(!dir.empty(), "flag --resume ", resume, " needs --checkpoint_dir");
  std::vector<DamagedCheckpoint> bad;
  size_t unsealed = 0;
  std::optional<CheckpointReader> ck = newest_loadable(comm, dir, log, &bad, &unsealed);
  if (damaged) *damaged = bad;
  if (ck) return ck;
  if (bad.empty()) {
    log->push_back((unsealed == 0 ? "no checkpoint in " + dir
                                  : "no sealed checkpoint in " + dir + " (" +
                                        std::to_string(unsealed) + " unsealed skipped)") +
                   ": starting from step 0");
    return std::nullopt;
  }
  if (resume == "auto_or_restart") {
    log->push_back("--resume auto_or_restart: none of the " + sealed_count(bad.size()) + " in " +
                   dir + " loads (" + damaged_list(bad) +
                   "): starting from step 0, as asked; they stay in " + dir);
    return std::nullopt;
  }
  NCF_FAIL("flag --resume auto: --checkpoint_dir ", dir, " holds ", sealed_count(bad.size()),
           " and none loads: ", damaged_list(bad),
           ". Nothing was trained: restore an intact copy of a checkpoint (ncf_export --verify "
           "checks one), or pass --resume auto_or_restart to start from step 0 on purpose");
}

CheckpointReader open_checkpoint(Communicator& comm, const std::string& path,
                                 std::vector<std::string>* log, const std::string& flag) {
  const bool one = fs::exists(fs::path(path) / kCheckpointManifestFile) ||
                   step_of(fs::path(path).filename().string()) >= 0;
  if (!one && !fs::is_directory(path))
    NCF_FAIL("flag ", flag, " ", path, ": no such checkpoint or directory");
  if (one) {
    CheckpointManifest m;
    const std::string why = check_checkpoint(comm, path, &m);
    if (!why.empty()) NCF_FAIL("flag ", flag, " ", path, ": cannot load this checkpoint: ", why);
    log->push_back("resuming from " + path + " (step " + std::to_string(m.step) + ")");
    if (!m.unsealed_warning.empty()) log->push_back("warning: " + m.unsealed_warning);
    return CheckpointReader(path, m);
  }
  std::vector<DamagedCheckpoint> bad;
  size_t unsealed = 0;
  std::optional<CheckpointReader> ck = newest_loadable(comm, path, log, &bad, &unsealed);
  if (ck) return std::move(*ck);
  if (!bad.empty())
    NCF_FAIL("flag ", flag, " ", path, ": the directory holds ", sealed_count(bad.size()),
             " and none loads: ", damaged_list(bad));
  NCF_FAIL("flag ", flag, " ", path, ": no whole checkpoint there",
           unsealed > 0 ? " (only " + std::to_string(unsealed) + " unsealed, never finished)"
                        : std::string());
}

}  // namespace ncf
