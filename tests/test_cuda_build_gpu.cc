// The CUDA build runs on this machine's GPU: cuda_smoke's SAXPY against the
// same loop on the host, and a context made and destroyed. Skipped, visibly,
// where there is no usable GPU (or no CUDA backend in the build).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/cuda_context.h"
#include "common/device.h"
#include "test_util.h"

#ifdef NCF_WITH_CUDA
namespace ncf {
int cuda_saxpy(int n, float a, const float* x, float* y);  // common/cuda_smoke.cu
}  // namespace ncf
#endif

namespace ncf {
namespace {

TEST(CudaBuild, SaxpyMatchesHostLoop) {
  NCF_GPU_OR_SKIP();
#ifdef NCF_WITH_CUDA
  for (int n : {0, 1, 255, 256, 257, 100003}) {
    std::vector<float> x(n), y(n), want(n);
    for (int i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i % 17) - 8.0f;  // small integers: every result exact
      y[i] = static_cast<float>(i % 5);
      want[i] = 3.0f * x[i] + y[i];
    }
    Buffer<float> dx(Device::kCuda, n), dy(Device::kCuda, n);
    device_copy(Device::kCuda, dx.data(), Device::kCpu, x.data(), dx.bytes());
    device_copy(Device::kCuda, dy.data(), Device::kCpu, y.data(), dy.bytes());
    ASSERT_EQ(cuda_saxpy(n, 3.0f, dx.data(), dy.data()), 0) << "n=" << n;
    device_copy(Device::kCpu, y.data(), Device::kCuda, dy.data(), dy.bytes());
    EXPECT_EQ(y, want) << "n=" << n;
  }
#endif
}

TEST(CudaBuild, ContextHasStreamHandlesAndResources) {
  NCF_GPU_OR_SKIP();
  ExecContext ctx = make_cuda_context(0);
  EXPECT_EQ(ctx.device, Device::kCuda);
  EXPECT_NE(ctx.stream, nullptr);
  EXPECT_NE(ctx.cublas, nullptr);
  EXPECT_NE(ctx.cuda_resources, nullptr);
  check_device_errors(ctx);  // nothing recorded yet: no throw
  destroy_cuda_context(ctx);
  EXPECT_EQ(ctx.device, Device::kCpu);
  EXPECT_EQ(ctx.cuda_resources, nullptr);
}

}  // namespace
}  // namespace ncf
