// The dense tower's optimizer, dense Adam: element-wise updates of the flat NeuMF
// parameter buffer with the shared rules of common/update_rules.h. The table
// optimizers live with the tables, in embedding/table_ops.h.
//
// Every op takes (ctx, arrays..., n, step/hyper), checks its arguments and
// dispatches once on ctx.device. Arrays live on ctx.device. Letters: n elements,
// t the 1-based global step.
#pragma once

#include <cstdint>

#include "common/device.h"
#include "common/update_rules.h"

namespace ncf {

void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m, float* v,
                     int64_t n, int64_t t, const AdamHyper& h);

#ifdef NCF_WITH_CUDA
// The CUDA twins (optim.cu); called through the dispatch in optim.cc only.
namespace cuda {
void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m, float* v,
                     int64_t n, int64_t t, const AdamHyper& h);
}  // namespace cuda
#endif

}  // namespace ncf
