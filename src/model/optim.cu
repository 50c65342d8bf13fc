// CUDA twins of optim.h: the dense tower's optimizers, one thread per element,
// with the rules of common/update_rules.cuh (the CPU's formulas).
#include "common/cuda_util.cuh"
#include "common/update_rules.cuh"
#include "model/optim.h"

namespace ncf::cuda {
namespace {

// Dense parameters: element i of params with gradient grads[i].
template <typename Rule>
__global__ void dense_kernel(Rule rule, const float* grads, int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) rule.apply(i, grads[i]);
}

template <typename Rule>
void launch_dense(const ExecContext& ctx, const Rule& rule, const float* grads, int64_t n,
                  const char* op) {
  if (n == 0) return;
  dense_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(rule, grads, n);
  check_launch(op);
}

}  // namespace

void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m, float* v,
                     int64_t n, int64_t t, const AdamHyper& h) {
  launch_dense(ctx, AdamRule{params, m, v, adam_step_scalars(h, t)}, grads, n, "dense_adam_step");
}

}  // namespace ncf::cuda
