// NumPy .npy files (format version 1.0: magic, version, a little-endian
// header length, a Python dict literal padded to 64 bytes, then the raw
// C-order array), and the NumPy export of a trained model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "export/trained_model.h"

namespace ncf {

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
// layer's), head_bias.npy [1], and manifest.json; with id maps (data_dir given and it has them)
// user_ids.npy and item_ids.npy: the original id of each row (int64, or for string ids NumPy
// bytes |S<w>; when fixed width would be wasteful, NAME_offsets.npy and NAME_bytes.npy instead).
void export_npy(const TrainedModel& m, const std::string& dir, const std::string& data_dir);

}  // namespace ncf
