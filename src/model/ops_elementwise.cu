// CUDA twins of the element-wise ops in ops_elementwise.h (same names and arguments;
// the CPU functions check the arguments and forward here when ctx.device is kCuda), and
// launch_to_bf16, which the GEMMs' BF16 operand copies share. Everything runs on ctx.stream.

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "model/ops_internal.cuh"

namespace ncf::cuda {

namespace {

// ---- element-wise kernels ---------------------------------------------------------

__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) x[i] = value;
}

// dst[r·ldd + c] = BF16 bits of src[r·lds + c] for r < rows, c < cols (the padding
// between rows is neither read nor written). The rounding is bf16.h's, so it
// matches the CPU twin bit for bit.
__global__ void to_bf16_kernel(const float* src, int64_t lds, int64_t rows, int cols, uint16_t* dst,
                               int64_t ldd) {
  const int64_t total = rows * cols;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ldd + c] = float_to_bf16_bits(src[r * lds + c]);
  }
}

// to_bf16_kernel four elements per thread: one float4 load and one 8-byte store,
// rows of 4·qpr columns at strides of lds4 float4s (src) and ldd4 groups of four
// BF16s (dst). A contiguous pair (kFlat) is one range; otherwise quad q's row is
// q / qpr, in 32 bits when the quads fit (k32). The same bits as to_bf16_kernel.
template <bool kFlat, bool k32>
__global__ void __launch_bounds__(kThreads)
    to_bf16_quads_kernel(const float4* __restrict__ src, int64_t lds4, int64_t rows, int qpr,
                         uint2* __restrict__ dst, int64_t ldd4) {
  const int64_t total = rows * qpr;
  for (int64_t q = thread_first(); q < total; q += thread_stride()) {
    int64_t ks = q, kd = q;
    if (!kFlat) {
      const int64_t r = row_of<k32>(q, qpr), c = q - r * qpr;
      ks = r * lds4 + c;
      kd = r * ldd4 + c;
    }
    const float4 v = src[ks];
    dst[kd] = make_uint2(bf16_pair(v.x, v.y), bf16_pair(v.z, v.w));
  }
}

}  // namespace

// dst (rows × cols, stride ldd) = BF16 bits of src (stride lds), four elements per
// thread where the widths, strides and alignment allow, else one. (One per thread for
// every shape lost on a GPU: bench/kernels/to_bf16.cu times it beside the quads.)
void launch_to_bf16(cudaStream_t stream, const float* src, int64_t lds, int64_t rows, int64_t cols,
                    uint16_t* dst, int64_t ldd) {
  const bool quads = cols % 4 == 0 && lds % 4 == 0 && ldd % 4 == 0 && aligned16(src) &&
                     (reinterpret_cast<uintptr_t>(dst) & 7u) == 0;
  if (!quads) {
    to_bf16_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(
        src, lds, rows, static_cast<int>(cols), dst, ldd);
    return;
  }
  const int qpr = static_cast<int>(cols / 4);
  const int64_t total = rows * qpr;
  const float4* s4 = reinterpret_cast<const float4*>(src);
  uint2* d4 = reinterpret_cast<uint2*>(dst);
  const unsigned grid = grid_for(total);
  if (lds == cols && ldd == cols) {
    to_bf16_quads_kernel<true, true>
        <<<grid, kThreads, 0, stream>>>(s4, lds / 4, rows, qpr, d4, ldd / 4);
  } else if (total <= int64_t{UINT32_MAX}) {
    to_bf16_quads_kernel<false, true>
        <<<grid, kThreads, 0, stream>>>(s4, lds / 4, rows, qpr, d4, ldd / 4);
  } else {
    to_bf16_quads_kernel<false, false>
        <<<grid, kThreads, 0, stream>>>(s4, lds / 4, rows, qpr, d4, ldd / 4);
  }
}

namespace {

// hi = bf16(x), lo = bf16(x − hi), one element per thread (split_bf16).
__global__ void split_bf16_kernel(const float* __restrict__ X, int64_t n, uint16_t* __restrict__ hi,
                                  uint16_t* __restrict__ lo) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) {
    const float x = X[i];
    const uint16_t h = float_to_bf16_bits(x);
    hi[i] = h;
    lo[i] = float_to_bf16_bits(__fsub_rn(x, bf16_bits_to_float(h)));
  }
}

// hi = tf32(x), lo = x − hi, one element per thread (split_tf32).
__global__ void split_tf32_kernel(const float* __restrict__ X, int64_t n, float* __restrict__ hi,
                                  float* __restrict__ lo) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) {
    const float x = X[i];
    const float h = round_to_tf32(x);
    hi[i] = h;
    lo[i] = __fsub_rn(x, h);
  }
}

}  // namespace

// ---- the twins -------------------------------------------------------------------------

void fill(const ExecContext& ctx, float* x, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(x, n, value);
  check_launch("fill");
}

void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B) {
  if (B == 0) return;
  launch_to_bf16(stream_of(ctx), X, ldx, B, w, Y, ldy);
  check_launch("to_bf16_rows");
}

void split_tf32(const ExecContext& ctx, const float* X, int64_t n, float* hi, float* lo) {
  if (n == 0) return;
  split_tf32_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(X, n, hi, lo);
  check_launch("split_tf32");
}

void split_bf16(const ExecContext& ctx, const float* X, int64_t n, uint16_t* hi, uint16_t* lo) {
  if (n == 0) return;
  split_bf16_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(X, n, hi, lo);
  check_launch("split_bf16");
}

}  // namespace ncf::cuda
