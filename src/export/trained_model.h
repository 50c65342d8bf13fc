// A trained NeuMF read from a checkpoint on one process, for export: the
// tower's parameters in memory, the user and item tables read from the
// checkpoint's files piece by piece (a table can be larger than the host's
// memory), whatever W wrote it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/neumf.h"
#include "train/checkpoint.h"

namespace ncf {

struct TrainedModel {
  std::string path;  // the checkpoint directory
  CheckpointManifest manifest;
  NeuMFConfig config;
  int D = 0;                  // row width: mf_dim GMF floats, then h MLP floats
  int64_t U = 0, I = 0;       // users, items
  std::vector<float> params;  // the tower in NeuMF's flat layout (model/neumf.h)
  std::vector<DenseLayerView> tower;
  int64_t head_w_offset = 0, head_c_offset = 0;
  std::shared_ptr<const CheckpointReader> reader;
  // For the user: a version 1 manifest, which has no checksum of its own.
  std::vector<std::string> warnings;

  enum Table { kUsers, kItems };
  int64_t rows(Table t) const { return t == kUsers ? U : I; }
  // The checkpoint's file of a table's rows ("user.rows.f32"): FP32 in global row order.
  static const char* table_file(Table t) { return t == kUsers ? "user.rows.f32" : "item.rows.f32"; }
  // Rows [first, first + count) of a table ([count×D]) from the checkpoint.
  void read_rows(Table t, int64_t first, int64_t count, float* out) const;
  // The whole table in order, in pieces of at most `piece_rows` rows through
  // one buffer: visit(first row, rows, data [rows×D]).
  void for_each_piece(Table t, int64_t piece_rows,
                      const std::function<void(int64_t, int64_t, const float*)>& visit) const;
};

// Rows per piece when a table is streamed: 64 MiB of rows.
int64_t export_piece_rows(int D);

// --checkpoint: a checkpoint or a directory of them (train/checkpoint.h:
// open_checkpoint), every file checked against its size and CRC first.
TrainedModel load_trained_model(const std::string& checkpoint);
// The same for a checkpoint whose files were checked already (ncf_export
// --verify): the shape checks and the tower, without reading the files again.
TrainedModel trained_model_of(std::shared_ptr<const CheckpointReader> reader);

}  // namespace ncf
