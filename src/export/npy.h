// NumPy .npy files (format version 1.0: magic, version, a little-endian
// header length, a Python dict literal padded to 64 bytes, then the raw
// C-order array), and the NumPy export of a trained model.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/id_map.h"
#include "export/trained_model.h"

namespace ncf {

// The bytes write_npy puts before the data (magic, version, header length, the
// dict padded to a multiple of 64 bytes); `path` names the file in errors.
std::string npy_header(const std::string& path, const char* dtype,
                       const std::vector<int64_t>& shape);
// Writes an array of `dtype` "<f4" or "<i8" with `shape`, data[product(shape)].
void write_npy(const std::string& path, const char* dtype, const std::vector<int64_t>& shape,
               const void* data, size_t element_bytes);
// The same with the array written in pieces: body(append) calls append(data,
// bytes) with the array's bytes in order, product(shape) elements in all.
using NpyAppend = std::function<void(const void*, size_t)>;
void write_npy(const std::string& path, const char* dtype, const std::vector<int64_t>& shape,
               size_t element_bytes, const std::function<void(const NpyAppend&)>& body);

// DIR/user_embeddings.npy [U×D] (streamed from the checkpoint), item_embeddings.npy [I×D] (columns
// [0, mf): the GMF factors, [mf, D): the MLP embedding), mlp_<l>_weight.npy [out×in] and
// mlp_<l>_bias.npy [out] per tower layer, head_weight.npy [F] (GMF part first, then the last MLP
// layer's), head_bias.npy [1], and manifest.json; with id maps (export_id_maps) user_ids.npy and
// item_ids.npy: the original id of each row (int64, or for string ids NumPy bytes |S<w>; when
// fixed width would be wasteful, NAME_offsets.npy and NAME_bytes.npy instead).
void export_npy(const TrainedModel& m, const std::string& dir, const std::string& data_dir);

// The parts of export_npy, shared with the delta export (export/delta.h) so that a
// delta applied to the older export gives the newer one's bytes: each adds its
// files' entries to `files` (manifest.json's "files").
//
// The table's file ("user_embeddings.npy") and its entry.
std::string npy_table_file(TrainedModel::Table t);
nlohmann::json npy_table_entry(const TrainedModel& m, TrainedModel::Table t);
// The tower's arrays, mlp_<l>_weight.npy to head_bias.npy.
void write_npy_tower(const TrainedModel& m, const std::string& dir, nlohmann::json* files);
// The maps user_ids.npy / item_ids.npy are written from: the checkpoint's copy
// of its dataset's maps when it has one, else --data_dir's (identity maps of a
// dataset whose ids are dense), else none. A data_dir of another dataset than
// the checkpoint's is refused, naming both.
std::optional<IdMaps> export_id_maps(const TrainedModel& m, const std::string& data_dir);
void write_npy_ids(const IdMaps& maps, const std::string& dir, nlohmann::json* files);
// manifest.json's text.
std::string npy_manifest_text(const TrainedModel& m, const nlohmann::json& files);

}  // namespace ncf
