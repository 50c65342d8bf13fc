// CUDA twins of the dense ops in ops.h (same names and arguments; the CPU
// functions check the arguments and forward here when ctx.device is kCuda).
// GEMMs go to cuBLAS (gemm, the backward products) and cuBLASLt (the forward
// Linear with its bias and ReLU fused into the epilogue); in MathMode::kBf16 a
// kernel first writes BF16 copies of both operands into the scratch arena and
// the GEMM reads those (FP32 accumulation and output). Everything that sums
// over the batch (bias gradients, the head, the loss) uses the fixed-order
// reductions of cuda_util.cuh, so every result is the same bits on every run.
// Everything runs on ctx.stream.
#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "common/id_runs.cuh"
#include "model/ops.h"
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

// dst[i] = the FP32 value of BF16 src[i], i < n.
__global__ void widen_bf16_kernel(const uint16_t* __restrict__ src, float* __restrict__ dst,
                                  int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) dst[i] = bf16_bits_to_float(src[i]);
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
// thread where the widths, strides and alignment allow and `quads` (legacy
// kernels: never), else one.
void launch_to_bf16(cudaStream_t stream, const float* src, int64_t lds, int64_t rows, int64_t cols,
                    uint16_t* dst, int64_t ldd, bool quads) {
  quads = quads && cols % 4 == 0 && lds % 4 == 0 && ldd % 4 == 0 && aligned16(src) &&
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

// dY[i] = 0 where Y[i] <= 0 (or NaN): the ReLU mask when no bias gradient is wanted.
__global__ void relu_mask_kernel(float* dY, const float* Y, int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride())
    if (!(Y[i] > 0.0f)) dY[i] = 0.0f;
}

// dst[b·ldd + k] = src[b·lds + k] for k < w; V is float or float4 (then w, lds
// and ldd count float4s).
template <typename V>
__global__ void copy_cols_kernel(const V* src, int64_t lds, V* dst, int64_t ldd, int64_t B, int w) {
  const int64_t total = B * w;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t b = i / w, k = i % w;
    dst[b * ldd + k] = src[b * lds + k];
  }
}

__global__ void gmf_forward_kernel(const float* urows, int64_t ldu, const float* irows, int64_t ldi,
                                   float* gmf, int64_t ldg, int64_t B, int mf) {
  const int64_t total = B * mf;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t b = i / mf, k = i % mf;
    gmf[b * ldg + k] = urows[b * ldu + k] * irows[b * ldi + k];
  }
}

__global__ void gmf_backward_kernel(const float* urows, int64_t ldu, const float* irows,
                                    int64_t ldi, const float* dgmf, int64_t ldg, float* durows,
                                    int64_t lddu, float* dirows, int64_t lddi, int64_t B, int mf) {
  const int64_t total = B * mf;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t b = i / mf, k = i % mf;
    const float g = dgmf[b * ldg + k];
    durows[b * lddu + k] = g * irows[b * ldi + k];
    dirows[b * lddi + k] = g * urows[b * ldu + k];
  }
}

// One warp per row: lane l sums columns l, l+32, …; a butterfly combines the
// lanes (a fixed order, so the logit is the same bits every run).
__global__ void head_forward_kernel(const float* H, const float* w, const float* c, float* logits,
                                    int64_t B, int F) {
  const int lane = threadIdx.x & 31;
  // thread_first() / 32 is the warp's index: uniform across the warp, so the
  // shuffles below always see all 32 lanes.
  for (int64_t b = thread_first() / 32; b < B; b += thread_stride() / 32) {
    const float* h = H + b * F;
    float s = 0.0f;
    for (int k = lane; k < F; k += 32) s += h[k] * w[k];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) logits[b] = s + c[0];
  }
}

// One row's BCE loss and gradient, as the CPU twins' bce_row_loss / bce_row_grad;
// bce_with_logits_* and neumf_top_backward share them, so they give the same bits.
__device__ __forceinline__ double bce_row_loss(double z, double y) {
  return (z < 0.0 ? 0.0 : z) - z * y + log1p(exp(-fabs(z)));
}
__device__ __forceinline__ float bce_row_grad(float z, float y, float wb, float inv_batch) {
  const float e = expf(-fabsf(z));  // exp of a non-positive number: no overflow
  const float sig = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return wb * (sig - y) * inv_batch;
}

__global__ void bce_backward_kernel(const float* logits, const float* labels, const float* weights,
                                    float* dlogits, int64_t B, int64_t n_valid, float inv_batch) {
  for (int64_t b = thread_first(); b < B; b += thread_stride()) {
    const float wb = b < n_valid ? (weights ? weights[b] : 1.0f) : 0.0f;
    dlogits[b] = wb == 0.0f ? 0.0f : bce_row_grad(logits[b], labels[b], wb, inv_batch);
  }
}

// ---- reduction operands (functors: the build has no extended lambdas) ----------------

// Bias gradient of a Linear: column sums of dZ, masking dY in place when relu.
struct LinearBiasOp {
  float* dY;
  const float* Y;
  int out;
  bool relu;
  __device__ double operator()(int64_t b, int c) const {
    const int64_t i = b * out + c;
    float g = dY[i];
    if (relu && !(Y[i] > 0.0f)) {
      g = 0.0f;
      dY[i] = 0.0f;
    }
    return g;
  }
};

// The head: columns 0..F-1 are dw (g·H[b, k], writing dH on the way), column F is dc (g).
struct HeadBackwardOp {
  const float* H;
  const float* w;
  const float* dlogits;
  float* dH;
  int F;
  __device__ double operator()(int64_t b, int c) const {
    const float g = dlogits[b];
    if (c == F) return g;
    dH[b * F + c] = g * w[c];
    return static_cast<double>(g) * H[b * F + c];
  }
};

struct HeadStore {
  float* dw;
  float* dc;
  int F;
  bool add;
  __device__ void operator()(int c, double total) const {
    float* dst = c < F ? dw + c : dc;
    const float v = static_cast<float>(total);
    *dst = add ? *dst + v : v;
  }
};

struct BceLossOp {
  const float* logits;
  const float* labels;
  const float* weights;
  __device__ void operator()(int64_t b, double (&acc)[1]) const {
    const double wb = weights ? weights[b] : 1.0;
    if (wb == 0.0) return;  // a masked row may hold garbage logits
    acc[0] += wb * bce_row_loss(logits[b], labels[b]);
  }
};

struct LossStore {
  double* loss;
  double global_batch;
  __device__ void operator()(int, double total) const { *loss = total / global_batch; }
};

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
  launch_to_bf16(stream, src, ld, rows, cols, reinterpret_cast<uint16_t*>(dst), ld,
                 step_kernels() == StepKernels::kStreaming);
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

// dX[B×in] = dZ[B×out]·weight[out×in] with cuBLASLt's DRELU epilogue: each element
// kept where its bit of `mask` (relu_mask_words(in) words per row: the aux layout, a
// column of D per row of dX) is 1, else 0. dZ and weight both of `in_type`; dX FP32.
// False when cuBLASLt offers no algorithm (the caller then masks after the GEMM).
bool lt_drelu_dx(const ExecContext& ctx, CudaResources& r, MathMode mode, const void* dZ,
                 const void* weight, cudaDataType_t in_type, float* dX, const uint32_t* mask,
                 int64_t B, int in, int out) {
  if (!aligned16(mask)) return false;
  const cublasComputeType_t compute = compute_type(mode);
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DRELU;
  LtDescriptors m;
  // Column-major view: D[in×B] = A·B with A = weight stored [in×out] (ld in), B = dZ
  // stored [out×B] (ld out), D = dX stored [in×B] (ld in); the aux bits of D's column
  // b are row b of the mask.
  lt_describe(m, compute, CUBLAS_OP_N, CUBLAS_OP_N, epilogue);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(m.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &mask, sizeof(mask)));
  const int64_t aux_ld = relu_mask_words(in) * 32;  // in bits
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(m.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                              sizeof(aux_ld)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&m.a, in_type, uint64_t(in), uint64_t(out), in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&m.b, in_type, uint64_t(out), uint64_t(B), out));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&m.d, CUDA_R_32F, uint64_t(in), uint64_t(B), in));

  const uint32_t al_w = alignment_of(weight), al_z = alignment_of(dZ), al_x = alignment_of(dX);
  const uint32_t al_m = alignment_of(mask);
  const LtKey key{
      r.device_id,    B, in, out, al_w, al_z, al_x, al_m, int(epilogue), int(compute), int(in_type),
      int(CUDA_R_32F)};
  const LtChoice choice = lt_choose(r, m, key, al_w, al_z, al_x);
  if (!choice.ok) return false;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(r.lt, m.desc, &alpha, weight, m.a, dZ, m.b, &beta, dX, m.d, dX, m.d,
                              &choice.algo, r.lt_workspace, r.lt_workspace_bytes, stream_of(ctx)));
  return true;
}

// X[b, j] = 0 where bit j of row b of `mask` is 0 (relu_mask_words(w) words per row).
__global__ void mask_by_bits_kernel(float* __restrict__ X, int64_t B, int w,
                                    const uint32_t* __restrict__ mask, int64_t words) {
  for (int64_t i = thread_first(); i < B * w; i += thread_stride()) {
    const int64_t b = i / w;
    const int j = static_cast<int>(i - b * w);
    if (!((mask[b * words + j / 32] >> (j % 32)) & 1u)) X[i] = 0.0f;
  }
}

// Chooses the float4 path when widths, strides and pointers allow it.
void copy_cols(cudaStream_t stream, const float* src, int64_t lds, float* dst, int64_t ldd,
               int64_t B, int w, const char* op) {
  if (B == 0) return;
  const bool vec = w % 4 == 0 && lds % 4 == 0 && ldd % 4 == 0 && aligned16(src) && aligned16(dst);
  if (vec) {
    copy_cols_kernel<<<grid_for(B * (w / 4)), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(src), lds / 4, reinterpret_cast<float4*>(dst), ldd / 4, B,
        w / 4);
  } else {
    copy_cols_kernel<<<grid_for(B * w), kThreads, 0, stream>>>(src, lds, dst, ldd, B, w);
  }
  check_launch(op);
}

// ---- groups (repeat_rows, group_bias_act, group_sum_backward) ------------------------

__global__ void repeat_rows_kernel(const float* X, int64_t ldx, int w, float* Y, int64_t n, int S) {
  for (int64_t i = thread_first(); i < n * S * w; i += thread_stride()) {
    const int64_t b = i / w, k = i % w;
    Y[i] = X[(b / S) * ldx + k];
  }
}

__global__ void group_bias_act_kernel(float* Y, const float* Yg, const float* bias, int64_t n,
                                      int S, int out, bool relu) {
  for (int64_t i = thread_first(); i < n * S * out; i += thread_stride()) {
    const int64_t b = i / out;
    const int j = static_cast<int>(i % out);
    const float z = __fadd_rn(__fadd_rn(Y[i], Yg[(b / S) * out + j]), bias ? bias[j] : 0.0f);
    Y[i] = relu ? (z > 0.0f ? z : 0.0f) : z;
  }
}

// One thread per (group, column): the mask, then the group's sum in s order.
__global__ void group_sum_kernel(const float* Y, float* dY, int64_t n, int S, int out, float* dYg,
                                 int64_t lddyg, bool relu) {
  for (int64_t x = thread_first(); x < n * out; x += thread_stride()) {
    const int64_t p = x / out;
    const int j = static_cast<int>(x % out);
    double acc = 0.0;
    for (int s = 0; s < S; ++s) {
      const int64_t i = (p * S + s) * out + j;
      if (relu && !(Y[i] > 0.0f)) dY[i] = 0.0f;
      acc += dY[i];
    }
    dYg[p * lddyg + j] = static_cast<float>(acc);
  }
}

struct GroupRowsOp {  // column sums of dYg
  const float* dYg;
  int64_t lddyg;
  __device__ double operator()(int64_t p, int c) const { return dYg[p * lddyg + c]; }
};

// ---- streaming kernels (StepKernels::kStreaming) --------------------------------------
// The legacy kernels above mask in place inside their sums' loops: a load, a
// conditional store into the lines the warp is reading, the next load, with no
// __restrict__, so each thread has one load in flight and a warp waits on a
// chain of round trips (shared/GPU_STEP.md 2.1: 5-8% of HBM bandwidth). These
// issue every load of a row group before any store, store the masked values in
// full (the unmasked lanes rewrite what they read, bit for bit), and sum in the
// same order in double: the same results as the legacy kernels, bit for bit.

constexpr int kGroupRowsInFlight = 8;  // rows of a group loaded before the first store

// One thread per (group p, L columns from j): the group's rows are taken
// kGroupRowsInFlight at a time, all their loads first; the masked rows are
// stored whole (kRelu), and each column's sum runs in s order in double, as
// group_sum_kernel's. A warp covers 32·L consecutive columns of one row.
// vec_out: dYg's rows may take float4 stores (16-byte aligned, lddyg % 4 == 0).
// kBits: the mask from the forward's ReLU bit mask (relu_mask_words' layout) instead of
// Y: one word per row and thread, L bits of it.
template <int L, bool kRelu, bool kBits = false>
__global__ void __launch_bounds__(kThreads)
    group_sum_stream_kernel(const float* __restrict__ Y, float* __restrict__ dY, int64_t n, int S,
                            int out, float* __restrict__ dYg, int64_t lddyg, bool vec_out,
                            const uint32_t* __restrict__ mask = nullptr, int64_t words = 0) {
  const int per_row = out / L;
  const int64_t total = n * per_row;
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t p = x / per_row;
    const int j = static_cast<int>(x - p * per_row) * L;
    const int64_t first = p * S * out + j;
    double acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = 0.0;
    for (int s0 = 0; s0 < S; s0 += kGroupRowsInFlight) {
      const int m = S - s0 < kGroupRowsInFlight ? S - s0 : kGroupRowsInFlight;
      Lanes<L> g[kGroupRowsInFlight], y[kGroupRowsInFlight];
      uint32_t bits[kGroupRowsInFlight];
#pragma unroll
      for (int k = 0; k < kGroupRowsInFlight; ++k) {
        if (k < m) {
          const int64_t i = first + static_cast<int64_t>(s0 + k) * out;
          g[k] = load_lanes<L>(dY + i);
          if (kRelu && kBits)
            bits[k] = mask[(p * S + s0 + k) * words + j / 32] >> (j % 32);
          else if (kRelu)
            y[k] = load_lanes<L>(Y + i);
        }
      }
#pragma unroll
      for (int k = 0; k < kGroupRowsInFlight; ++k) {
        if (k < m) {
          if (kRelu) {
#pragma unroll
            for (int l = 0; l < L; ++l) {
              const bool on = kBits ? ((bits[k] >> l) & 1u) != 0 : y[k].v[l] > 0.0f;
              g[k].v[l] = on ? g[k].v[l] : 0.0f;
            }
            store_lanes<L>(dY + first + static_cast<int64_t>(s0 + k) * out, g[k]);
          }
#pragma unroll
          for (int l = 0; l < L; ++l) acc[l] += g[k].v[l];
        }
      }
    }
    Lanes<L> r;
#pragma unroll
    for (int l = 0; l < L; ++l) r.v[l] = static_cast<float>(acc[l]);
    float* dst = dYg + p * lddyg + j;
    if (vec_out) {
      store_lanes<L>(dst, r);
    } else {
#pragma unroll
      for (int l = 0; l < L; ++l) dst[l] = r.v[l];
    }
  }
}

// dY[i] = Y[i] > 0 ? dY[i] : 0 for i < n (NaN → 0, as relu_mask_kernel): full
// stores, four floats at a time when both arrays are 16-byte aligned (vec), the
// last n % 4 (or all, without vec) one at a time.
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
// bench/results/gpu_2026-11-27_98d21d0/step_ncu_bf16.log). Thread (tx, ty) takes its
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

// group_bias_act as a streaming kernel: one thread per (group p, L columns from j)
// loads the group's row of Yg and the bias once, then its S rows of Y
// kGroupRowsInFlight at a time (all loads first), and stores each row whole:
// Y = act((Y + Yg) + bias) with group_bias_act_kernel's two round-to-nearest adds
// (the bias 0 when there is none), so the same bits. One division per thread and
// S·L elements, where the legacy kernel did two per element.
// With mask (kRelu, L = 4, out % 128 == 0: a warp's 32 threads cover 128 columns of
// one row, and every thread of a warp is in the loop), each row's ReLU bit mask as
// well: a nibble per thread, gathered into words over groups of 8 lanes.
template <int L, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    group_bias_act_stream_kernel(float* __restrict__ Y, const float* __restrict__ Yg,
                                 const float* __restrict__ bias, int64_t n, int S, int out,
                                 uint32_t* __restrict__ mask, int64_t words) {
  const int per_row = out / L;
  const int64_t total = n * per_row;
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t p = x / per_row;
    const int j = static_cast<int>(x - p * per_row) * L;
    const Lanes<L> g = load_lanes<L>(Yg + p * out + j);
    Lanes<L> c;  // one load per thread: the bias slice needs no alignment
#pragma unroll
    for (int l = 0; l < L; ++l) c.v[l] = bias ? bias[j + l] : 0.0f;
    const int64_t first = p * S * out + j;
    for (int s0 = 0; s0 < S; s0 += kGroupRowsInFlight) {
      const int m = S - s0 < kGroupRowsInFlight ? S - s0 : kGroupRowsInFlight;
      Lanes<L> y[kGroupRowsInFlight];
#pragma unroll
      for (int k = 0; k < kGroupRowsInFlight; ++k)
        if (k < m) y[k] = load_lanes<L>(Y + first + static_cast<int64_t>(s0 + k) * out);
#pragma unroll
      for (int k = 0; k < kGroupRowsInFlight; ++k) {
        if (k < m) {
#pragma unroll
          for (int l = 0; l < L; ++l) {
            const float z = __fadd_rn(__fadd_rn(y[k].v[l], g.v[l]), c.v[l]);
            y[k].v[l] = kRelu ? (z > 0.0f ? z : 0.0f) : z;
          }
          store_lanes<L>(Y + first + static_cast<int64_t>(s0 + k) * out, y[k]);
          if constexpr (kRelu && L == 4) {
            if (mask) {  // the same for the whole warp
              uint32_t nibble = 0;
#pragma unroll
              for (int l = 0; l < L; ++l) nibble |= uint32_t{y[k].v[l] > 0.0f} << l;
              uint32_t word = nibble << (4 * (threadIdx.x & 7));
              word |= __shfl_xor_sync(0xffffffffu, word, 1);
              word |= __shfl_xor_sync(0xffffffffu, word, 2);
              word |= __shfl_xor_sync(0xffffffffu, word, 4);
              if ((threadIdx.x & 7) == 0) mask[(p * S + s0 + k) * words + j / 32] = word;
            }
          }
        }
      }
    }
  }
}

template <int L>
void launch_group_bias_act_stream(cudaStream_t stream, float* Y, const float* Yg, const float* bias,
                                  int64_t n, int S, int out, bool relu, uint32_t* mask = nullptr) {
  const unsigned grid = grid_for(n * (out / L));
  const int64_t words = relu_mask_words(out);
  if (relu) {
    group_bias_act_stream_kernel<L, true>
        <<<grid, kThreads, 0, stream>>>(Y, Yg, bias, n, S, out, mask, words);
  } else {
    group_bias_act_stream_kernel<L, false>
        <<<grid, kThreads, 0, stream>>>(Y, Yg, bias, n, S, out, nullptr, words);
  }
}

// The ReLU bit mask of a stored [B × out] output (for the widths the forward kernels
// do not write it in passing), one warp per word: lane l tests element 32·w + l (one
// coalesced load per warp, where a thread per word waited on 32 loads in turn) and the
// warp's ballot is the word, bit l from lane l.
template <typename T>
__global__ void relu_bits_kernel(const T* __restrict__ Y, int64_t B, int out,
                                 uint32_t* __restrict__ mask, int64_t words) {
  const int lane = threadIdx.x & 31;
  const int64_t total = B * words;
  for (int64_t i = thread_first() / 32; i < total; i += thread_stride() / 32) {  // per warp
    const int64_t b = i / words;
    const int j = 32 * static_cast<int>(i - b * words) + lane;
    const bool on = j < out && element_value(Y[b * out + j]) > 0.0f;
    const uint32_t word = __ballot_sync(0xffffffffu, on);
    if (lane == 0) mask[i] = word;
  }
}
template <typename T>
void launch_relu_bits(cudaStream_t stream, const T* Y, int64_t B, int out, uint32_t* mask) {
  const int64_t words = relu_mask_words(out);
  relu_bits_kernel<T><<<grid_for(B * words * 32), kThreads, 0, stream>>>(Y, B, out, mask, words);
}

template <int L>
void launch_group_sum_stream(cudaStream_t stream, const float* Y, float* dY, int64_t n, int S,
                             int out, float* dYg, int64_t lddyg, bool relu, bool vec_out,
                             const uint32_t* mask = nullptr) {
  const unsigned grid = grid_for(n * (out / L));
  if (relu && mask) {
    group_sum_stream_kernel<L, true, true><<<grid, kThreads, 0, stream>>>(
        nullptr, dY, n, S, out, dYg, lddyg, vec_out, mask, relu_mask_words(out));
  } else if (relu) {
    group_sum_stream_kernel<L, true>
        <<<grid, kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg, vec_out);
  } else {
    group_sum_stream_kernel<L, false>
        <<<grid, kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg, vec_out);
  }
}

// ---- the fused top of NeuMF (neumf_top_forward / neumf_top_backward) ---------------
// One warp per group of S samples. Lane l owns the columns l + 32j of each part
// (GMF, tower output; j < J): the head's lane order (head_forward_kernel), so a
// logit is the same bits. Every row's loads are issued before its first store
// (kTopRows rows at a time), and nothing a warp reads is written in the kernel.

constexpr int kTopWarps = kThreads / 32;
constexpr int kTopMaxJ = kNeumfTopMaxWidth / 32;  // columns per lane and part, at most
constexpr int kTopSlots = 3 * kTopMaxJ + 2;       // dw GMF, dw tower, db, then dc and loss

// A and dA as floats (TA float) or BF16 bits (TA uint16_t, BF16 storage): an
// element's value, and the store of a value returning what was stored.
__device__ __forceinline__ float value_of(float x) { return x; }
__device__ __forceinline__ float value_of(uint16_t x) { return bf16_bits_to_float(x); }
__device__ __forceinline__ float store_value(float* p, float v) {
  *p = v;
  return v;
}
__device__ __forceinline__ float store_value(uint16_t* p, float v) {
  const uint16_t b = float_to_bf16_bits(v);
  *p = b;
  return bf16_bits_to_float(b);
}

// A group of S samples is one warp's work when S <= kTopPiece, else pieces of
// kTopPiece samples (the last one shorter), each a warp's: evaluation's groups (a user's
// 1 + 999 candidates) would otherwise leave one warp per user, too few to fill the GPU
// (an H200 ran it at 6% of HBM peak with 1,000 groups of 1,000,
// bench/results/gpu_2026-11-27_8976e61/eval_ncu_bf16.log). Training's groups of 5 stay
// whole. Every logit is computed alone, so any split gives the same bits.
constexpr int kTopPiece = 32;
__host__ __device__ __forceinline__ int top_pieces(int S) {
  return S <= kTopPiece ? 1 : (S + kTopPiece - 1) / kTopPiece;
}

// logits of pieces q = warp, warp + warps, … (no sums across rows: any map will do).
// J: columns per lane of F = mf + last, in head_forward's order k = lane + 32j.
// ids (may be null): sample b's item row is irows row ids[b] (neumf_top_forward's
// irow_ids), each round's ids loaded before its rows.
// Four blocks per SM where that fits in 64 registers without a spill (sm_90, ptxas -v):
// on an H200 the kernel ran with 3 blocks (76 registers) at 38% of HBM peak with about one
// eligible warp per scheduler (bench/results/gpu_2026-11-27_98d21d0/step_ncu_top.log).
// Split groups (kPieces) keep 3 blocks: 4 would spill their piece bounds.
template <int J, typename TA, bool kPieces>
constexpr int top_forward_min_blocks() {
  return J <= 2 || (J == 4 && sizeof(TA) == 2) ? (kPieces && J >= 2 ? 3 : 4) : 1;
}
// kPieces: groups split into pieces (top_pieces(S) > 1); without, the loop over groups
// needs fewer registers (training's S = 5 runs it).
template <int J, typename TA, bool kPieces>
__global__ void __launch_bounds__(kThreads, top_forward_min_blocks<J, TA, kPieces>())
    neumf_top_forward_kernel(const float* __restrict__ urows, int64_t ldu,
                             const float* __restrict__ irows, int64_t ldi, const TA* __restrict__ A,
                             const float* __restrict__ w, const float* __restrict__ c,
                             float* __restrict__ logits, int64_t n, int S, int mf, int last,
                             const int32_t* __restrict__ ids) {
  constexpr int R = J >= 8 ? 2 : (J >= 4 ? 4 : 8);  // rows in flight
  const int lane = threadIdx.x & 31;
  const int F = mf + last;
  float wk[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int k = lane + 32 * j;
    wk[j] = k < F ? w[k] : 0.0f;
  }
  const float c0 = c[0];
  const int64_t warps = thread_stride() / 32;
  const int pieces = kPieces ? top_pieces(S) : 1;
  const int64_t items = kPieces ? n * pieces : n;
  for (int64_t q = thread_first() / 32; q < items; q += warps) {
    // Group p's samples [s_begin, s_end).
    const int64_t p = kPieces ? q / pieces : q;
    const int s_begin = kPieces ? static_cast<int>(q - p * pieces) * kTopPiece : 0;
    const int s_end = kPieces && S - s_begin > kTopPiece ? s_begin + kTopPiece : S;
    float u[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int k = lane + 32 * j;
      u[j] = k < mf ? urows[p * ldu + k] : 0.0f;
    }
    for (int s0 = s_begin; s0 < s_end; s0 += R) {
      const int m = s_end - s0 < R ? s_end - s0 : R;
      // The loads as stored (raw): a BF16 element widened only below, after every
      // load of the round is issued (widened in the load's branch, it would wait there).
      float hi[R][J];
      TA ha[R][J];
      int64_t row[R];  // each sample's row of irows
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t b = p * S + s0 + r;
        row[r] = ids && r < m ? int64_t{ids[b]} : b;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t b = p * S + s0 + r;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int k = lane + 32 * j;
          hi[r][j] = 0.0f;
          ha[r][j] = TA{0};
          if (r < m) {
            if (k < mf)
              hi[r][j] = irows[row[r] * ldi + k];
            else if (k < F)
              ha[r][j] = A[b * last + (k - mf)];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < m) {  // uniform across the warp
          float acc = 0.0f;
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const int k = lane + 32 * j;
            if (k < F) {
              const float hv = k < mf ? __fmul_rn(u[j], hi[r][j]) : value_of(ha[r][j]);
              acc += hv * wk[j];
            }
          }
          for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
          if (lane == 0) logits[p * S + s0 + r] = acc + c0;
        }
      }
    }
  }
}

// Block x takes groups [x·kNeumfTopGroups, …), warp v of them v, v + 8, …; each
// lane sums its columns' terms over its warp's rows (in double, row order), then
// the block adds its warps' sums in warp order (dc and the loss also over lanes,
// in lane order) into partial[x, ·] (neumf_top_partial_cols columns).
// J: columns per lane of each part (mf and last ≤ 32·J); R: rows in flight per warp;
// kMinBlocks: blocks per SM that __launch_bounds__ asks ptxas to fit (its register cap).
// On an H200 the BF16 J = 2 kernel (110 registers, 8 rows) ran 2 blocks per SM at 25%
// occupancy and 44% of HBM peak, 41% of its warps' cycles between instructions spent
// waiting on L1TEX (bench/results/gpu_2026-11-27_8976e61/step_ncu_top.log); with 4 rows
// it fits 78 registers without a spill (sm_90, ptxas -v) and 3 blocks
// (three_block_kernels).
// R changes only how many rows' loads are issued before their adds, not the order of
// any sum: every R gives the same bits.
template <int J, typename TA, int R = (J >= 4 ? 4 : 8), int kMinBlocks = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    neumf_top_backward_kernel(const float* __restrict__ urows, int64_t ldu,
                              const float* __restrict__ irows, int64_t ldi,
                              const TA* __restrict__ A, const float* __restrict__ w,
                              const float* __restrict__ dlogits, const float* __restrict__ logits,
                              const float* __restrict__ labels, float inv_batch,
                              TA* __restrict__ dA, float* __restrict__ durows, int64_t lddu,
                              float* __restrict__ dirows, int64_t lddi, int64_t n, int S, int mf,
                              int last, bool relu, double* __restrict__ partial) {
  __shared__ double sh[kTopWarps][kTopSlots][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float wg[J], wa[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int k = lane + 32 * j;
    wg[j] = k < mf ? w[k] : 0.0f;
    wa[j] = k < last ? w[mf + k] : 0.0f;
  }
  double dwg[J], dwa[J], dbs[J], dcl = 0.0, lossl = 0.0;
#pragma unroll
  for (int j = 0; j < J; ++j) dwg[j] = dwa[j] = dbs[j] = 0.0;

  const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kNeumfTopGroups;
  const int64_t g1 = g0 + kNeumfTopGroups < n ? g0 + kNeumfTopGroups : n;
  for (int64_t p = g0 + warp; p < g1; p += kTopWarps) {
    float u[J];
    double uacc[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int k = lane + 32 * j;
      u[j] = k < mf ? urows[p * ldu + k] : 0.0f;
      uacc[j] = 0.0;
    }
    for (int sb = 0; sb < S; sb += 32) {
      // Lane l: the gradient of row sb + l's logit (and its loss term).
      float gl = 0.0f;
      if (sb + lane < S) {
        const int64_t b = p * S + sb + lane;
        if (dlogits) {
          gl = dlogits[b];
        } else {
          gl = bce_row_grad(logits[b], labels[b], 1.0f, inv_batch);
          lossl += bce_row_loss(logits[b], labels[b]);
        }
        dcl += gl;
      }
      const int sn = S - sb < 32 ? S - sb : 32;
      for (int s0 = 0; s0 < sn; s0 += R) {
        const int m = sn - s0 < R ? sn - s0 : R;
        float it[R][J];
        TA a[R][J];  // as stored: widened where used, after every load of the round
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t b = p * S + sb + s0 + r;
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const int k = lane + 32 * j;
            it[r][j] = r < m && k < mf ? irows[b * ldi + k] : 0.0f;
            a[r][j] = r < m && k < last ? A[b * last + k] : TA{0};
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r < m) {  // uniform across the warp
            const int64_t b = p * S + sb + s0 + r;
            const float g = __shfl_sync(0xffffffffu, gl, s0 + r);
            const double gd = g;
#pragma unroll
            for (int j = 0; j < J; ++j) {
              const int k = lane + 32 * j;
              if (k < mf) {
                const float dg = __fmul_rn(g, wg[j]);
                dirows[b * lddi + k] = __fmul_rn(dg, u[j]);
                uacc[j] += static_cast<double>(__fmul_rn(dg, it[r][j]));
                dwg[j] += gd * static_cast<double>(__fmul_rn(u[j], it[r][j]));
              }
              if (k < last) {
                const float dh = __fmul_rn(g, wa[j]);
                const float av = value_of(a[r][j]);
                const float dz =
                    store_value(dA + b * last + k, relu ? (av > 0.0f ? dh : 0.0f) : dh);
                dwa[j] += gd * static_cast<double>(av);
                dbs[j] += static_cast<double>(dz);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int k = lane + 32 * j;
      if (k < mf) durows[p * lddu + k] = __double2float_rn(uacc[j]);
    }
  }

#pragma unroll
  for (int j = 0; j < J; ++j) {  // the combine below reads slots j < J only
    sh[warp][j][lane] = dwg[j];
    sh[warp][kTopMaxJ + j][lane] = dwa[j];
    sh[warp][2 * kTopMaxJ + j][lane] = dbs[j];
  }
  sh[warp][3 * kTopMaxJ][lane] = dcl;
  sh[warp][3 * kTopMaxJ + 1][lane] = lossl;
  __syncthreads();
  const int jg = (mf + 31) / 32, ja = (last + 31) / 32;
  const int C = 32 * (jg + 2 * ja) + 2;
  for (int col = threadIdx.x; col < C; col += kThreads) {
    double total = 0.0;
    if (col >= C - 2) {  // dc or the loss: every lane of every warp
      const int slot = 3 * kTopMaxJ + (col - (C - 2));
      for (int v = 0; v < kTopWarps; ++v)
        for (int l = 0; l < 32; ++l) total += sh[v][slot][l];
    } else {
      int slot;
      if (col < 32 * jg)
        slot = col / 32;
      else if (col < 32 * (jg + ja))
        slot = kTopMaxJ + (col - 32 * jg) / 32;
      else
        slot = 2 * kTopMaxJ + (col - 32 * (jg + ja)) / 32;
      for (int v = 0; v < kTopWarps; ++v) total += sh[v][slot][col % 32];
    }
    partial[static_cast<int64_t>(blockIdx.x) * C + col] = total;
  }
}

// ---- BF16 storage kernels -------------------------------------------------------------

// Y[i] = BF16(act((Z[i] + bias[j]) + Yg[b / S, j])) over B × out, i = b·out + j:
// a product's epilogue and rounding, in the CPU twin's order (bias and Yg may be
// null: nothing added).
// With ids, Z's row for output row b is ids[b] (gather_bias_act_bf16).
__global__ void bias_act_bf16_kernel(const float* __restrict__ Z, const int32_t* __restrict__ ids,
                                     const float* __restrict__ Yg, int S,
                                     const float* __restrict__ bias, uint16_t* __restrict__ Y,
                                     int64_t B, int out, bool relu) {
  for (int64_t i = thread_first(); i < B * out; i += thread_stride()) {
    const int64_t b = i / out;
    const int j = static_cast<int>(i - b * out);
    float z = Z[(ids ? static_cast<int64_t>(ids[b]) : b) * out + j];
    if (bias) z = __fadd_rn(z, bias[j]);
    if (Yg) z = __fadd_rn(z, Yg[(b / S) * out + j]);
    Y[i] = float_to_bf16_bits(relu ? (z > 0.0f ? z : 0.0f) : z);
  }
}

// bias_act_bf16_kernel eight columns at a time (out % 8 == 0, Z and Yg 16-byte
// aligned, Y 16-byte aligned): two float4 loads of Z (and of Yg's row, and of the bias
// where it is 16-byte aligned), one 16-byte store of eight BF16s; the row (and with Yg its group)
// from one division each per thread, in 32 bits when the octets fit (k32). The same expression per
// element: the same bits. With mask (relu, out % 256 == 0: a warp's 32 threads cover 256 columns of
// one row), the ReLU bit mask of the stored BF16s too: a byte per thread, gathered into words over
// groups of 4 lanes.
template <bool k32>
__global__ void __launch_bounds__(kThreads)
    bias_act_bf16_octets_kernel(const float* __restrict__ Z, const int32_t* __restrict__ ids,
                                const float* __restrict__ Yg, int S, const float* __restrict__ bias,
                                uint16_t* __restrict__ Y, int64_t B, int out, bool relu,
                                uint32_t* __restrict__ mask = nullptr, int64_t words = 0) {
  const int per_row = out / 8;
  const int64_t total = B * per_row;
  const bool bias16 = aligned16(bias);
  for (int64_t q = thread_first(); q < total; q += thread_stride()) {
    const int64_t b = row_of<k32>(q, per_row);
    const int j = static_cast<int>(q - b * per_row) * 8;
    const int64_t zr = ids ? static_cast<int64_t>(ids[b]) : b;
    const float4* z4 = reinterpret_cast<const float4*>(Z + zr * out + j);
    const float4 z0 = z4[0], z1 = z4[1];
    float v[8] = {z0.x, z0.y, z0.z, z0.w, z1.x, z1.y, z1.z, z1.w};
    if (bias) {
      float bv[8];
      if (bias16) {  // two vector loads: eight scalar ones kept L1 busy
        const float4 b0 = __ldg(reinterpret_cast<const float4*>(bias + j));
        const float4 b1 = __ldg(reinterpret_cast<const float4*>(bias + j) + 1);
        bv[0] = b0.x, bv[1] = b0.y, bv[2] = b0.z, bv[3] = b0.w;
        bv[4] = b1.x, bv[5] = b1.y, bv[6] = b1.z, bv[7] = b1.w;
      } else {
#pragma unroll
        for (int l = 0; l < 8; ++l) bv[l] = bias[j + l];
      }
#pragma unroll
      for (int l = 0; l < 8; ++l) v[l] = __fadd_rn(v[l], bv[l]);
    }
    if (Yg) {
      const int64_t group =
          k32 ? int64_t{static_cast<uint32_t>(b) / static_cast<uint32_t>(S)} : b / S;
      const float4* g4 = reinterpret_cast<const float4*>(Yg + group * out + j);
      const float4 g0 = g4[0], g1 = g4[1];
      const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int l = 0; l < 8; ++l) v[l] = __fadd_rn(v[l], g[l]);
    }
    if (relu) {
#pragma unroll
      for (int l = 0; l < 8; ++l) v[l] = v[l] > 0.0f ? v[l] : 0.0f;
    }
    const uint4 stored = make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]),
                                    bf16_pair(v[4], v[5]), bf16_pair(v[6], v[7]));
    // Evict-first: Y (B·out BF16s) is far larger than L2 and not read here again.
    __stcs(reinterpret_cast<uint4*>(Y + b * out + j), stored);
    if (mask) {  // the same for the whole warp
      uint32_t byte = 0;
#pragma unroll
      for (int l = 0; l < 8; ++l) {
        const uint32_t w = (&stored.x)[l >> 1];
        const uint16_t h = static_cast<uint16_t>(l & 1 ? w >> 16 : w);
        byte |= uint32_t{bf16_bits_to_float(h) > 0.0f} << l;
      }
      uint32_t word = byte << (8 * (threadIdx.x & 3));
      word |= __shfl_xor_sync(0xffffffffu, word, 1);
      word |= __shfl_xor_sync(0xffffffffu, word, 2);
      if ((threadIdx.x & 3) == 0) mask[b * words + j / 32] = word;
    }
  }
}

}  // namespace

// Launches the epilogue over B × out: eight columns per thread where the widths
// and pointers allow, else one element per thread.
// With mask (relu only), the output's ReLU bit mask: in passing where out % 256 == 0,
// else from the stored output (relu_bits_kernel).
void launch_bias_act_bf16(cudaStream_t stream, const float* Z, const float* Yg, int S,
                          const float* bias, uint16_t* Y, int64_t B, int out, bool relu,
                          const int32_t* ids, uint32_t* mask) {
  if (!relu) mask = nullptr;
  const bool octets = out % 8 == 0 && aligned16(Z) && aligned16(Y) && (!Yg || aligned16(Yg));
  if (!octets) {
    bias_act_bf16_kernel<<<grid_for(B * out), kThreads, 0, stream>>>(Z, ids, Yg, S, bias, Y, B, out,
                                                                     relu);
    if (mask) launch_relu_bits(stream, static_cast<const uint16_t*>(Y), B, out, mask);
    return;
  }
  const int64_t total = B * (out / 8);
  const int64_t words = relu_mask_words(out);
  uint32_t* in_passing = out % 256 == 0 ? mask : nullptr;
  if (total <= int64_t{UINT32_MAX}) {
    bias_act_bf16_octets_kernel<true><<<grid_for(total), kThreads, 0, stream>>>(
        Z, ids, Yg, S, bias, Y, B, out, relu, in_passing, words);
  } else {
    bias_act_bf16_octets_kernel<false><<<grid_for(total), kThreads, 0, stream>>>(
        Z, ids, Yg, S, bias, Y, B, out, relu, in_passing, words);
  }
  if (mask && !in_passing) launch_relu_bits(stream, static_cast<const uint16_t*>(Y), B, out, mask);
}

namespace {

// gather_bias_act: group_bias_act_stream_kernel's expression on row ids[b] of P,
// L columns per thread (vector loads of P's and Yg's rows, and of the bias where it is 16-byte
// aligned; one vector store, evict-first).
// With mask (kRelu, L = 4, out % 128 == 0: a warp's 32 threads cover 128 columns of
// one row, and every thread of a warp is in the loop), the ReLU bit mask in passing, as
// group_bias_act_stream_kernel writes it.
template <int L, bool kRelu, bool k32>
__global__ void __launch_bounds__(kThreads)
    gather_bias_act_kernel(const float* __restrict__ P, const int32_t* __restrict__ ids,
                           const float* __restrict__ Yg, const float* __restrict__ bias,
                           float* __restrict__ Y, int64_t B, int S, int out,
                           uint32_t* __restrict__ mask, int64_t words) {
  const int per_row = out / L;
  const int64_t total = B * per_row;
  const bool bias16 = aligned16(bias);
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t b = row_of<k32>(x, per_row);
    const int j = static_cast<int>(x - b * per_row) * L;
    const Lanes<L> z = load_lanes<L>(P + static_cast<int64_t>(ids[b]) * out + j);
    const int64_t group =
        k32 ? int64_t{static_cast<uint32_t>(b) / static_cast<uint32_t>(S)} : b / S;
    const Lanes<L> g = load_lanes<L>(Yg + group * out + j);
    Lanes<L> bl;  // the bias's columns (zeros without): one vector load where 16-byte aligned
    if (bias && (L == 1 || bias16)) {
      bl = load_lanes<L>(bias + j);
    } else {
#pragma unroll
      for (int l = 0; l < L; ++l) bl.v[l] = bias ? bias[j + l] : 0.0f;
    }
    Lanes<L> y;
#pragma unroll
    for (int l = 0; l < L; ++l) {
      const float v = __fadd_rn(__fadd_rn(z.v[l], g.v[l]), bl.v[l]);
      y.v[l] = kRelu ? (v > 0.0f ? v : 0.0f) : v;
    }
    store_lanes_cs<L>(Y + b * out + j, y);
    if constexpr (kRelu && L == 4) {
      if (mask) {  // the same for the whole warp
        uint32_t nibble = 0;
#pragma unroll
        for (int l = 0; l < L; ++l) nibble |= uint32_t{y.v[l] > 0.0f} << l;
        uint32_t word = nibble << (4 * (threadIdx.x & 7));
        word |= __shfl_xor_sync(0xffffffffu, word, 1);
        word |= __shfl_xor_sync(0xffffffffu, word, 2);
        word |= __shfl_xor_sync(0xffffffffu, word, 4);
        if ((threadIdx.x & 7) == 0) mask[b * words + j / 32] = word;
      }
    }
  }
}

// With mask (relu only): in passing where L = 4 and out % 128 == 0, else from the
// stored output (relu_bits_kernel).
template <int L>
void launch_gather_bias_act(cudaStream_t stream, const float* P, const int32_t* ids,
                            const float* Yg, const float* bias, float* Y, int64_t B, int S, int out,
                            bool relu, uint32_t* mask) {
  const int64_t total = B * (out / L);
  const unsigned grid = grid_for(total);
  const bool k32 = total <= int64_t{UINT32_MAX};
  const int64_t words = relu_mask_words(out);
  uint32_t* in_passing = relu && L == 4 && out % 128 == 0 ? mask : nullptr;
  if (relu && k32) {
    gather_bias_act_kernel<L, true, true>
        <<<grid, kThreads, 0, stream>>>(P, ids, Yg, bias, Y, B, S, out, in_passing, words);
  } else if (relu) {
    gather_bias_act_kernel<L, true, false>
        <<<grid, kThreads, 0, stream>>>(P, ids, Yg, bias, Y, B, S, out, in_passing, words);
  } else if (k32) {
    gather_bias_act_kernel<L, false, true>
        <<<grid, kThreads, 0, stream>>>(P, ids, Yg, bias, Y, B, S, out, nullptr, words);
  } else {
    gather_bias_act_kernel<L, false, false>
        <<<grid, kThreads, 0, stream>>>(P, ids, Yg, bias, Y, B, S, out, nullptr, words);
  }
  if (relu && mask && !in_passing)
    launch_relu_bits(stream, static_cast<const float*>(Y), B, out, mask);
}

// ---- layer 0 by item: the batch's runs of equal items -----------------------------

// Runs past the last distinct id: empty (starts = B) with no first sample; starts[R] = B.
__global__ void empty_runs_kernel(int32_t* __restrict__ starts, int32_t* __restrict__ first,
                                  int64_t R, int32_t B) {
  for (int64_t u = thread_first(); u <= R; u += thread_stride()) {
    starts[u] = B;
    if (u < R) first[u] = -1;
  }
}

// From the inclusive scan of the heads (run[k] = 1 + the run of sorted position k):
// each sample's run, and each run's start and first sample (runs below R only).
__global__ void run_index_kernel(const int32_t* __restrict__ sorted,
                                 const int32_t* __restrict__ order, const int32_t* __restrict__ run,
                                 int64_t B, int64_t R, int32_t* __restrict__ starts,
                                 int32_t* __restrict__ inv, int32_t* __restrict__ first) {
  for (int64_t k = thread_first(); k < B; k += thread_stride()) {
    const int32_t u = run[k] - 1;
    const int32_t b = order[k];
    inv[b] = u;
    if ((k == 0 || sorted[k] != sorted[k - 1]) && u < R) {
      starts[u] = static_cast<int32_t>(k);
      first[u] = b;
    }
  }
}

// Y[u, c] = X[first[u], c] (zeros for first[u] < 0), one element per thread.
__global__ void gather_run_rows_kernel(const float* __restrict__ X, int64_t ldx, int w,
                                       const int32_t* __restrict__ first, int64_t R,
                                       float* __restrict__ Y, const int32_t* __restrict__ ids) {
  for (int64_t i = thread_first(); i < R * w; i += thread_stride()) {
    const int64_t u = i / w;
    const int c = static_cast<int>(i - u * w);
    const int32_t f = first[u];
    Y[i] = f < 0 ? 0.0f : X[int64_t{ids != nullptr ? ids[f] : f} * ldx + c];
  }
}

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

// scatter_run_rows: one thread per (sample b, L columns): the run's parts added in p order
// on its first sample, zeros on the others (full stores, float4 where L = 4).
template <int L>
__global__ void __launch_bounds__(kThreads)
    scatter_run_rows_kernel(const float* __restrict__ Yr, int64_t R, int parts, int w,
                            const int32_t* __restrict__ inv, const int32_t* __restrict__ first,
                            int64_t B, float* __restrict__ Y, int64_t ldy) {
  const int per_row = w / L;
  for (int64_t x = thread_first(); x < B * per_row; x += thread_stride()) {
    const int64_t b = x / per_row;
    const int c = static_cast<int>(x - b * per_row) * L;
    const int64_t u = inv[b];
    Lanes<L> v;
#pragma unroll
    for (int l = 0; l < L; ++l) v.v[l] = 0.0f;
    if (first[u] == b) {
      v = load_lanes<L>(Yr + u * w + c);
      for (int p = 1; p < parts; ++p) {
        const Lanes<L> t = load_lanes<L>(Yr + (p * R + u) * w + c);
#pragma unroll
        for (int l = 0; l < L; ++l) v.v[l] = __fadd_rn(v.v[l], t.v[l]);
      }
    }
    store_lanes<L>(Y + b * ldy + c, v);
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

// Rows of a run loaded before the first add: a hot item's run (on ml-20m's popularity about
// 1,200 of a million samples) is one thread's serial chain of rounds, each a load of its
// rows' indices and then of the rows, so the rounds are long. Eight bytes a row per thread
// (BF16 four columns, FP32 four) keep the registers at three or two blocks per SM.
constexpr int kRunRowsInFlight = 16;

// L consecutive elements of a row, kept as stored (FP32, or BF16 bits) until used.
template <typename T, int L>
struct RawLanes;
template <>
struct RawLanes<float, 4> {
  float4 v;
  __device__ __forceinline__ void load(const float* __restrict__ p) {
    v = *reinterpret_cast<const float4*>(p);
  }
  __device__ __forceinline__ float at(int l) const { return (&v.x)[l]; }
};
template <>
struct RawLanes<uint16_t, 4> {
  uint2 v;
  __device__ __forceinline__ void load(const uint16_t* __restrict__ p) {
    v = *reinterpret_cast<const uint2*>(p);
  }
  __device__ __forceinline__ float at(int l) const { return lane_value((&v.x)[l >> 1], l & 1); }
};
template <typename T>
struct RawLanes<T, 1> {
  T v;
  __device__ __forceinline__ void load(const T* __restrict__ p) { v = *p; }
  __device__ __forceinline__ float at(int) const { return element_value(v); }
};

// put_run_rows: one thread per (run u, column c): the run's parts added in p order, stored
// at its item's row.
__global__ void put_run_rows_kernel(const float* __restrict__ Yr, int64_t R, int parts, int w,
                                    const int32_t* __restrict__ ids,
                                    const int32_t* __restrict__ first, float* __restrict__ Y,
                                    int64_t ldy) {
  for (int64_t x = thread_first(); x < R * w; x += thread_stride()) {
    const int64_t u = x / w;
    const int c = static_cast<int>(x - u * w);
    const int32_t f = first[u];
    if (f < 0) continue;
    float v = Yr[u * w + c];
    for (int p = 1; p < parts; ++p) v = __fadd_rn(v, Yr[(p * R + u) * w + c]);
    Y[int64_t{ids[f]} * ldy + c] = v;
  }
}

// scatter_run_rows_kernel with kSamples consecutive samples per thread (a warp's threads on
// the same samples when w / L is a multiple of 32): their runs, then their first samples,
// then their parts' rows are loaded together, so a thread waits for each of the three
// once for kSamples stores instead of once per store; the stores stream past L2 (the
// array is read again by the embedding update, not by this kernel). The same adds in the
// same order: the same bits.
template <int L, int kSamples>
__global__ void __launch_bounds__(kThreads)
    scatter_run_rows_many_kernel(const float* __restrict__ Yr, int64_t R, int parts, int w,
                                 const int32_t* __restrict__ inv, const int32_t* __restrict__ first,
                                 int64_t B, float* __restrict__ Y, int64_t ldy) {
  const int per_row = w / L;
  const int64_t groups = (B + kSamples - 1) / kSamples;
  for (int64_t x = thread_first(); x < groups * per_row; x += thread_stride()) {
    const int64_t g = x / per_row;
    const int c = static_cast<int>(x - g * per_row) * L;
    int64_t u[kSamples];
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
      const int64_t b = g * kSamples + s;
      u[s] = b < B ? inv[b] : 0;
    }
    bool head[kSamples];
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
      const int64_t b = g * kSamples + s;
      head[s] = b < B && first[u[s]] == b;
    }
    Lanes<L> v[kSamples];
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
#pragma unroll
      for (int l = 0; l < L; ++l) v[s].v[l] = 0.0f;
      if (head[s]) v[s] = load_lanes<L>(Yr + u[s] * w + c);
    }
    for (int p = 1; p < parts; ++p) {
#pragma unroll
      for (int s = 0; s < kSamples; ++s) {
        if (head[s]) {
          const Lanes<L> t = load_lanes<L>(Yr + (p * R + u[s]) * w + c);
#pragma unroll
          for (int l = 0; l < L; ++l) v[s].v[l] = __fadd_rn(v[s].v[l], t.v[l]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
      const int64_t b = g * kSamples + s;
      if (b < B) store_lanes_cs<L>(Y + b * ldy + c, v[s]);
    }
  }
}

// acc[l] += the first m of z's rows, in row order, in double (run_sums, run_sums_warp).
template <typename T, int L, int kRows>
__device__ __forceinline__ void add_loaded_rows(double (&acc)[L], const RawLanes<T, L> (&z)[kRows],
                                                int m) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (i < m) {
#pragma unroll
      for (int l = 0; l < L; ++l) acc[l] += static_cast<double>(z[i].at(l));
    }
  }
}

// run_sums: one thread per (run u, L columns from j) adds the run's rows in k order in
// double, kRunRowsInFlight rows loaded (as stored) before their adds; one FP32 store of
// each column. The same sums in the same order as the CPU twin: the same bits.
// kRows: the rows in flight; kMinBlocks: blocks per SM for __launch_bounds__ (0: none).
// With FP32 four columns, 16 rows take 96 registers and 2 blocks per SM: on an H200 the
// kernel ran at 30% of HBM peak, its SMs busy 72% of its time
// (bench/results/gpu_2026-11-27_8976e61/step_ncu_tf32.txt); 12 rows fit 80 registers
// without a spill (sm_90, ptxas -v) and 3 blocks, 24 warps and 12% more bytes in flight
// per SM (three_block_kernels). kRows does not change any sum's order: the same bits.
template <typename T, int L, int kRows = kRunRowsInFlight, int kMinBlocks = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    run_sums_kernel(const T* __restrict__ dZ, const int32_t* __restrict__ order,
                    const int32_t* __restrict__ starts, int64_t R, int out,
                    float* __restrict__ dP) {
  const int per_row = out / L;
  const int64_t total = R * per_row;
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t u = x / per_row;
    const int j = static_cast<int>(x - u * per_row) * L;
    double acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = 0.0;
    const int k1 = starts[u + 1];
    for (int k0 = starts[u]; k0 < k1; k0 += kRows) {
      const int m = k1 - k0 < kRows ? k1 - k0 : kRows;
      RawLanes<T, L> z[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        if (i < m) z[i].load(dZ + int64_t{order[k0 + i]} * out + j);
      add_loaded_rows<T, L, kRows>(acc, z, m);
    }
#pragma unroll
    for (int l = 0; l < L; ++l) dP[u * out + j + l] = static_cast<float>(acc[l]);
  }
}

// run_sums_warp: run_sums where a run's row is whole warps (out / L a multiple of 32), so
// the 32 threads of a warp share the run u. The run's indices come 32 at a time, lane i
// loading order[c + i] (one coalesced load), and reach the warp's threads by shuffles; the
// next 32 are loaded while this chunk's rows are added, so a round of kRows rows waits for
// its rows only, not for their indices first. The same rows added in the same order into
// the same doubles as run_sums_kernel: the same bits.
template <typename T, int L, int kRows, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    run_sums_warp_kernel(const T* __restrict__ dZ, const int32_t* __restrict__ order,
                         const int32_t* __restrict__ starts, int64_t R, int out,
                         float* __restrict__ dP) {
  const int per_row = out / L;
  const int64_t total = R * per_row;
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t u = x / per_row;
    const int j = static_cast<int>(x - u * per_row) * L;
    double acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = 0.0;
    const int k0 = starts[u], k1 = starts[u + 1];
    int32_t next = k0 + lane < k1 ? order[k0 + lane] : 0;
    for (int c = k0; c < k1; c += 32) {
      const int32_t mine = next;
      if (c + 32 + lane < k1) next = order[c + 32 + lane];
      const int mc = k1 - c < 32 ? k1 - c : 32;
      for (int i0 = 0; i0 < mc; i0 += kRows) {
        const int m = mc - i0 < kRows ? mc - i0 : kRows;
        RawLanes<T, L> z[kRows];
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          if (i < m) {
            const int32_t row = __shfl_sync(0xffffffffu, mine, i0 + i);
            z[i].load(dZ + int64_t{row} * out + j);
          }
        }
        add_loaded_rows<T, L, kRows>(acc, z, m);
      }
    }
#pragma unroll
    for (int l = 0; l < L; ++l) dP[u * out + j + l] = static_cast<float>(acc[l]);
  }
}

template <typename T, int L>
void launch_run_sums(cudaStream_t stream, const T* dZ, const int32_t* order, const int32_t* starts,
                     int64_t R, int out, float* dP) {
  // The warp kernel, where it applies, whatever three_block_kernels says: FP32 at 12 rows
  // and 3 blocks per SM (78 registers on sm_90), BF16 at 16 rows (71, 3 blocks).
  constexpr bool fp32 = std::is_same<T, float>::value;
  auto kernel = run_sums_kernel<T, L>;
  if constexpr (fp32 && L == 4)
    if (three_block_kernels()) kernel = run_sums_kernel<T, L, 12, 3>;
  if constexpr (L == 4)
    if ((out / L) % 32 == 0 && run_sums_by_warp())
      kernel = fp32 ? run_sums_warp_kernel<T, L, 12, 3> : run_sums_warp_kernel<T, L, 16, 0>;
  kernel<<<grid_for(R * (out / L)), kThreads, 0, stream>>>(dZ, order, starts, R, out, dP);
}

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

// group_sum_backward on BF16: one thread per (group p, L columns from j, L = 1 or
// 8: one 16-byte load of each row); the group's rows kGroupRowsInFlight at a time,
// every load first, then the masked rows stored whole and each column summed in s
// order in double (the CPU twin's order): the same bits at either L.
template <int L>
struct Bf16Lanes;
template <>
struct Bf16Lanes<1> {
  uint16_t v;
  __device__ float at(int) const { return bf16_bits_to_float(v); }
};
template <>
struct Bf16Lanes<8> {
  uint4 v;
  __device__ float at(int l) const {
    const uint32_t w = (&v.x)[l >> 1];
    return bf16_bits_to_float(static_cast<uint16_t>(l & 1 ? w >> 16 : w));
  }
};
template <int L>
__device__ __forceinline__ Bf16Lanes<L> load_bf16_lanes(const uint16_t* __restrict__ p) {
  Bf16Lanes<L> r;
  if constexpr (L == 8)
    r.v = *reinterpret_cast<const uint4*>(p);
  else
    r.v = *p;
  return r;
}
template <int L>
__device__ __forceinline__ void store_bf16_lanes(uint16_t* __restrict__ p, const Bf16Lanes<L>& r) {
  if constexpr (L == 8)
    *reinterpret_cast<uint4*>(p) = r.v;
  else
    *p = r.v;
}
template <int L>
__device__ __forceinline__ Bf16Lanes<L> mask_bf16_lanes(const Bf16Lanes<L>& y,
                                                        const Bf16Lanes<L>& g) {
  Bf16Lanes<L> r;
  if constexpr (L == 8)
    r.v = mask_bf16_octet(y.v, g.v);
  else
    r.v = bf16_bits_to_float(y.v) > 0.0f ? g.v : uint16_t{0};
  return r;
}

// g masked by the low L bits of `bits` (bit l for lane l).
template <int L>
__device__ __forceinline__ Bf16Lanes<L> mask_bf16_bits(uint32_t bits, const Bf16Lanes<L>& g) {
  Bf16Lanes<L> r;
  if constexpr (L == 8) {
    uint32_t w[4] = {g.v.x, g.v.y, g.v.z, g.v.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t lo = (bits >> (2 * q)) & 1u ? 0x0000ffffu : 0u;
      const uint32_t hi = (bits >> (2 * q + 1)) & 1u ? 0xffff0000u : 0u;
      w[q] &= lo | hi;
    }
    r.v = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    r.v = bits & 1u ? g.v : uint16_t{0};
  }
  return r;
}

// kBits: the mask from the forward's ReLU bit mask instead of Y (one word per row
// and thread, L bits of it). kMinBlocks: blocks per SM for __launch_bounds__ (0: none);
// at L = 8 with the bits the kernel takes 93 registers, 2 blocks per SM (an H200 ran it at
// 63% of HBM peak, bench/results/gpu_2026-11-27_8976e61/step_ncu_bf16.txt), and fits 80
// without a spill for 3 (sm_90, ptxas -v; three_block_kernels).
template <int L, bool kRelu, bool kBits = false, int kMinBlocks = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    group_sum_bf16_kernel(const uint16_t* __restrict__ Y, uint16_t* __restrict__ dY, int64_t n,
                          int S, int out, float* __restrict__ dYg, int64_t lddyg,
                          const uint32_t* __restrict__ mask = nullptr, int64_t words = 0) {
  const int per_row = out / L;
  const int64_t total = n * per_row;
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t p = x / per_row;
    const int j = static_cast<int>(x - p * per_row) * L;
    const int64_t first = p * S * out + j;
    double acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = 0.0;
    for (int s0 = 0; s0 < S; s0 += kGroupRowsInFlight) {
      const int m = S - s0 < kGroupRowsInFlight ? S - s0 : kGroupRowsInFlight;
      Bf16Lanes<L> g[kGroupRowsInFlight], y[kGroupRowsInFlight];
      uint32_t bits[kGroupRowsInFlight];
#pragma unroll
      for (int k = 0; k < kGroupRowsInFlight; ++k) {
        if (k < m) {
          const int64_t i = first + static_cast<int64_t>(s0 + k) * out;
          g[k] = load_bf16_lanes<L>(dY + i);
          if (kRelu && kBits)
            bits[k] = mask[(p * S + s0 + k) * words + j / 32] >> (j % 32);
          else if (kRelu)
            y[k] = load_bf16_lanes<L>(Y + i);
        }
      }
#pragma unroll
      for (int k = 0; k < kGroupRowsInFlight; ++k) {
        if (k < m) {
          if (kRelu) {
            g[k] = kBits ? mask_bf16_bits<L>(bits[k], g[k]) : mask_bf16_lanes<L>(y[k], g[k]);
            store_bf16_lanes<L>(dY + first + static_cast<int64_t>(s0 + k) * out, g[k]);
          }
#pragma unroll
          for (int l = 0; l < L; ++l) acc[l] += g[k].at(l);
        }
      }
    }
    float* dst = dYg + p * lddyg + j;
#pragma unroll
    for (int l = 0; l < L; ++l) dst[l] = static_cast<float>(acc[l]);
  }
}

template <int L>
void launch_group_sum_bf16(cudaStream_t stream, const uint16_t* Y, uint16_t* dY, int64_t n, int S,
                           int out, float* dYg, int64_t lddyg, bool relu,
                           const uint32_t* mask = nullptr) {
  const unsigned grid = grid_for(n * (out / L));
  if (relu && mask) {
    auto kernel = group_sum_bf16_kernel<L, true, true>;
    if constexpr (L == 8)
      if (three_block_kernels()) kernel = group_sum_bf16_kernel<L, true, true, 3>;
    kernel<<<grid, kThreads, 0, stream>>>(nullptr, dY, n, S, out, dYg, lddyg, mask,
                                          relu_mask_words(out));
  } else if (relu) {
    group_sum_bf16_kernel<L, true><<<grid, kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg);
  } else {
    group_sum_bf16_kernel<L, false><<<grid, kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg);
  }
}

// Where each partial column's total goes (neumf_top_partial_cols' layout).
struct TopStore {
  float* dw;
  float* dc;
  float* db;
  double* loss;
  double global_batch;
  int mf, last;
  __device__ void operator()(int col, double total) const {
    const int jg = (mf + 31) / 32, ja = (last + 31) / 32;
    const int C = 32 * (jg + 2 * ja) + 2;
    const float v = static_cast<float>(total);
    if (col == C - 2) {
      *dc = v;
    } else if (col == C - 1) {
      if (loss) *loss = total / global_batch;
    } else if (col < 32 * jg) {
      if (col < mf) dw[col] = v;
    } else if (col < 32 * (jg + ja)) {
      const int k = col - 32 * jg;
      if (k < last) dw[mf + k] = v;
    } else {
      const int k = col - 32 * (jg + ja);
      if (db && k < last) db[k] = v;
    }
  }
};
}  // namespace

// ---- the twins -------------------------------------------------------------------------

void fill(const ExecContext& ctx, float* x, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(x, n, value);
  check_launch("fill");
}

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
                     bool relu, GradMode mode, const uint32_t* dx_mask) {
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
  if (step_kernels() == StepKernels::kStreaming) {
    if (relu && db) {  // the mask and its column sums in one pass
      masked_col_sums(stream, Y, dY, B, out, partial, GradStore{db, add}, op);
    } else if (relu && B > 0) {
      relu_mask_stream_kernel<<<grid_for(B * out / 4 + 1), kThreads, 0, stream>>>(
          Y, dY, B * out, aligned16(Y) && aligned16(dY));
      check_launch(op);
    } else if (db) {
      deterministic_col_sums(stream, B, out, ColumnsOp{dY, out}, partial, GradStore{db, add}, op);
    }
  } else if (db) {  // legacy: the mask fused into the sums' loop
    deterministic_col_sums(stream, B, out, LinearBiasOp{dY, Y, out, relu}, partial,
                           GradStore{db, add}, op);
  } else if (relu && B > 0) {
    relu_mask_kernel<<<grid_for(B * out), kThreads, 0, stream>>>(dY, Y, B * out);
    check_launch(op);
  }
  // The GEMM inputs: FP32 as they are, or BF16 copies of the masked dZ, weight and X.
  GemmInput dz{dY, CUDA_R_32F}, w{weight, CUDA_R_32F}, x{X, CUDA_R_32F};
  if (bf16) {
    dz = to_bf16(stream, dY, out, B, out, dz16, op);
    if (dX) w = to_bf16(stream, weight, in, out, in, w16, op);
    x = to_bf16(stream, X, in, B, in, x16, op);
  }
  // 2. dX[B×in] = dZ[B×out]·weight[out×in], masked by dx_mask when given (in the
  // product's epilogue where cuBLASLt offers it).
  if (dX && B > 0 &&
      !(dx_mask && dz.type == w.type &&
        lt_drelu_dx(ctx, cuda_resources(ctx, op), math, dz.data, w.data, dz.type, dX, dx_mask, B,
                    in, out))) {
    gemm_typed(ctx, math, false, false, static_cast<int>(B), in, out, 1.0f, dz, out, w, in, 0.0f,
               dX, in, op);
    if (dx_mask) {
      mask_by_bits_kernel<<<grid_for(B * in), kThreads, 0, stream>>>(dX, B, in, dx_mask,
                                                                     relu_mask_words(in));
      check_launch(op);
    }
  }
  // 3. dweight[out×in] = dZ^T·X (B == 0: K == 0, so dweight = beta·dweight).
  gemm_typed(ctx, math, true, false, out, in, static_cast<int>(B), 1.0f, dz, out, x, in,
             add ? 1.0f : 0.0f, dweight, in, op);
}

void gmf_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                 int64_t ldi, float* gmf, int64_t ldg, int64_t B, int mf) {
  if (B == 0) return;
  gmf_forward_kernel<<<grid_for(B * mf), kThreads, 0, stream_of(ctx)>>>(urows, ldu, irows, ldi, gmf,
                                                                        ldg, B, mf);
  check_launch("gmf_forward");
}

void gmf_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                  int64_t ldi, const float* dgmf, int64_t ldg, float* durows, int64_t lddu,
                  float* dirows, int64_t lddi, int64_t B, int mf) {
  if (B == 0) return;
  gmf_backward_kernel<<<grid_for(B * mf), kThreads, 0, stream_of(ctx)>>>(
      urows, ldu, irows, ldi, dgmf, ldg, durows, lddu, dirows, lddi, B, mf);
  check_launch("gmf_backward");
}

void repeat_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, float* Y, int64_t n,
                 int S) {
  if (n == 0) return;
  repeat_rows_kernel<<<grid_for(n * S * w), kThreads, 0, stream_of(ctx)>>>(X, ldx, w, Y, n, S);
  check_launch("repeat_rows");
}

namespace {

// group_bias_act, and with mask (relu only) the output's ReLU bit mask: written in
// passing by the streaming kernel where out % 128 == 0, else by relu_bits_kernel
// from the stored output.
void group_bias_act_masked(const ExecContext& ctx, float* Y, const float* Yg, const float* bias,
                           int64_t n, int S, int out, bool relu, uint32_t* mask) {
  const char* op = "group_bias_act";
  if (n == 0) return;
  cudaStream_t stream = stream_of(ctx);
  bool mask_done = false;
  if (step_kernels() == StepKernels::kStreaming) {
    if (out % 4 == 0 && aligned16(Y) && aligned16(Yg)) {
      mask_done = out % 128 == 0;
      launch_group_bias_act_stream<4>(stream, Y, Yg, bias, n, S, out, relu,
                                      mask_done ? mask : nullptr);
    } else {
      launch_group_bias_act_stream<1>(stream, Y, Yg, bias, n, S, out, relu);
    }
  } else {
    group_bias_act_kernel<<<grid_for(n * S * out), kThreads, 0, stream>>>(Y, Yg, bias, n, S, out,
                                                                          relu);
  }
  if (mask && relu && !mask_done)
    launch_relu_bits(stream, static_cast<const float*>(Y), n * S, out, mask);
  check_launch(op);
}

}  // namespace

void group_bias_act(const ExecContext& ctx, float* Y, const float* Yg, const float* bias, int64_t n,
                    int S, int out, bool relu) {
  group_bias_act_masked(ctx, Y, Yg, bias, n, S, out, relu, nullptr);
}

void group_linear_forward(const ExecContext& ctx, const float* X, int64_t ldx, const float* weight,
                          int64_t ldw, const float* Yg, const float* bias, float* Y, int64_t n,
                          int S, int in, int out, bool relu, uint32_t* mask) {
  if (n == 0) return;
  gemm_on(ctx, false, true, static_cast<int>(n * S), out, in, 1.0f, X, static_cast<int>(ldx),
          weight, static_cast<int>(ldw), 0.0f, Y, out, "group_linear_forward");
  group_bias_act_masked(ctx, Y, Yg, bias, n, S, out, relu, mask);
}

namespace {

// The bias gradient of a group op: db = the column sums of the group sums dYg
// [n × out] (row stride lddyg), in double over fixed chunks (deterministic_col_sums).
void group_bias_grad(const ExecContext& ctx, cudaStream_t stream, const float* dYg, int64_t lddyg,
                     int64_t n, int out, float* db, const char* op) {
  double* partial = nullptr;
  carve_scratch(cuda_resources(ctx, op), [&](ScratchLayout& s) {
    partial = s.take<double>(static_cast<size_t>(col_chunks(n)) * out);
  });
  deterministic_col_sums(stream, n, out, GroupRowsOp{dYg, lddyg}, partial, GradStore{db, false},
                         op);
}

}  // namespace

void group_sum_backward(const ExecContext& ctx, const float* Y, float* dY, int64_t n, int S,
                        int out, float* dYg, int64_t lddyg, float* db, bool relu,
                        const uint32_t* mask) {
  const char* op = "group_sum_backward";
  cudaStream_t stream = stream_of(ctx);
  if (!relu) mask = nullptr;
  // A bit mask takes the streaming kernels (the legacy one reads Y).
  if (n > 0 && (mask || step_kernels() == StepKernels::kStreaming)) {
    const bool vec = out % 4 == 0 && aligned16(dY) && (!relu || mask || aligned16(Y));
    if (vec) {
      launch_group_sum_stream<4>(stream, Y, dY, n, S, out, dYg, lddyg, relu,
                                 aligned16(dYg) && lddyg % 4 == 0, mask);
    } else {
      launch_group_sum_stream<1>(stream, Y, dY, n, S, out, dYg, lddyg, relu, false, mask);
    }
    check_launch(op);
  } else if (n > 0) {
    group_sum_kernel<<<grid_for(n * out), kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg,
                                                                 relu);
    check_launch(op);
  }
  if (db) group_bias_grad(ctx, stream, dYg, lddyg, n, out, db, op);
}

void concat_cols(const ExecContext& ctx, const float* A, int64_t lda, int wa, const float* C,
                 int64_t ldc, int wc, float* Y, int64_t B) {
  const int64_t w = static_cast<int64_t>(wa) + wc;
  check_int_range("concat_cols", "wa + wc", w);
  copy_cols(stream_of(ctx), A, lda, Y, w, B, wa, "concat_cols");
  copy_cols(stream_of(ctx), C, ldc, Y + wa, w, B, wc, "concat_cols");
}

void split_cols(const ExecContext& ctx, const float* dY, int wa, int wc, float* dA, int64_t ldda,
                float* dC, int64_t lddc, int64_t B) {
  const int64_t w = static_cast<int64_t>(wa) + wc;
  check_int_range("split_cols", "wa + wc", w);
  copy_cols(stream_of(ctx), dY, w, dA, ldda, B, wa, "split_cols");
  copy_cols(stream_of(ctx), dY + wa, w, dC, lddc, B, wc, "split_cols");
}

void head_forward(const ExecContext& ctx, const float* H, const float* w, const float* c,
                  float* logits, int64_t B, int F) {
  if (B == 0) return;
  head_forward_kernel<<<grid_for(B * 32), kThreads, 0, stream_of(ctx)>>>(H, w, c, logits, B, F);
  check_launch("head_forward");
}

void head_backward(const ExecContext& ctx, const float* H, const float* w, const float* dlogits,
                   float* dH, float* dw, float* dc, int64_t B, int F, GradMode mode) {
  const char* op = "head_backward";
  CudaResources& r = cuda_resources(ctx, op);
  const int C = F + 1;  // dw's F columns and dc
  check_int_range(op, "F + 1", static_cast<int64_t>(F) + 1);
  double* partial = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    partial = s.take<double>(static_cast<size_t>(col_chunks(B)) * C);
  });
  deterministic_col_sums(stream_of(ctx), B, C, HeadBackwardOp{H, w, dlogits, dH, F}, partial,
                         HeadStore{dw, dc, F, mode == GradMode::kAccumulate}, op);
}

void bce_with_logits_forward(const ExecContext& ctx, const float* logits, const float* labels,
                             const float* weights, double* loss, int64_t B, int64_t n_valid,
                             int64_t global_batch) {
  const char* op = "bce_with_logits_forward";
  CudaResources& r = cuda_resources(ctx, op);
  double* partial = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    partial = s.take<double>(static_cast<size_t>(sum_chunks(n_valid)));
  });
  deterministic_sums<1>(stream_of(ctx), n_valid, BceLossOp{logits, labels, weights}, partial,
                        LossStore{loss, static_cast<double>(global_batch)}, op);
}

void bce_with_logits_backward(const ExecContext& ctx, const float* logits, const float* labels,
                              const float* weights, float* dlogits, int64_t B, int64_t n_valid,
                              int64_t global_batch) {
  if (B == 0) return;
  const float inv_batch = static_cast<float>(1.0 / static_cast<double>(global_batch));
  bce_backward_kernel<<<grid_for(B), kThreads, 0, stream_of(ctx)>>>(logits, labels, weights,
                                                                    dlogits, B, n_valid, inv_batch);
  check_launch("bce_with_logits_backward");
}

namespace {

template <typename TA>
void top_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                 int64_t ldi, const TA* A, const float* w, const float* c, float* logits, int64_t n,
                 int S, int mf, int last, const int32_t* ids, const char* op) {
  if (n == 0) return;
  const int F = mf + last;
  const int pieces = top_pieces(S);
  const unsigned grid = grid_for(n * pieces * 32);
  cudaStream_t stream = stream_of(ctx);
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(urows, ldu, irows, ldi, A, w, c, logits, n, S, mf, last,
                                          ids);
  };
  const bool split = pieces > 1;
  if (F <= 32) {
    launch(split ? neumf_top_forward_kernel<1, TA, true> : neumf_top_forward_kernel<1, TA, false>);
  } else if (F <= 64) {
    launch(split ? neumf_top_forward_kernel<2, TA, true> : neumf_top_forward_kernel<2, TA, false>);
  } else if (F <= 128) {
    launch(split ? neumf_top_forward_kernel<4, TA, true> : neumf_top_forward_kernel<4, TA, false>);
  } else {
    launch(split ? neumf_top_forward_kernel<8, TA, true> : neumf_top_forward_kernel<8, TA, false>);
  }
  check_launch(op);
}

template <typename TA>
void top_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                  int64_t ldi, const TA* A, const float* w, const float* dlogits,
                  const float* logits, const float* labels, int64_t global_batch, double* loss,
                  TA* dA, float* durows, int64_t lddu, float* dirows, int64_t lddi, float* dw,
                  float* dc, float* db, int64_t n, int S, int mf, int last, bool relu,
                  const char* op) {
  cudaStream_t stream = stream_of(ctx);
  const int64_t chunks = neumf_top_chunks(n);
  const int C = neumf_top_partial_cols(mf, last);
  check_int_range(op, "group chunks", chunks);
  double* partial = nullptr;
  carve_scratch(cuda_resources(ctx, op), [&](ScratchLayout& s) {
    partial = s.take<double>(static_cast<size_t>(std::max<int64_t>(chunks, 1)) * C);
  });
  const bool from_labels = loss != nullptr;  // else from dlogits
  if (from_labels) dlogits = nullptr;
  const float inv_batch =
      from_labels ? static_cast<float>(1.0 / static_cast<double>(global_batch)) : 0.0f;
  if (chunks > 0) {
    const int J = std::max(mf, last) <= 32 ? 1 : (std::max(mf, last) <= 64 ? 2 : 4);
    const unsigned grid = static_cast<unsigned>(chunks);
    auto launch = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, stream>>>(urows, ldu, irows, ldi, A, w, dlogits, logits, labels,
                                            inv_batch, dA, durows, lddu, dirows, lddi, n, S, mf,
                                            last, relu, partial);
    };
    if (J == 1) {
      launch(neumf_top_backward_kernel<1, TA>);
    } else if (J == 2) {
      // 3 blocks per SM on BF16 only: the FP32 kernel spills at 3 blocks' 80 registers.
      if constexpr (sizeof(TA) == 2)
        launch(three_block_kernels() ? neumf_top_backward_kernel<2, TA, 4, 3>
                                     : neumf_top_backward_kernel<2, TA>);
      else
        launch(neumf_top_backward_kernel<2, TA>);
    } else {
      launch(neumf_top_backward_kernel<4, TA>);
    }
    check_launch(op);
  }
  // The blocks' partials in chunk order, as deterministic_col_sums finishes its own.
  finish_col_sums(stream, partial, chunks, C,
                  TopStore{dw, dc, db, loss, static_cast<double>(global_batch), mf, last});
  check_launch(op);
}

}  // namespace

void neumf_top_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                       int64_t ldi, const float* A, const float* w, const float* c, float* logits,
                       int64_t n, int S, int mf, int last, const int32_t* irow_ids) {
  top_forward(ctx, urows, ldu, irows, ldi, A, w, c, logits, n, S, mf, last, irow_ids,
              "neumf_top_forward");
}

void neumf_top_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                        int64_t ldi, const float* A, const float* w, const float* dlogits,
                        const float* logits, const float* labels, int64_t global_batch,
                        double* loss, float* dA, float* durows, int64_t lddu, float* dirows,
                        int64_t lddi, float* dw, float* dc, float* db, int64_t n, int S, int mf,
                        int last, bool relu) {
  top_backward(ctx, urows, ldu, irows, ldi, A, w, dlogits, logits, labels, global_batch, loss, dA,
               durows, lddu, dirows, lddi, dw, dc, db, n, S, mf, last, relu, "neumf_top_backward");
}

// ---- BF16 storage -----------------------------------------------------------------------
// The products read BF16 arrays as they are and accumulate in FP32. A BF16 output
// is rounded once after its epilogue: by cuBLAS for dX (no epilogue, to nearest) and
// for the layers above layer 0 (cuBLASLt's bias and ReLU epilogue); for layer 0 the
// FP32 product goes to the scratch arena and one kernel applies the epilogue (bias,
// ReLU, the users' rows) and rounds with bf16.h's float_to_bf16_bits, as the CPU twin
// rounds.

void neumf_top_forward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                            const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                            const float* c, float* logits, int64_t n, int S, int mf, int last,
                            const int32_t* irow_ids) {
  top_forward(ctx, urows, ldu, irows, ldi, A, w, c, logits, n, S, mf, last, irow_ids,
              "neumf_top_forward_bf16");
}

void neumf_top_backward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                             const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                             const float* dlogits, const float* logits, const float* labels,
                             int64_t global_batch, double* loss, uint16_t* dA, float* durows,
                             int64_t lddu, float* dirows, int64_t lddi, float* dw, float* dc,
                             float* db, int64_t n, int S, int mf, int last, bool relu) {
  top_backward(ctx, urows, ldu, irows, ldi, A, w, dlogits, logits, labels, global_batch, loss, dA,
               durows, lddu, dirows, lddi, dw, dc, db, n, S, mf, last, relu,
               "neumf_top_backward_bf16");
}

void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B) {
  if (B == 0) return;
  launch_to_bf16(stream_of(ctx), X, ldx, B, w, Y, ldy, true);
  check_launch("to_bf16_rows");
}

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

void group_linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, int64_t ldx,
                               const uint16_t* weight, int64_t ldw, const float* Yg,
                               const float* bias, uint16_t* Y, int64_t n, int S, int in, int out,
                               bool relu, uint32_t* mask) {
  const char* op = "group_linear_forward_bf16";
  if (n == 0) return;
  const int64_t B = n * S;
  float* Z = nullptr;
  carve_scratch(cuda_resources(ctx, op),
                [&](ScratchLayout& s) { Z = s.take<float>(static_cast<size_t>(B) * out); });
  gemm_typed(ctx, MathMode::kBf16, false, true, static_cast<int>(B), out, in, 1.0f,
             GemmInput{X, CUDA_R_16BF}, static_cast<int>(ldx), GemmInput{weight, CUDA_R_16BF},
             static_cast<int>(ldw), 0.0f, Z, out, op);
  launch_bias_act_bf16(stream_of(ctx), Z, Yg, S, bias, Y, B, out, relu, nullptr, mask);
  check_launch(op);
}

void gather_bias_act(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                     const float* Yg, const float* bias, float* Y, int64_t n, int S, int out,
                     bool relu, uint32_t* mask) {
  const char* op = "gather_bias_act";
  const int64_t B = n * S;
  if (B == 0) return;
  if (out % 4 == 0 && aligned16(P) && aligned16(Yg) && aligned16(Y)) {
    launch_gather_bias_act<4>(stream_of(ctx), P, ids, Yg, bias, Y, B, S, out, relu, mask);
  } else {
    launch_gather_bias_act<1>(stream_of(ctx), P, ids, Yg, bias, Y, B, S, out, relu, mask);
  }
  check_launch(op);
}

void gather_bias_act_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                          const float* Yg, const float* bias, uint16_t* Y, int64_t n, int S,
                          int out, bool relu, uint32_t* mask) {
  const char* op = "gather_bias_act_bf16";
  const int64_t B = n * S;
  if (B == 0) return;
  launch_bias_act_bf16(stream_of(ctx), P, Yg, S, bias, Y, B, out, relu, ids, mask);
  check_launch(op);
}

// The runs of the ids (IdRuns: the positions sorted by id into order, the runs numbered),
// then each sample's run and each run's start and first sample. No host wait: the runs
// past the last distinct id are made empty first. A bad id is recorded (IdRuns checks
// them against the bound) and raised at the op's caller's next wait.
void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first) {
  const char* op = "item_runs";
  cudaStream_t stream = stream_of(ctx);
  CudaResources& r = cuda_resources(ctx, op);
  check_int_range(op, "B", B);
  check_int_range(op, "R", R);
  empty_runs_kernel<<<grid_for(R + 1), kThreads, 0, stream>>>(starts, first, R,
                                                              static_cast<int32_t>(B));
  check_launch(op);
  if (B == 0) return;
  IdRuns runs(B, bound, stream, order);
  carve_scratch(r, [&](ScratchLayout& s) { runs.take(s); });
  runs.launch(ids, r.error_dev, op);
  run_index_kernel<<<grid_for(B), kThreads, 0, stream>>>(runs.sorted, order, runs.run, B, R, starts,
                                                         inv, first);
  check_launch(op);
}

void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids) {
  if (R == 0) return;
  gather_run_rows_kernel<<<grid_for(R * w), kThreads, 0, stream_of(ctx)>>>(X, ldx, w, first, R, Y,
                                                                           ids);
  check_launch("gather_run_rows");
}

void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP) {
  if (R == 0) return;
  if (out % 4 == 0 && aligned16(dZ) && aligned16(dP)) {
    launch_run_sums<float, 4>(stream_of(ctx), dZ, order, starts, R, out, dP);
  } else {
    launch_run_sums<float, 1>(stream_of(ctx), dZ, order, starts, R, out, dP);
  }
  check_launch("run_sums");
}

void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy) {
  if (B == 0) return;
  if (w % 4 == 0 && ldy % 4 == 0 && aligned16(Yr) && aligned16(Y)) {
    constexpr int kSamples = 4;
    if (scatter_rows_by_four())
      scatter_run_rows_many_kernel<4, kSamples>
          <<<grid_for((B + kSamples - 1) / kSamples * (w / 4)), kThreads, 0, stream_of(ctx)>>>(
              Yr, R, parts, w, inv, first, B, Y, ldy);
    else
      scatter_run_rows_kernel<4><<<grid_for(B * (w / 4)), kThreads, 0, stream_of(ctx)>>>(
          Yr, R, parts, w, inv, first, B, Y, ldy);
  } else {
    scatter_run_rows_kernel<1>
        <<<grid_for(B * w), kThreads, 0, stream_of(ctx)>>>(Yr, R, parts, w, inv, first, B, Y, ldy);
  }
  check_launch("scatter_run_rows");
}

void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy) {
  if (R == 0) return;
  put_run_rows_kernel<<<grid_for(R * w), kThreads, 0, stream_of(ctx)>>>(Yr, R, parts, w, ids, first,
                                                                        Y, ldy);
  check_launch("put_run_rows");
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

void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP) {
  if (R == 0) return;
  if (out % 4 == 0 && (reinterpret_cast<uintptr_t>(dZ) & 7u) == 0) {  // 8-byte rows
    launch_run_sums<uint16_t, 4>(stream_of(ctx), dZ, order, starts, R, out, dP);
  } else {
    launch_run_sums<uint16_t, 1>(stream_of(ctx), dZ, order, starts, R, out, dP);
  }
  check_launch("run_sums_bf16");
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

void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask) {
  const char* op = "group_sum_backward_bf16";
  cudaStream_t stream = stream_of(ctx);
  if (!relu) mask = nullptr;
  if (n > 0) {
    // Rows of 16-byte octets when the width and both arrays allow.
    if (out % 8 == 0 && aligned16(dY) && (!relu || mask || aligned16(Y)))
      launch_group_sum_bf16<8>(stream, Y, dY, n, S, out, dYg, lddyg, relu, mask);
    else
      launch_group_sum_bf16<1>(stream, Y, dY, n, S, out, dYg, lddyg, relu, mask);
    check_launch(op);
  }
  if (db) group_bias_grad(ctx, stream, dYg, lddyg, n, out, db, op);
}

}  // namespace ncf::cuda
