// Proof that the CUDA build works: a SAXPY kernel behind a host launcher, run by
// the gpu-labelled test when a GPU is present.
#include <cuda_runtime.h>

namespace ncf {
namespace {
__global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
}  // namespace

// y = a*x + y on device pointers; returns the launch error code (0 on success).
int cuda_saxpy(int n, float a, const float* x, float* y) {
  if (n <= 0) return 0;
  saxpy_kernel<<<(n + 255) / 256, 256>>>(n, a, x, y);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace ncf
