// The whole NeuMF as one ONNX model (opset 17, IR version 8):
//
//   inputs   user, item: int64 [N]  (dense ids: the table rows)
//   outputs  score: float32 [N] = Sigmoid(logit); logit: float32 [N]
//
//   g   = Mul(Gather(user_gmf, user), Gather(item_gmf, item))         [N×mf]
//   x0  = Concat(Gather(user_mlp, user), Gather(item_mlp, item))      [N×layers[0]]
//   x_l = Relu(Gemm(x_{l-1}, mlp_l_weight, mlp_l_bias, transB = 1))   [N×layers[l]]
//   logit = Add(MatMul(Concat(g, x_last), head_weight), head_bias)    [N]
//
// Each table is stored as two initializers, its GMF and MLP columns. A model
// whose initializers would pass what one protobuf message holds (2 GiB) keeps
// its largest tables in ONNX external data: one file beside the model,
// "<model file>.data", named in each tensor's external_data (location, offset,
// length; offsets page-aligned).
#pragma once

#include <cstdint>
#include <string>

#include "export/trained_model.h"

namespace ncf {

// kAuto: the largest table parts go to external data, one by one, until the
// initializers left inside the model hold at most `inline_limit` bytes;
// kAlways: all four table parts; kNever: none (an error past the limit).
enum class ExternalData { kAuto, kAlways, kNever };
// 1.5 GiB: under protobuf's 2 GiB message limit with room for the graph.
constexpr int64_t kOnnxInlineBytes = int64_t{3} << 29;

// Writes the model to `path` (and path + ".data" when tables go there, removing
// a stale one when none do), then runs the ONNX checker on the written file.
// Errors name the path.
void export_onnx(const TrainedModel& m, const std::string& path, ExternalData external,
                 int64_t inline_limit = kOnnxInlineBytes);

}  // namespace ncf
