// The dense tower's optimizers: element-wise updates of the flat NeuMF
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
void dense_adagrad_step(const ExecContext& ctx, float* params, const float* grads, float* acc,
                        int64_t n, const AdagradHyper& h);
void dense_sgd_step(const ExecContext& ctx, float* params, const float* grads, int64_t n,
                    const SgdHyper& h);
// acc[0..n) = h.initial_accumulator (ops.h fill, so no twin of its own).
void adagrad_init(const ExecContext& ctx, float* acc, int64_t n, const AdagradHyper& h);

#ifdef NCF_WITH_CUDA
// The CUDA twins (optim.cu); called through the dispatch in optim.cc only.
namespace cuda {
void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m, float* v,
                     int64_t n, int64_t t, const AdamHyper& h);
void dense_adagrad_step(const ExecContext& ctx, float* params, const float* grads, float* acc,
                        int64_t n, const AdagradHyper& h);
void dense_sgd_step(const ExecContext& ctx, float* params, const float* grads, int64_t n,
                    const SgdHyper& h);
}  // namespace cuda
#endif

}  // namespace ncf
