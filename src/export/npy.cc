// .npy writing and the NumPy export: see npy.h.
#include "export/npy.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/file_io.h"
#include "data/dataset.h"
#include "data/id_map.h"

namespace ncf {

void write_npy(const std::string& path, const char* dtype, const std::vector<int64_t>& shape,
               const void* data, size_t element_bytes) {
  write_npy(path, dtype, shape, element_bytes, [&](const NpyAppend& append) {
    size_t count = 1;
    for (int64_t d : shape) count *= size_t(d);
    append(data, count * element_bytes);
  });
}

std::string npy_header(const std::string& path, const char* dtype,
                       const std::vector<int64_t>& shape) {
  std::string dims;  // "(3,)" for one dimension, "(3, 4)" for two, as NumPy writes them
  for (size_t k = 0; k < shape.size(); ++k) dims += (k ? ", " : "") + std::to_string(shape[k]);
  if (shape.size() == 1) dims += ",";
  std::string header =
      "{'descr': '" + std::string(dtype) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic (6) + version (2) + length (2) + header + '\n', a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  NCF_CHECK(header.size() <= 0xffff, path, ": a .npy 1.0 header of ", header.size(), " bytes");
  std::string head = std::string("\x93NUMPY\x01\x00", 8);
  head += char(header.size() & 0xff);
  head += char(header.size() >> 8);
  head += header;
  return head;
}

void write_npy(const std::string& path, const char* dtype, const std::vector<int64_t>& shape,
               size_t element_bytes, const std::function<void(const NpyAppend&)>& body) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  const std::string head = npy_header(path, dtype, shape);
  // Written as the pieces come (a table need not fit in memory), through a
  // temporary file and a rename like write_file_atomic.
  const std::string tmp = path + ".tmp";
  {
    FileHandle f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    f.write_at(0, head.data(), head.size());
    int64_t at = int64_t(head.size());
    const int64_t end = at + count * int64_t(element_bytes);
    body([&](const void* data, size_t n) {
      NCF_CHECK(at + int64_t(n) <= end, path, ": more than the ", count, " elements of its shape");
      f.write_at(at, data, n);
      at += int64_t(n);
    });
    NCF_CHECK(at == end, path, ": ", at - int64_t(head.size()), " bytes written, its shape needs ",
              end - int64_t(head.size()));
    f.sync();
    f.close();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    NCF_FAIL("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  const std::string parent = std::filesystem::path(path).parent_path().string();
  sync_directory(parent.empty() ? "." : parent);
}

namespace {

// String ids (user_ids.str) as NumPy arrays: one fixed-width bytes array
// (dtype |S<w>, w the longest id, each id zero-padded) when that is at most
// about twice the ids' bytes, else the map's own layout as two arrays,
// NAME_offsets.npy (int64 [n + 1]) and NAME_bytes.npy (uint8), so one long id
// cannot blow up the file.
void export_string_ids(const std::string& dir, const std::string& name, const StringList& ids,
                       nlohmann::json* files) {
  const int64_t n = int64_t(ids.size());
  size_t width = 1;
  for (size_t d = 0; d < ids.size(); ++d) width = std::max(width, ids[d].size());
  const std::string stem = name.substr(0, name.size() - 4);  // without .npy
  if (uint64_t(n) * width <= 2 * ids.bytes.size() + (uint64_t(1) << 20)) {
    const std::string dtype = "|S" + std::to_string(width);
    write_npy(dir + "/" + name, dtype.c_str(), {n}, width, [&](const NpyAppend& append) {
      std::string piece;
      for (size_t d = 0; d < ids.size(); ++d) {
        piece.append(ids[d].data(), ids[d].size());
        piece.append(width - ids[d].size(), '\0');
        if (piece.size() >= (size_t(1) << 20) || d + 1 == ids.size()) {
          append(piece.data(), piece.size());
          piece.clear();
        }
      }
    });
    (*files)[name] = {{"shape", {n}},
                      {"dtype", "bytes" + std::to_string(width)},
                      {"what",
                       "the dataset's original id of each row (string ids as NumPy bytes, "
                       "zero-padded to the longest)"}};
    return;
  }
  const std::string offsets = stem + "_offsets.npy", bytes = stem + "_bytes.npy";
  std::vector<int64_t> off(ids.offsets.begin(), ids.offsets.end());
  write_npy(dir + "/" + offsets, "<i8", {n + 1}, off.data(), 8);
  write_npy(dir + "/" + bytes, "|u1", {int64_t(ids.bytes.size())}, ids.bytes.data(), 1);
  (*files)[offsets] = {{"shape", {n + 1}},
                       {"dtype", "int64"},
                       {"what", "row d's original id is " + bytes + "[offsets[d]:offsets[d + 1]]"}};
  (*files)[bytes] = {{"shape", {int64_t(ids.bytes.size())}},
                     {"dtype", "uint8"},
                     {"what", "the string ids' bytes, one after another (see " + offsets + ")"}};
}

}  // namespace

std::string npy_table_file(TrainedModel::Table t) {
  return t == TrainedModel::kUsers ? "user_embeddings.npy" : "item_embeddings.npy";
}

nlohmann::json npy_table_entry(const TrainedModel& m, TrainedModel::Table t) {
  const std::string name = t == TrainedModel::kUsers ? "user" : "item";
  return {{"shape", {m.rows(t), int64_t(m.D)}},
          {"dtype", "float32"},
          {"what", name + " rows: columns [0, mf_dim) GMF factors, [mf_dim, D) MLP embedding"}};
}

void write_npy_tower(const TrainedModel& m, const std::string& dir, nlohmann::json* files) {
  auto put = [&](const std::string& name, const std::vector<int64_t>& shape, const float* data,
                 const std::string& what) {
    write_npy(dir + "/" + name, "<f4", shape, data, 4);
    (*files)[name] = {{"shape", shape}, {"dtype", "float32"}, {"what", what}};
  };
  for (size_t l = 0; l < m.tower.size(); ++l) {
    const DenseLayerView& v = m.tower[l];
    const std::string p = "mlp_" + std::to_string(l);
    put(p + "_weight.npy", {v.out, v.in}, m.params.data() + v.w_offset,
        "x_" + std::to_string(l + 1) + " = relu(x_" + std::to_string(l) + " @ W.T + b)");
    put(p + "_bias.npy", {v.out}, m.params.data() + v.b_offset, "b of " + p);
  }
  const int F = m.config.head_width();
  put("head_weight.npy", {F}, m.params.data() + m.head_w_offset,
      "logit = [gmf ; x_last] @ w + c: the first mf_dim entries weigh the GMF product");
  put("head_bias.npy", {1}, m.params.data() + m.head_c_offset, "c");
}

std::optional<IdMaps> export_id_maps(const TrainedModel& m, const std::string& data_dir) {
  if (!data_dir.empty()) {
    const DatasetMeta meta = DatasetMeta::load(data_dir);
    if (meta.dataset_id != m.manifest.dataset_id)
      NCF_FAIL("checkpoint ", m.path, " belongs to dataset ", m.manifest.dataset_id,
               ", but --data_dir ", data_dir, " holds dataset ", meta.dataset_id);
    // The checkpoint's copy is that dataset's maps (checked against the CRCs
    // its manifest took from metadata.json), so it is read instead.
    if (m.manifest.id_maps.empty()) return load_id_maps(data_dir, meta);
  }
  if (m.manifest.id_maps.empty()) return std::nullopt;
  return m.reader->id_maps();
}

void write_npy_ids(const IdMaps& maps, const std::string& dir, nlohmann::json* files) {
  for (const auto& [name, map] :
       {std::pair{"user_ids.npy", &maps.user}, std::pair{"item_ids.npy", &maps.item}}) {
    if (map->strings()) {
      export_string_ids(dir, name, map->string_list(), files);
      continue;
    }
    std::vector<int64_t> ids(size_t(map->size()));
    for (int64_t d = 0; d < map->size(); ++d) ids[size_t(d)] = map->raw(d);
    write_npy(dir + "/" + name, "<i8", {map->size()}, ids.data(), 8);
    (*files)[name] = {{"shape", {map->size()}},
                      {"dtype", "int64"},
                      {"what", "the dataset's original id of each row"}};
  }
}

std::string npy_manifest_text(const TrainedModel& m, const nlohmann::json& files) {
  const nlohmann::json manifest = {{"model", "NeuMF"},
                                   {"mf_dim", m.config.mf_dim},
                                   {"layers", m.config.layers},
                                   {"embedding_width", m.D},
                                   {"num_users", m.U},
                                   {"num_items", m.I},
                                   {"checkpoint", m.path},
                                   {"step", m.manifest.step},
                                   {"dataset_id", m.manifest.dataset_id},
                                   {"score", "sigmoid(logit)"},
                                   {"files", files}};
  return manifest.dump(2) + "\n";
}

void export_npy(const TrainedModel& m, const std::string& dir, const std::string& data_dir) {
  // The maps first: a --data_dir of another dataset is refused before any file is written.
  const std::optional<IdMaps> maps = export_id_maps(m, data_dir);
  std::filesystem::create_directories(dir);
  nlohmann::json files = nlohmann::json::object();
  for (TrainedModel::Table t : {TrainedModel::kUsers, TrainedModel::kItems}) {
    const std::string file = npy_table_file(t);
    write_npy(dir + "/" + file, "<f4", {m.rows(t), m.D}, 4, [&](const NpyAppend& append) {
      m.for_each_piece(t, export_piece_rows(m.D), [&](int64_t, int64_t rows, const float* data) {
        append(data, size_t(rows * m.D) * 4);
      });
    });
    files[file] = npy_table_entry(m, t);
  }
  write_npy_tower(m, dir, &files);
  if (maps) write_npy_ids(*maps, dir, &files);
  write_file_atomic(dir + "/manifest.json", npy_manifest_text(m, files));
}

}  // namespace ncf
