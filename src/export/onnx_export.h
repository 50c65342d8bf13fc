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
// "<model file>.data", named in each tensor's external_data.
#pragma once

#include <string>

#include "export/trained_model.h"

namespace ncf {

enum class ExternalData { kAuto, kAlways, kNever };

// Writes the model to `path` (and path + ".data" when tables go there), then
// runs the ONNX checker on the written file. Errors name the path.
void export_onnx(const TrainedModel& m, const std::string& path, ExternalData external);

}  // namespace ncf
