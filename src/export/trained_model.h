// A trained NeuMF read from a checkpoint on one process, for export: the
// tower's parameters and the user and item tables, whatever W wrote it.
#pragma once

#include <cstdint>
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
  std::vector<float> users, items;  // [U×D], [I×D]
};

// --checkpoint: a checkpoint or a directory of them (train/checkpoint.h:
// open_checkpoint), every file checked against its size and CRC first.
TrainedModel load_trained_model(const std::string& checkpoint);

}  // namespace ncf
