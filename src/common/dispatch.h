// The one place where an op picks its backend: each public op checks its
// arguments, then NCF_DISPATCH_CUDA hands the call to its CUDA twin (same name
// and arguments, in namespace ncf::cuda) when ctx.device is kCuda, and falls
// through to the CPU code otherwise. Builds without the CUDA kernels
// (NCF_CUDA_KERNELS, set by the build once the *.cu twins exist) fail such
// calls loudly.
#pragma once

#include "common/check.h"
#include "common/device.h"

#if defined(NCF_WITH_CUDA) && defined(NCF_CUDA_KERNELS)
#define NCF_DISPATCH_CUDA(ctx, op, ...)         \
  do {                                          \
    if ((ctx).device == ::ncf::Device::kCuda) { \
      ::ncf::cuda::op(__VA_ARGS__);             \
      return;                                   \
    }                                           \
  } while (0)
#else
#define NCF_DISPATCH_CUDA(ctx, op, ...)                                       \
  do {                                                                        \
    if ((ctx).device == ::ncf::Device::kCuda)                                 \
      NCF_FAIL(#op                                                            \
               ": device cuda requested, but this build has no CUDA backend " \
               "(its CUDA kernels are not built)");                           \
  } while (0)
#endif
