// The delta export and its apply: see delta.h.
#include "export/delta.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"
#include "data/id_map.h"
#include "export/npy.h"
#include "train/checkpoint.h"

namespace ncf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExportManifest = "export_manifest.json";
constexpr const char* kManifest = "manifest.json";
constexpr int64_t kIoPiece = int64_t{8} << 20;  // bytes per read when a file is checksummed

std::string hex32(uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08" PRIx32, v);
  return s;
}

const char* table_name(TrainedModel::Table t) {
  return t == TrainedModel::kUsers ? "user" : "item";
}

struct FileSum {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
  bool operator==(const FileSum& o) const { return bytes == o.bytes && crc32c == o.crc32c; }
  std::string text() const { return std::to_string(bytes) + " bytes, CRC-32C " + hex32(crc32c); }
  nlohmann::json json() const { return {{"bytes", bytes}, {"crc32c", crc32c}}; }
};

// Size and CRC-32C of a whole file, read in pieces.
FileSum file_sum(const std::string& path) {
  FileHandle f(path, O_RDONLY);
  FileSum s;
  s.bytes = f.size();
  std::vector<char> buf(size_t(std::min(std::max<int64_t>(s.bytes, 1), kIoPiece)));
  for (int64_t at = 0; at < s.bytes;) {
    const size_t n = size_t(std::min<int64_t>(s.bytes - at, int64_t(buf.size())));
    f.read_at(at, buf.data(), n);
    s.crc32c = crc32c_extend(s.crc32c, buf.data(), n);
    at += int64_t(n);
  }
  return s;
}

// The size and CRC-32C of a table's file in the full NumPy export, from the
// checkpoint's manifest alone: the header, then the checkpoint's rows file
// byte for byte (whose CRC the manifest holds), joined by crc32c_combine.
FileSum export_table_sum(const TrainedModel& m, TrainedModel::Table t) {
  const std::string head = npy_header(npy_table_file(t), "<f4", {m.rows(t), m.D});
  const CheckpointFile& f = m.manifest.file(TrainedModel::table_file(t), m.path);
  return {int64_t(head.size()) + f.bytes,
          crc32c_combine(crc32c(head.data(), head.size()), f.crc32c, uint64_t(f.bytes))};
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k]);
  return s;
}

std::string id_kind(const IdMap& m) {
  return m.identity() ? "dense ids (no id map)" : m.strings() ? "string ids" : "integer ids";
}

// ---- output directories ------------------------------------------------------

// A directory written whole or not at all: files go into a fresh sibling
// `out.tmp-<pid>`, renamed to `out` by commit(); a failure before that removes
// it. `out` must not exist, or be an empty directory (rename replaces one).
class OutputDir {
 public:
  explicit OutputDir(const std::string& out) : out_(out) {
    std::error_code ec;
    if (fs::exists(out_, ec)) {
      if (!fs::is_directory(out_, ec))
        NCF_FAIL("--output ", out_, " exists and is not a directory");
      if (!fs::is_empty(out_, ec))
        NCF_FAIL("--output ", out_, " exists and is not empty: give a new directory");
    }
    fs::path p = fs::path(out_).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "dir/"
    parent_ = p.has_parent_path() ? p.parent_path().string() : ".";
    fs::create_directories(parent_);
    tmp_ = (fs::path(parent_) /
            ("." + p.filename().string() + ".tmp-" + std::to_string(long(::getpid()))))
               .string();
    fs::remove_all(tmp_, ec);
    if (!fs::create_directory(tmp_, ec))
      NCF_FAIL("cannot create ", tmp_, " (for --output ", out_, "): ", ec.message());
  }
  ~OutputDir() {
    if (committed_) return;
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& tmp() const { return tmp_; }
  std::string file(const std::string& name) const { return tmp_ + "/" + name; }
  void commit() {
    sync_directory(tmp_);
    if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
      NCF_FAIL("cannot rename ", tmp_, " to --output ", out_, ": ", std::strerror(errno));
    committed_ = true;
    sync_directory(parent_);
  }

 private:
  std::string out_, parent_, tmp_;
  bool committed_ = false;
};

// ---- the delta ---------------------------------------------------------------

// For each NEWER row of a table, the OLDER row of the same original id, or -1.
std::vector<int64_t> match_rows(const IdMap& newer, const IdMap& older) {
  std::vector<int64_t> base(size_t(newer.size()));
  for (int64_t d = 0; d < newer.size(); ++d) base[size_t(d)] = older.find_same(newer, d);
  return base;
}

// One table's three delta files in `dir`; OLDER's rows of matched ids read in
// runs of consecutive rows, NEWER's streamed in export pieces.
TableDeltaCounts write_table_delta(const TrainedModel& newer, const TrainedModel& older,
                                   TrainedModel::Table t, const std::vector<int64_t>& base,
                                   const std::string& dir) {
  const std::string name = table_name(t);
  const int D = newer.D;  // row width, the same in both (checked by the caller)
  const size_t row_bytes = size_t(D) * 4;
  TableDeltaCounts c;
  c.rows = newer.rows(t);
  c.base_rows = older.rows(t);
  while (c.same_prefix < c.rows && base[size_t(c.same_prefix)] == c.same_prefix) ++c.same_prefix;

  // The changed rows' values go to a raw file first: their count, which the
  // .npy header holds, is known only at the end.
  const std::string raw = dir + "/" + name + "_changed_values.f32.part";
  std::vector<int64_t> changed;  // [C] NEWER rows, ascending
  {
    FileHandle out(raw, O_WRONLY | O_CREAT | O_TRUNC);
    int64_t at = 0;
    const int64_t piece = export_piece_rows(D);
    std::vector<float> old(size_t(std::min(piece, std::max<int64_t>(c.rows, 1))) * size_t(D));
    std::vector<float> staged;
    newer.for_each_piece(t, piece, [&](int64_t first, int64_t n, const float* rows) {
      const int64_t* b = base.data() + first;
      for (int64_t k = 0; k < n;) {
        if (b[k] < 0) {
          ++k;
          continue;
        }
        int64_t e = k + 1;
        while (e < n && b[e] == b[e - 1] + 1) ++e;
        older.read_rows(t, b[k], e - k, old.data() + size_t(k) * size_t(D));
        k = e;
      }
      staged.clear();
      for (int64_t k = 0; k < n; ++k) {
        const float* row = rows + size_t(k) * size_t(D);
        const bool added = b[k] < 0;
        if (!added && std::memcmp(row, old.data() + size_t(k) * size_t(D), row_bytes) == 0)
          continue;
        (added ? c.added : c.changed)++;
        changed.push_back(first + k);
        staged.insert(staged.end(), row, row + D);
      }
      out.write_at(at, staged.data(), staged.size() * 4);
      at += int64_t(staged.size()) * 4;
    });
    out.close();
  }
  int64_t matched = 0;
  for (int64_t b : base) matched += b >= 0;
  c.dropped = c.base_rows - matched;

  const int64_t C = int64_t(changed.size());
  write_npy(dir + "/" + name + "_changed_rows.npy", "<i8", {C}, changed.data(), 8);
  {
    FileHandle in(raw, O_RDONLY);
    write_npy(
        dir + "/" + name + "_changed_values.npy", "<f4", {C, D}, 4, [&](const NpyAppend& append) {
          std::vector<char> buf(
              size_t(std::min(std::max<int64_t>(C, 1) * int64_t(row_bytes), int64_t{64} << 20)));
          const int64_t total = C * int64_t(row_bytes);
          for (int64_t at = 0; at < total;) {
            const size_t n = size_t(std::min<int64_t>(total - at, int64_t(buf.size())));
            in.read_at(at, buf.data(), n);
            append(buf.data(), n);
            at += int64_t(n);
          }
        });
  }
  fs::remove(raw);
  write_npy(dir + "/" + name + "_base_rows.npy", "<i8", {c.rows - c.same_prefix},
            base.data() + c.same_prefix, 8);
  return c;
}

nlohmann::json counts_json(const TableDeltaCounts& c) {
  return {{"rows", c.rows},       {"base_rows", c.base_rows}, {"same_prefix", c.same_prefix},
          {"changed", c.changed}, {"new", c.added},           {"dropped", c.dropped}};
}

// What identifies an export: the checkpoint's step and dataset, the shape, and
// (added by the caller) its table files.
nlohmann::json export_identity(const TrainedModel& m) {
  return {{"checkpoint", m.path},
          {"step", m.manifest.step},
          {"dataset_id", m.manifest.dataset_id},
          {"num_users", m.U},
          {"num_items", m.I},
          {"embedding_width", m.D},
          {"mf_dim", m.config.mf_dim},
          {"layers", m.config.layers}};
}

}  // namespace

DeltaSummary export_npy_delta(const TrainedModel& newer, const TrainedModel& older,
                              const std::string& data_dir, const std::string& dir) {
  // A row of one shape cannot be compared with a row of another, nor a tower
  // carried across shapes.
  if (newer.config.mf_dim != older.config.mf_dim || newer.config.layers != older.config.layers)
    NCF_FAIL("--since ", older.path, ": its model has num_factors ", older.config.mf_dim,
             " and layers ", join(older.config.layers), ", the --checkpoint ", newer.path,
             " has num_factors ", newer.config.mf_dim, " and layers ", join(newer.config.layers),
             ": a delta needs checkpoints of one model shape");
  // NEWER's id arrays as its full export writes them; rows are matched
  // through these maps (or, without any, the checkpoint's dense ids).
  const std::optional<IdMaps> ids = export_id_maps(newer, data_dir);
  const IdMaps new_maps = ids ? *ids : newer.reader->id_maps();
  const IdMaps old_maps = older.reader->id_maps();
  for (const auto& [what, n, o] : {std::tuple{"user", &new_maps.user, &old_maps.user},
                                   std::tuple{"item", &new_maps.item, &old_maps.item}})
    if (id_kind(*n) != id_kind(*o))
      NCF_FAIL("--since ", older.path, ": its ", what, "s have ", id_kind(*o),
               ", the --checkpoint ", newer.path, "'s have ", id_kind(*n),
               ": rows are matched by original id, which needs ids of one kind (a checkpoint "
               "written before checkpoints carried their dataset's id maps has none)");

  OutputDir out(dir);
  nlohmann::json files = nlohmann::json::object();  // the full export's entries
  write_npy_tower(newer, out.tmp(), &files);
  if (ids) write_npy_ids(*ids, out.tmp(), &files);
  std::vector<std::string> copied;
  for (const auto& [name, entry] : files.items()) copied.push_back(name);
  nlohmann::json base_id = export_identity(older), target_id = export_identity(newer);
  base_id["files"] = nlohmann::json::object();
  target_id["files"] = nlohmann::json::object();
  DeltaSummary s;
  for (TrainedModel::Table t : {TrainedModel::kUsers, TrainedModel::kItems}) {
    const std::string file = npy_table_file(t);
    files[file] = npy_table_entry(newer, t);
    base_id["files"][file] = export_table_sum(older, t).json();
    const FileSum target = export_table_sum(newer, t);
    target_id["files"][file] = target.json();
    s.full_bytes += target.bytes;
  }
  const std::string export_manifest = npy_manifest_text(newer, files);
  write_file_atomic(out.file(kExportManifest), export_manifest);
  copied.push_back(kExportManifest);
  s.full_bytes += int64_t(export_manifest.size());

  nlohmann::json tables = nlohmann::json::object();
  for (TrainedModel::Table t : {TrainedModel::kUsers, TrainedModel::kItems}) {
    const IdMap& n = t == TrainedModel::kUsers ? new_maps.user : new_maps.item;
    const IdMap& o = t == TrainedModel::kUsers ? old_maps.user : old_maps.item;
    NCF_CHECK(n.size() == newer.rows(t) && o.size() == older.rows(t), table_name(t), " maps of ",
              n.size(), " and ", o.size(), " ids for tables of ", newer.rows(t), " and ",
              older.rows(t), " rows");
    const TableDeltaCounts c = write_table_delta(newer, older, t, match_rows(n, o), out.tmp());
    (t == TrainedModel::kUsers ? s.users : s.items) = c;
    tables[table_name(t)] = counts_json(c);
  }

  nlohmann::json sums = nlohmann::json::object();
  int64_t payload = 0;
  for (const auto& e : fs::directory_iterator(out.tmp())) {
    const FileSum f = file_sum(e.path().string());
    sums[e.path().filename().string()] = f.json();
    payload += f.bytes;
  }
  for (const std::string& name : copied)
    if (name != kExportManifest) s.full_bytes += sums.at(name).at("bytes").get<int64_t>();
  nlohmann::json manifest = {
      {"format", kDeltaFormat}, {"version", kDeltaVersion}, {"base", base_id},
      {"target", target_id},    {"tables", tables},         {"copied", copied},
      {"files", sums},          {"bytes", payload},         {"full_export_bytes", s.full_bytes}};
  manifest["crc32c"] = checkpoint_manifest_crc32c(manifest);
  const std::string text = manifest.dump(2) + "\n";
  write_file_atomic(out.file(kManifest), text);
  s.delta_bytes = payload + int64_t(text.size());
  out.commit();
  return s;
}

// ---- the apply ---------------------------------------------------------------

namespace {

// A field of a JSON object, of type T; errors name the file and the field.
template <typename T>
T field(const nlohmann::json& j, const std::string& key, const std::string& path,
        const std::string& where = "") {
  const std::string name = where.empty() ? key : where + "." + key;
  if (!j.is_object() || !j.contains(key)) NCF_FAIL(path, ": no field \"", name, "\"");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    NCF_FAIL(path, ": field \"", name, "\" has the wrong type (", j.at(key).dump(), ")");
  }
}

// A member object of a JSON object (a copy: a manifest's objects are small, and a reference
// returned through arguments that are temporaries is what GCC 13's -Wdangling-reference
// flags); errors name the file and the field.
nlohmann::json sub(const nlohmann::json& j, const std::string& key, const std::string& path,
                   const std::string& where = "") {
  const std::string name = where.empty() ? key : where + "." + key;
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_object())
    NCF_FAIL(path, ": field \"", name, "\" is missing or not an object: the delta is damaged");
  return j.at(key);
}

// The delta's manifest: sealed, of this format, every file it lists whole.
nlohmann::json load_delta_manifest(const std::string& delta) {
  const std::string path = delta + "/" + kManifest;
  std::error_code ec;
  if (!fs::is_directory(delta, ec)) NCF_FAIL("--apply ", delta, ": no such delta directory");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    NCF_FAIL(path, ": not valid JSON (", e.what(), "): the delta is damaged");
  }
  if (!j.is_object() || j.value("format", nlohmann::json()) != kDeltaFormat)
    NCF_FAIL("--apply ", delta, ": ", path, " is not a delta's manifest (format ",
             j.is_object() ? j.value("format", nlohmann::json()).dump() : j.dump(), ", not \"",
             kDeltaFormat, "\")");
  const uint32_t stored = field<uint32_t>(j, "crc32c", path);
  const uint32_t computed = checkpoint_manifest_crc32c(j);
  if (stored != computed)
    NCF_FAIL(path, ": the content does not match its crc32c (", hex32(stored), " stored, ",
             hex32(computed), " computed): the delta is damaged");
  if (field<int>(j, "version", path) != kDeltaVersion)
    NCF_FAIL(path, ": delta version ", j.at("version").dump(), ", this ncf_export applies version ",
             kDeltaVersion);
  const nlohmann::json files = sub(j, "files", path);
  for (const auto& [name, want] : files.items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name == kManifest)
      NCF_FAIL(path, ": file name \"", name, "\" is not a plain file of the delta");
    const std::string file = delta + "/" + name;
    if (!fs::is_regular_file(file, ec))
      NCF_FAIL("delta ", delta, ": file ", name, " is missing (", path, " lists it)");
    const FileSum w{field<int64_t>(want, "bytes", path, "files." + name),
                    field<uint32_t>(want, "crc32c", path, "files." + name)};
    const FileSum got = file_sum(file);
    if (!(got == w))
      NCF_FAIL("delta ", delta, ": file ", name, " has ", got.text(), ", its manifest says ",
               w.text(), ": the delta is damaged");
  }
  return j;
}

std::string identity_text(const nlohmann::json& id) {
  auto s = [&](const char* k) { return id.contains(k) ? id.at(k).dump() : std::string("none"); };
  return "step " + s("step") + " of dataset " + s("dataset_id") + ", " + s("num_users") +
         " users, " + s("num_items") + " items, D " + s("embedding_width");
}

// An int64 or float32 array of a delta, its header checked against the shape
// the manifest gives; read(first, count, out) reads items (elements of a 1-D
// array, rows of a 2-D one) by position.
class NpyArray {
 public:
  NpyArray(const std::string& path, const char* dtype, const std::vector<int64_t>& shape,
           size_t element_bytes)
      : f_(path, O_RDONLY), item_(element_bytes) {
    const std::string want = npy_header(path, dtype, shape);
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    for (size_t k = 1; k < shape.size(); ++k) item_ *= size_t(shape[k]);
    const int64_t bytes = int64_t(want.size()) + count * int64_t(element_bytes);
    if (f_.size() != bytes)
      NCF_FAIL(path, ": ", f_.size(), " bytes, an array ", dtype,
               " of the shape its manifest "
               "gives needs ",
               bytes, ": the delta is damaged");
    std::string got(want.size(), '\0');
    f_.read_at(0, got.data(), got.size());
    if (got != want)
      NCF_FAIL(path, ": its .npy header is not that of the shape its manifest gives (",
               want.substr(10, want.find('}') - 9), "): the delta is damaged");
    header_ = int64_t(want.size());
  }
  void read(int64_t first, int64_t count, void* out) const {
    f_.read_at(header_ + first * int64_t(item_), out, size_t(count) * item_);
  }

 private:
  FileHandle f_;
  size_t item_;
  int64_t header_ = 0;
};

// One table of the new export: each row from the delta's values where it
// lists the row, else from the base's row of the same id. Returns the written
// file's size and CRC-32C.
FileSum apply_table(const std::string& delta, const std::string& base_file,
                    const std::string& out_file, const std::string& name, const TableDeltaCounts& c,
                    int64_t C, int D) {
  const std::string where = "delta " + delta + ": table " + name;
  const NpyArray rows(delta + "/" + name + "_changed_rows.npy", "<i8", {C}, 8);
  const NpyArray values(delta + "/" + name + "_changed_values.npy", "<f4", {C, D}, 4);
  const NpyArray base_rows(delta + "/" + name + "_base_rows.npy", "<i8", {c.rows - c.same_prefix},
                           8);
  const FileHandle base(base_file, O_RDONLY);
  const int64_t base_header = int64_t(npy_header(base_file, "<f4", {c.base_rows, D}).size());
  const size_t row_bytes = size_t(D) * 4;
  const int64_t piece = export_piece_rows(D);
  const size_t cap = size_t(std::min(piece, std::max<int64_t>(c.rows, 1)));
  std::vector<float> buf(cap * size_t(D)), vals(cap * size_t(D));
  std::vector<int64_t> listed(cap), from(cap);
  FileSum sum;
  const std::string head = npy_header(out_file, "<f4", {c.rows, D});
  sum.crc32c = crc32c(head.data(), head.size());
  int64_t k = 0;  // the next listed row
  write_npy(out_file, "<f4", {c.rows, D}, 4, [&](const NpyAppend& append) {
    for (int64_t a = 0; a < c.rows; a += piece) {
      const int64_t n = std::min(piece, c.rows - a);
      // The listed rows of [a, a + n) (ascending, so at most n of them).
      const int64_t look = std::min(n, C - k);
      rows.read(k, look, listed.data());
      int64_t m = 0;
      while (m < look && listed[size_t(m)] < a + n) {
        const int64_t r = listed[size_t(m)];
        if (r < a || (m > 0 && r <= listed[size_t(m - 1)]))
          NCF_FAIL(where, ": changed row ", r, " (entry ", k + m,
                   ") is out of order: the delta is damaged");
        ++m;
      }
      values.read(k, m, vals.data());
      // Where each other row comes from in the base.
      for (int64_t r = a; r < a + n; ++r) from[size_t(r - a)] = r;
      const int64_t tail = std::max(a, c.same_prefix);
      if (tail < a + n)
        base_rows.read(tail - c.same_prefix, a + n - tail, from.data() + (tail - a));
      int64_t j = 0;
      for (int64_t r = a; r < a + n; ++r) {
        float* out = buf.data() + size_t(r - a) * size_t(D);
        if (j < m && listed[size_t(j)] == r) {
          std::memcpy(out, vals.data() + size_t(j) * size_t(D), row_bytes);
          from[size_t(r - a)] = -1;
          ++j;
        } else if (from[size_t(r - a)] < 0 || from[size_t(r - a)] >= c.base_rows) {
          NCF_FAIL(where, ": row ", r, " is neither among the changed rows nor a row of the base (",
                   from[size_t(r - a)], " of ", c.base_rows, "): the delta is damaged");
        }
      }
      // The base's rows, read in runs of consecutive rows.
      for (int64_t q = 0; q < n;) {
        const int64_t b = from[size_t(q)];
        if (b < 0) {
          ++q;
          continue;
        }
        int64_t e = q + 1;
        while (e < n && from[size_t(e)] == from[size_t(e - 1)] + 1) ++e;
        base.read_at(base_header + b * int64_t(row_bytes), buf.data() + size_t(q) * size_t(D),
                     size_t(e - q) * row_bytes);
        q = e;
      }
      const size_t bytes = size_t(n) * row_bytes;
      sum.crc32c = crc32c_extend(sum.crc32c, buf.data(), bytes);
      append(buf.data(), bytes);
      k += m;
    }
  });
  if (k != C)
    NCF_FAIL(where, ": ", C - k, " of its ", C, " changed rows lie past the table's ", c.rows,
             " rows: the delta is damaged");
  sum.bytes = int64_t(head.size()) + c.rows * int64_t(row_bytes);
  return sum;
}

// Copies a file in pieces.
void copy_file(const std::string& from, const std::string& to) {
  const FileHandle in(from, O_RDONLY);
  FileHandle out(to, O_WRONLY | O_CREAT | O_TRUNC);
  const int64_t bytes = in.size();
  std::vector<char> buf(size_t(std::min(std::max<int64_t>(bytes, 1), kIoPiece)));
  for (int64_t at = 0; at < bytes;) {
    const size_t n = size_t(std::min<int64_t>(bytes - at, int64_t(buf.size())));
    in.read_at(at, buf.data(), n);
    out.write_at(at, buf.data(), n);
    at += int64_t(n);
  }
  out.sync();
  out.close();
}

TableDeltaCounts counts_from_json(const nlohmann::json& j, const std::string& path,
                                  const std::string& where) {
  TableDeltaCounts c;
  c.rows = field<int64_t>(j, "rows", path, where);
  c.base_rows = field<int64_t>(j, "base_rows", path, where);
  c.same_prefix = field<int64_t>(j, "same_prefix", path, where);
  c.changed = field<int64_t>(j, "changed", path, where);
  c.added = field<int64_t>(j, "new", path, where);
  c.dropped = field<int64_t>(j, "dropped", path, where);
  if (c.rows < 0 || c.base_rows < 0 || c.same_prefix < 0 || c.same_prefix > c.rows ||
      c.same_prefix > c.base_rows || c.changed < 0 || c.added < 0 || c.changed + c.added > c.rows)
    NCF_FAIL(path, ": field \"", where, "\" has counts that do not fit together (", j.dump(),
             "): the delta is damaged");
  return c;
}

}  // namespace

ApplySummary apply_npy_delta(const std::string& delta, const std::string& base,
                             const std::string& output) {
  const nlohmann::json j = load_delta_manifest(delta);
  const std::string mpath = delta + "/" + kManifest;
  const nlohmann::json want = sub(j, "base", mpath);
  const nlohmann::json target = sub(j, "target", mpath);
  const int D = field<int>(target, "embedding_width", mpath, "target");

  // The base: its manifest names the checkpoint export it is, and its two
  // tables (the only base files read) must be the bytes the delta was made
  // against.
  const std::string base_manifest = base + "/" + kManifest;
  std::error_code ec;
  if (!fs::is_regular_file(base_manifest, ec))
    NCF_FAIL("--base ", base, ": no ", kManifest, " (not a NumPy export of ncf_export)");
  nlohmann::json have;
  try {
    have = nlohmann::json::parse(read_text_file(base_manifest));
  } catch (const nlohmann::json::exception& e) {
    NCF_FAIL(base_manifest, ": not valid JSON (", e.what(), ")");
  }
  for (const char* k : {"step", "dataset_id", "num_users", "num_items", "embedding_width"})
    if (!have.is_object() || !have.contains(k) || !want.contains(k) || have.at(k) != want.at(k))
      NCF_FAIL("--base ", base, " is not the export delta ", delta, " applies to: ", base_manifest,
               " says ", have.is_object() ? identity_text(have) : have.dump(), " (checkpoint ",
               have.value("checkpoint", std::string("?")), "); the delta needs ",
               identity_text(want), " (checkpoint ", want.value("checkpoint", std::string("?")),
               ")");
  const nlohmann::json want_files = sub(want, "files", mpath, "base");
  for (const auto& [file, w] : want_files.items()) {
    const FileSum ws{field<int64_t>(w, "bytes", mpath, "base.files." + file),
                     field<uint32_t>(w, "crc32c", mpath, "base.files." + file)};
    const std::string path = base + "/" + file;
    if (!fs::is_regular_file(path, ec))
      NCF_FAIL("--base ", base, ": no ", file, " (the delta ", delta, " reads it)");
    const FileSum got = file_sum(path);
    if (!(got == ws))
      NCF_FAIL("--base ", base, ": ", path, " has ", got.text(), ", the export delta ", delta,
               " was made against has ", ws.text(), " (the base's manifest says ",
               identity_text(have), "; the delta's base is ", identity_text(want),
               "): the base file changed, or is another export's");
  }

  ApplySummary s;
  s.checkpoint = field<std::string>(target, "checkpoint", mpath, "target");
  s.step = field<int64_t>(target, "step", mpath, "target");
  s.base_step = field<int64_t>(want, "step", mpath, "base");
  OutputDir out(output);
  for (const auto& name : field<std::vector<std::string>>(j, "copied", mpath)) {
    if (!sub(j, "files", mpath).contains(name))
      NCF_FAIL(mpath, ": copied file ", name, " is not among its files: the delta is damaged");
    if (name != kExportManifest) copy_file(delta + "/" + name, out.file(name));
  }
  for (TrainedModel::Table t : {TrainedModel::kUsers, TrainedModel::kItems}) {
    const std::string name = table_name(t), file = npy_table_file(t);
    const TableDeltaCounts c = counts_from_json(sub(sub(j, "tables", mpath), name, mpath, "tables"),
                                                mpath, "tables." + name);
    (t == TrainedModel::kUsers ? s.users : s.items) = c;
    const nlohmann::json tw =
        sub(sub(target, "files", mpath, "target"), file, mpath, "target.files");
    const FileSum wanted{field<int64_t>(tw, "bytes", mpath, "target.files." + file),
                         field<uint32_t>(tw, "crc32c", mpath, "target.files." + file)};
    const FileSum got =
        apply_table(delta, base + "/" + file, out.file(file), name, c, c.changed + c.added, D);
    if (!(got == wanted))
      NCF_FAIL("delta ", delta, " applied to --base ", base, " gave ", file, " of ", got.text(),
               ", the export of ", s.checkpoint, " has ", wanted.text(),
               ": the delta or the base is damaged");
  }
  // Last, as export_npy writes it: a directory with its manifest is whole.
  copy_file(delta + "/" + kExportManifest, out.file(kManifest));
  out.commit();
  return s;
}

}  // namespace ncf
