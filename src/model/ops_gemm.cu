// CUDA twins of the GEMM ops in ops_gemm.h (same names and arguments; the CPU
// functions check the arguments and forward here when ctx.device is kCuda).
// GEMMs go to cuBLAS (gemm, the backward products) and cuBLASLt (the forward
// Linear with its bias and ReLU fused into the epilogue); in MathMode::kBf16 a
// kernel first writes BF16 copies of both operands into the scratch arena and
// the GEMM reads those (FP32 accumulation and output). Everything that sums
// over the batch (the bias gradients) uses the fixed-order
// reductions of cuda_util.cuh, so every result is the same bits on every run.
// Everything runs on ctx.stream.

#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "model/ops_internal.cuh"

namespace ncf::cuda {

namespace {

// dst[i] = the FP32 value of BF16 src[i], i < n.
__global__ void widen_bf16_kernel(const uint16_t* __restrict__ src, float* __restrict__ dst,
                                  int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) dst[i] = bf16_bits_to_float(src[i]);
}

// C[M×N] = beta·C (beta == 0 writes zeros, so NaNs in C do not leak): GEMM with K == 0.
__global__ void scale_rows_kernel(float* C, int64_t ldc, int M, int N, float beta) {
  const int64_t total = static_cast<int64_t>(M) * N;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    float& c = C[(i / N) * ldc + i % N];
    c = beta == 0.0f ? 0.0f : beta * c;
  }
}

// Y[B×out] = act(Y + bias): the epilogue when cuBLASLt has no fused algorithm.
__global__ void bias_act_kernel(float* Y, const float* bias, int64_t B, int out, bool relu) {
  const int64_t total = B * out;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    float y = Y[i];
    if (bias) y += bias[i % out];
    if (relu) y = y > 0.0f ? y : 0.0f;
    Y[i] = y;
  }
}

// ---- GEMM -------------------------------------------------------------------------

// TF32 tensor cores for kTf32; otherwise plain FP32 accumulation (for kBf16
// the operands are BF16 arrays, the products and sums FP32).
cublasComputeType_t compute_type(MathMode mode) {
  return mode == MathMode::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// Elements that a BF16 copy of a rows × cols matrix with stride ld needs.
size_t bf16_copy_elems(int64_t rows, int64_t cols, int64_t ld) {
  return rows > 0 && cols > 0 ? static_cast<size_t>((rows - 1) * ld + cols) : 0;
}

// Writes the BF16 copy of src (rows × cols, stride ld) into dst, on the stream.
GemmInput to_bf16(cudaStream_t stream, const float* src, int64_t ld, int64_t rows, int64_t cols,
                  __nv_bfloat16* dst, const char* op) {
  if (rows <= 0 || cols <= 0) return {dst, CUDA_R_16BF};
  launch_to_bf16(stream, src, ld, rows, cols, reinterpret_cast<uint16_t*>(dst), ld);
  check_launch(op);
  return {dst, CUDA_R_16BF};
}

}  // namespace

// Row-major C = alpha·op(A)·op(B) + beta·C through column-major cuBLAS: a
// row-major matrix is its transpose in column-major, so cuBLAS computes
// C^T = op(B)^T·op(A)^T with the operands swapped. A and B are both FP32 or
// both BF16; C is FP32.
//
// c_type CUDA_R_16BF (BF16 storage's dX): C is BF16, the FP32 accumulator rounded
// once by cuBLAS (beta 0, K > 0 only).
void gemm_typed(const ExecContext& ctx, MathMode mode, bool trans_a, bool trans_b, int M, int N,
                int K, float alpha, GemmInput A, int lda, GemmInput B, int ldb, float beta, void* C,
                int ldc, const char* op, cudaDataType_t c_type) {
  if (M == 0 || N == 0) return;
  cudaStream_t stream = stream_of(ctx);
  NCF_CHECK(c_type == CUDA_R_32F || (beta == 0.0f && K > 0), op,
            ": a BF16 output takes beta 0 and K > 0");
  if (K == 0) {
    scale_rows_kernel<<<grid_for(static_cast<int64_t>(M) * N), kThreads, 0, stream>>>(
        static_cast<float*>(C), ldc, M, N, beta);
    check_launch(op);
    return;
  }
  NCF_CHECK(A.type == B.type, op, ": GEMM operands of different types");
  NCF_CHECK(ctx.cublas != nullptr, op,
            ": ctx.cublas is null (make the context with "
            "make_cuda_context)");
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx.cublas);
  CUBLAS_CHECK(cublasSetStream(h, stream));
  CUBLAS_CHECK(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B.data, B.type,
                            ldb, A.data, A.type, lda, &beta, C, c_type, ldc, compute_type(mode),
                            CUBLAS_GEMM_DEFAULT));
}

// gemm() on FP32 operands under the current math mode: kBf16 first rounds A
// and B into BF16 copies, side by side in the scratch arena.
void gemm_on(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc,
             const char* op) {
  const MathMode mode = math_mode();
  GemmInput a{A, CUDA_R_32F}, b{B, CUDA_R_32F};
  if (mode == MathMode::kBf16 && M > 0 && N > 0 && K > 0) {
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    __nv_bfloat16 *a16 = nullptr, *b16 = nullptr;
    carve_scratch(cuda_resources(ctx, op), [&](ScratchLayout& s) {
      a16 = s.take<__nv_bfloat16>(bf16_copy_elems(a_rows, a_cols, lda));
      b16 = s.take<__nv_bfloat16>(bf16_copy_elems(b_rows, b_cols, ldb));
    });
    a = to_bf16(stream_of(ctx), A, lda, a_rows, a_cols, a16, op);
    b = to_bf16(stream_of(ctx), B, ldb, b_rows, b_cols, b16, op);
  }
  gemm_typed(ctx, mode, trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc, op);
}

namespace {

// ---- cuBLASLt Linear forward ----------------------------------------------------------

// The largest power of two <= 256 dividing the address: cuBLASLt's heuristic
// assumes 256-byte aligned operands unless told otherwise, and the layers'
// weights and biases sit at arbitrary float offsets in the flat parameter buffer.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 4 && a % al != 0) al >>= 1;
  return al;
}

// Owns the cuBLASLt descriptors of one matmul.
struct LtDescriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// The heuristic's pick, remembered per shape, alignment, epilogue, compute type
// and input type (asking costs tens of microseconds; a training run sees a
// handful of shapes). The input type separates kBf16 from kFp32, which share
// CUBLAS_COMPUTE_32F.
using LtKey =
    std::tuple<int, int64_t, int, int, uint32_t, uint32_t, uint32_t, uint32_t, int, int, int, int>;
struct LtChoice {
  bool ok = false;
  cublasLtMatmulAlgo_t algo{};
};
std::mutex g_lt_mutex;
std::map<LtKey, LtChoice> g_lt_choices;

// The heuristic's pick for the matmul m describes (D = A·B, C = D), remembered under
// `key`: asked once per key, with A, B and D (and C) aligned to al_a, al_b, al_d bytes
// and the context's workspace. ok false when cuBLASLt offers no algorithm.
LtChoice lt_choose(CudaResources& r, LtDescriptors& m, const LtKey& key, uint32_t al_a,
                   uint32_t al_b, uint32_t al_d) {
  {
    std::lock_guard<std::mutex> lock(g_lt_mutex);
    auto it = g_lt_choices.find(key);
    if (it != g_lt_choices.end()) return it->second;
  }
  LtChoice choice;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&m.pref));
  const uint64_t ws = r.lt_workspace_bytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      m.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d}};
  for (const auto& [attr, value] : aligns)
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(m.pref, attr, &value, sizeof(value)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(r.lt, m.desc, m.a, m.b, m.d, m.d, m.pref, 1, &result, &found);
  choice.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (choice.ok) choice.algo = result.algo;
  std::lock_guard<std::mutex> lock(g_lt_mutex);
  if (g_lt_choices.size() > 4096) g_lt_choices.clear();  // many batch sizes: start over
  g_lt_choices[key] = choice;
  return choice;
}

// m's matmul descriptor: FP32 scale type, `compute`, op(A) and op(B), the epilogue.
void lt_describe(LtDescriptors& m, cublasComputeType_t compute, cublasOperation_t ta,
                 cublasOperation_t tb, cublasLtEpilogue_t epilogue) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&m.desc, compute, CUDA_R_32F));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(m.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(m.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(m.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
}

// Y = act(X·weight^T + bias) as one cuBLASLt matmul; false when cuBLASLt offers no
// algorithm for this shape and alignment (the caller then runs GEMM + epilogue).
// Y and the bias are of `out_type`: FP32, or BF16 (linear_forward_bf16: the epilogue
// adds the BF16 bias to the FP32 product and stores the activation rounded to BF16).
// The heuristic filters algorithms by the operands' alignment, but users of the
// bias epilogue report misaligned-address faults for biases below 16 bytes, so
// such a bias (a layer width not a multiple of 4 in the flat parameter buffer)
// takes the unfused path.
//
// X and weight are both FP32 or both BF16 (`in_type`); Y and the bias are FP32 in
// either case. cuBLASLt lists BF16 A/B with FP32 C/D under CUBLAS_COMPUTE_32F
// among its supported type combinations (cuBLAS docs, cublasLtMatmul), and the
// bias vector takes D's type by default (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE in
// cublasLt.h), so the FP32 bias and the BIAS / RELU_BIAS epilogues carry over.
// Should a cuBLASLt build offer no algorithm for it, the heuristic fails and the
// caller takes the unfused path on the same BF16 copies.
bool lt_linear_forward(const ExecContext& ctx, CudaResources& r, MathMode mode, const void* X,
                       const void* weight, cudaDataType_t in_type, const void* bias, void* Y,
                       cudaDataType_t out_type, int64_t B, int in, int out, bool relu) {
  if (bias && !aligned16(bias)) return false;
  const cublasComputeType_t compute = compute_type(mode);
  const cublasLtEpilogue_t epilogue =
      bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
           : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  LtDescriptors m;
  // Column-major view: D[out×B] = op(A)·B with A = weight stored [in×out] (ld in),
  // op(A) = A^T, and B = X stored [in×B] (ld in); D is Y stored [out×B] (ld out).
  lt_describe(m, compute, CUBLAS_OP_T, CUBLAS_OP_N, epilogue);
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(m.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&m.a, in_type, uint64_t(in), uint64_t(out), in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&m.b, in_type, uint64_t(in), uint64_t(B), in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&m.d, out_type, uint64_t(out), uint64_t(B), out));

  const uint32_t al_w = alignment_of(weight), al_x = alignment_of(X), al_y = alignment_of(Y);
  const uint32_t al_b = bias ? alignment_of(bias) : 256;
  const LtKey key{
      r.device_id,  B, in, out, al_w, al_x, al_y, al_b, int(epilogue), int(compute), int(in_type),
      int(out_type)};
  const LtChoice choice = lt_choose(r, m, key, al_w, al_x, al_y);
  if (!choice.ok) return false;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(r.lt, m.desc, &alpha, weight, m.a, X, m.b, &beta, Y, m.d, Y, m.d,
                              &choice.algo, r.lt_workspace, r.lt_workspace_bytes, stream_of(ctx)));
  return true;
}

// dY[i] = Y[i] > 0 ? dY[i] : 0 for i < n (NaN → 0, as the CPU twin): full stores,
// four floats at a time when both arrays are 16-byte aligned (vec), the last n % 4
// (or all, without vec) one at a time. (The kernel it replaced stored only the zeros,
// one element per thread: bench/kernels/linear_bias_mask.cu.)
__global__ void relu_mask_stream_kernel(const float* __restrict__ Y, float* __restrict__ dY,
                                        int64_t n, bool vec) {
  const int64_t quads = vec ? n / 4 : 0;
  for (int64_t q = thread_first(); q < quads; q += thread_stride()) {
    const float4 y = reinterpret_cast<const float4*>(Y)[q];
    float4 g = reinterpret_cast<const float4*>(dY)[q];
    g.x = y.x > 0.0f ? g.x : 0.0f;
    g.y = y.y > 0.0f ? g.y : 0.0f;
    g.z = y.z > 0.0f ? g.z : 0.0f;
    g.w = y.w > 0.0f ? g.w : 0.0f;
    reinterpret_cast<float4*>(dY)[q] = g;
  }
  for (int64_t i = quads * 4 + thread_first(); i < n; i += thread_stride())
    dY[i] = Y[i] > 0.0f ? dY[i] : 0.0f;
}

// The ReLU mask of dY (relu_mask_stream_kernel, relu_mask_bf16_kernel) and the bias
// gradient's column sums of the masked dY (col_sums_kernel over ColumnsOp or
// Bf16ColumnsOp) in one pass over the arrays: block (x, y) takes col_sums_kernel's rows
// [x·kColChunk, …) and the words [32y, 32y+32) of each row, a word W being P adjacent
// columns as stored (an FP32 or a BF16, or two BF16s in 32 bits: one 4-byte load where
// the one-column kernel made two 2-byte loads, which on an H200 ran at 44% of HBM peak,
// the GPU kit's step_ncu_bf16 stage, 2026-11-27). Thread (tx, ty) takes its
// rows ty, ty+8, … in that order, kMaskRowsInFlight of them loaded before the first is
// stored (each word stored whole), and the thread rows are combined in ty order per
// column. The same masked values added in the same order: both kernels' bits.
constexpr int kMaskRowsInFlight = 8;
template <typename W, int P>
__global__ void __launch_bounds__(kColLanes* kColRows)
    mask_col_sums_kernel(const W* __restrict__ Y, W* __restrict__ dY, int64_t B, int C,
                         double* __restrict__ partial) {
  const int c = blockIdx.y * kColLanes + threadIdx.x;  // columns P·c … P·c + P − 1
  const int words = C / P;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kColChunk;
  const int64_t b1 = b0 + kColChunk < B ? b0 + kColChunk : B;
  double acc[P];
#pragma unroll
  for (int l = 0; l < P; ++l) acc[l] = 0.0;
  if (c < words) {
    for (int64_t base = b0 + threadIdx.y; base < b1; base += kColRows * kMaskRowsInFlight) {
      W g[kMaskRowsInFlight], y[kMaskRowsInFlight];
#pragma unroll
      for (int k = 0; k < kMaskRowsInFlight; ++k) {
        const int64_t b = base + static_cast<int64_t>(k) * kColRows;
        if (b < b1) {
          g[k] = dY[b * words + c];
          y[k] = Y[b * words + c];
        }
      }
#pragma unroll
      for (int k = 0; k < kMaskRowsInFlight; ++k) {
        const int64_t b = base + static_cast<int64_t>(k) * kColRows;
        if (b < b1) {
          const W m = relu_masked(y[k], g[k]);
          dY[b * words + c] = m;
#pragma unroll
          for (int l = 0; l < P; ++l) acc[l] += static_cast<double>(lane_value(m, l));
        }
      }
    }
  }
  store_col_partials<P>(acc, c, C, partial);
}

// dY masked by Y > 0 in place and store(c, Σ_b dY[b, c]): deterministic_col_sums'
// chunks, groups and order (partial holds col_chunks(B)·C doubles). BF16 with an even C
// on 4-byte aligned arrays takes two columns per thread.
template <typename T, typename Store>
void masked_col_sums(cudaStream_t stream, const T* Y, T* dY, int64_t B, int C, double* partial,
                     Store store, const char* what) {
  run_col_sums(stream, B, C, partial, store, what, [&](dim3 grid, dim3 block) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      const auto aligned4 = [](const void* p) {
        return (reinterpret_cast<uintptr_t>(p) & 3u) == 0;
      };
      if (C % 2 == 0 && aligned4(Y) && aligned4(dY)) {
        grid.y = static_cast<unsigned>((C / 2 + kColLanes - 1) / kColLanes);
        mask_col_sums_kernel<uint32_t, 2><<<grid, block, 0, stream>>>(
            reinterpret_cast<const uint32_t*>(Y), reinterpret_cast<uint32_t*>(dY), B, C, partial);
        return;
      }
    }
    mask_col_sums_kernel<T, 1><<<grid, block, 0, stream>>>(Y, dY, B, C, partial);
  });
}

// Column sums of a row-major [B × out] array, read only (the streaming bias gradient).
struct ColumnsOp {
  const float* __restrict__ X;
  int out;
  __device__ double operator()(int64_t b, int c) const { return X[b * out + c]; }
};

// dY[i] = Y[i] > 0 ? dY[i] : 0 on BF16 bits (NaN → 0, as the FP32 mask): full
// stores, eight BF16s (16 bytes) at a time when both arrays are 16-byte aligned
// (vec), the last n % 8 (or all, without vec) one at a time.
__global__ void relu_mask_bf16_kernel(const uint16_t* __restrict__ Y, uint16_t* __restrict__ dY,
                                      int64_t n, bool vec) {
  const int64_t octets = vec ? n / 8 : 0;
  for (int64_t q = thread_first(); q < octets; q += thread_stride()) {
    const uint4 y = reinterpret_cast<const uint4*>(Y)[q];
    const uint4 g = reinterpret_cast<const uint4*>(dY)[q];
    reinterpret_cast<uint4*>(dY)[q] = mask_bf16_octet(y, g);
  }
  for (int64_t i = octets * 8 + thread_first(); i < n; i += thread_stride())
    dY[i] = bf16_bits_to_float(Y[i]) > 0.0f ? dY[i] : uint16_t{0};
}

// Column sums of a row-major [B × out] BF16 array.
struct Bf16ColumnsOp {
  const uint16_t* __restrict__ X;
  int out;
  __device__ double operator()(int64_t b, int c) const {
    return bf16_bits_to_float(X[b * out + c]);
  }
};

}  // namespace

void gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  gemm_on(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, "gemm");
}

void linear_forward(const ExecContext& ctx, const float* X, const float* weight, const float* bias,
                    float* Y, int64_t B, int in, int out, bool relu) {
  const char* op = "linear_forward";
  if (B == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  const MathMode mode = math_mode();
  GemmInput x{X, CUDA_R_32F}, w{weight, CUDA_R_32F};
  if (mode == MathMode::kBf16) {
    __nv_bfloat16 *x16 = nullptr, *w16 = nullptr;
    carve_scratch(r, [&](ScratchLayout& s) {
      x16 = s.take<__nv_bfloat16>(bf16_copy_elems(B, in, in));
      w16 = s.take<__nv_bfloat16>(bf16_copy_elems(out, in, in));
    });
    x = to_bf16(stream_of(ctx), X, in, B, in, x16, op);
    w = to_bf16(stream_of(ctx), weight, in, out, in, w16, op);
  }
  if (lt_linear_forward(ctx, r, mode, x.data, w.data, x.type, bias, Y, CUDA_R_32F, B, in, out,
                        relu))
    return;
  gemm_typed(ctx, mode, false, true, static_cast<int>(B), out, in, 1.0f, x, in, w, in, 0.0f, Y, out,
             op);
  if (bias || relu) {
    bias_act_kernel<<<grid_for(B * out), kThreads, 0, stream_of(ctx)>>>(Y, bias, B, out, relu);
    check_launch(op);
  }
}

void linear_backward(const ExecContext& ctx, const float* X, const float* weight, const float* Y,
                     float* dY, float* dX, float* dweight, float* db, int64_t B, int in, int out,
                     bool relu, GradMode mode) {
  const char* op = "linear_backward";
  cudaStream_t stream = stream_of(ctx);
  const bool add = mode == GradMode::kAccumulate;
  const MathMode math = math_mode();
  const bool bf16 = math == MathMode::kBf16 && B > 0;
  // One scratch layout for the whole op (carving again could move the arena
  // under arrays still in use): the bias partial sums, and in kBf16 the BF16
  // copies of dZ [B×out], weight [out×in] (only for dX) and X [B×in].
  double* partial = nullptr;
  __nv_bfloat16 *dz16 = nullptr, *w16 = nullptr, *x16 = nullptr;
  if (db || bf16) {
    carve_scratch(cuda_resources(ctx, op), [&](ScratchLayout& s) {
      if (db) partial = s.take<double>(static_cast<size_t>(col_chunks(B)) * out);
      if (bf16) {
        dz16 = s.take<__nv_bfloat16>(bf16_copy_elems(B, out, out));
        if (dX) w16 = s.take<__nv_bfloat16>(bf16_copy_elems(out, in, in));
        x16 = s.take<__nv_bfloat16>(bf16_copy_elems(B, in, in));
      }
    });
  }
  // 1. dZ: dY masked in place, and the bias column sums of it when there is a bias.
  if (relu && db) {  // the mask and its column sums in one pass
    masked_col_sums(stream, Y, dY, B, out, partial, GradStore{db, add}, op);
  } else if (relu && B > 0) {
    relu_mask_stream_kernel<<<grid_for(B * out / 4 + 1), kThreads, 0, stream>>>(
        Y, dY, B * out, aligned16(Y) && aligned16(dY));
    check_launch(op);
  } else if (db) {
    deterministic_col_sums(stream, B, out, ColumnsOp{dY, out}, partial, GradStore{db, add}, op);
  }
  // The GEMM inputs: FP32 as they are, or BF16 copies of the masked dZ, weight and X.
  GemmInput dz{dY, CUDA_R_32F}, w{weight, CUDA_R_32F}, x{X, CUDA_R_32F};
  if (bf16) {
    dz = to_bf16(stream, dY, out, B, out, dz16, op);
    if (dX) w = to_bf16(stream, weight, in, out, in, w16, op);
    x = to_bf16(stream, X, in, B, in, x16, op);
  }
  // 2. dX[B×in] = dZ[B×out]·weight[out×in].
  if (dX && B > 0)
    gemm_typed(ctx, math, false, false, static_cast<int>(B), in, out, 1.0f, dz, out, w, in, 0.0f,
               dX, in, op);
  // 3. dweight[out×in] = dZ^T·X (B == 0: K == 0, so dweight = beta·dweight).
  gemm_typed(ctx, math, true, false, out, in, static_cast<int>(B), 1.0f, dz, out, x, in,
             add ? 1.0f : 0.0f, dweight, in, op);
}

// ---- BF16 storage -----------------------------------------------------------------------
// The products read BF16 arrays as they are and accumulate in FP32. A BF16 output
// is rounded once after its epilogue: by cuBLAS for dX (no epilogue, to nearest) and
// for the layers above layer 0 (cuBLASLt's bias and ReLU epilogue); for layer 0 the
// FP32 product goes to the scratch arena and one kernel applies the epilogue (bias,
// ReLU, the users' rows) and rounds with bf16.h's float_to_bf16_bits, as the CPU twin
// rounds.

void gemm_bf16(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
               const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc) {
  gemm_typed(ctx, MathMode::kBf16, trans_a, trans_b, M, N, K, 1.0f, GemmInput{A, CUDA_R_16BF}, lda,
             GemmInput{B, CUDA_R_16BF}, ldb, 0.0f, C, ldc, "gemm_bf16");
}

void linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                         const uint16_t* bias, uint16_t* Y, int64_t B, int in, int out, bool relu) {
  const char* op = "linear_forward_bf16";
  if (B == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  // One cuBLASLt matmul writing the BF16 activations: its bias epilogue takes a
  // bias of D's type (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), hence the
  // BF16 bias of this op.
  if (lt_bf16_out_enabled() && lt_linear_forward(ctx, r, MathMode::kBf16, X, weight, CUDA_R_16BF,
                                                 bias, Y, CUDA_R_16BF, B, in, out, relu))
    return;
  // Else the FP32 product and the epilogue kernel, on the bias widened to FP32: the
  // same sum of the same two values, rounded once.
  float *Z = nullptr, *bias32 = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    Z = s.take<float>(static_cast<size_t>(B) * out);
    if (bias) bias32 = s.take<float>(static_cast<size_t>(out));
  });
  cudaStream_t stream = stream_of(ctx);
  if (bias) widen_bf16_kernel<<<grid_for(out), kThreads, 0, stream>>>(bias, bias32, out);
  gemm_typed(ctx, MathMode::kBf16, false, true, static_cast<int>(B), out, in, 1.0f,
             GemmInput{X, CUDA_R_16BF}, in, GemmInput{weight, CUDA_R_16BF}, in, 0.0f, Z, out, op);
  launch_bias_act_bf16(stream, Z, nullptr, 1, bias32, Y, B, out, relu);
  check_launch(op);
}

void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu) {
  const char* op = "linear_backward_bf16";
  cudaStream_t stream = stream_of(ctx);
  double* partial = nullptr;  // the bias partial sums
  if (db) {
    carve_scratch(cuda_resources(ctx, op), [&](ScratchLayout& s) {
      partial = s.take<double>(static_cast<size_t>(col_chunks(B)) * out);
    });
  }
  if (relu && db) {  // the mask and its column sums in one pass
    masked_col_sums(stream, Y, dY, B, out, partial, GradStore{db, false}, op);
  } else if (relu && B > 0) {
    const bool vec = aligned16(Y) && aligned16(dY);
    relu_mask_bf16_kernel<<<grid_for(vec ? B * out / 8 + 1 : B * out), kThreads, 0, stream>>>(
        Y, dY, B * out, vec);
    check_launch(op);
  } else if (db) {
    deterministic_col_sums(stream, B, out, Bf16ColumnsOp{dY, out}, partial, GradStore{db, false},
                           op);
  }
  // dX = dZ·weight, written as BF16 by cuBLAS (no epilogue: one rounding of the
  // FP32 accumulator).
  if (dX && B > 0)
    gemm_typed(ctx, MathMode::kBf16, false, false, static_cast<int>(B), in, out, 1.0f,
               GemmInput{dY, CUDA_R_16BF}, out, GemmInput{weight, CUDA_R_16BF}, in, 0.0f, dX, in,
               op, CUDA_R_16BF);
  gemm_typed(ctx, MathMode::kBf16, true, false, out, in, static_cast<int>(B), 1.0f,
             GemmInput{dY, CUDA_R_16BF}, out, GemmInput{X, CUDA_R_16BF}, in, 0.0f, dweight, in, op);
}

}  // namespace ncf::cuda
