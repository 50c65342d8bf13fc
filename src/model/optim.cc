// CPU side of optim.h: argument checks, dispatch, and the parallel loops that
// apply the shared update rules to the dense tower's parameters.
#include "model/optim.h"

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "model/ops.h"

namespace ncf {
namespace {

constexpr int64_t kElemGrain = 1 << 14;  // elements per chunk, at least

void check_dense(const char* op, const float* params, const float* grads, int64_t n) {
  NCF_CHECK(n >= 0, op, ": negative size n=", n);
  NCF_CHECK(n == 0 || (params && grads), op, ": params or grads is null with n=", n);
}

}  // namespace

void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m, float* v,
                     int64_t n, int64_t t, const AdamHyper& h) {
  const char* op = "dense_adam_step";
  check_dense(op, params, grads, n);
  NCF_CHECK(n == 0 || (m && v), op, ": m or v is null");
  AdamStepScalars s = adam_step_scalars(h, t);
  NCF_DISPATCH_CUDA(ctx, dense_adam_step, ctx, params, grads, m, v, n, t, h);
  parallel_for(ctx.threads, n, kElemGrain, [&](int64_t i0, int64_t i1) {
    adam_update_n(params + i0, m + i0, v + i0, grads + i0, i1 - i0, s);
  });
}

}  // namespace ncf
