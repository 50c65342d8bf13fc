// neumf_score_items_bf16 on the GPU (model/ops.h): evaluation's scoring of candidates
// against the item table in one kernel. A block keeps the BF16 weights of the layers
// above layer 0 in shared memory and takes tiles of kRows candidates: layer 0's rows
// from the per-item products by id (gather_bias_act_bf16's expression), each layer above
// as WMMA products on tensor cores with the epilogue of linear_forward_bf16 (FP32 sum with
// the BF16 bias, ReLU, BF16 rounding) into the next tile buffer, and the fused top's
// logit of each candidate (neumf_top_forward_kernel's lanes, products and shuffle order).
// No activation leaves the chip: per candidate the kernel reads its id, layer 0's FP32
// product row and the two GMF rows (L2-resident tables of R and n rows), and writes one
// float.
#include <cuda_bf16.h>
#include <mma.h>

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "model/ops.h"

namespace ncf::cuda {
namespace {

// BF16s after each row of a shared tile (16 bytes): rows stay 16-byte aligned, and the
// eight rows of one 8 x 8 fragment load start 4 banks apart (no bank conflicts).
constexpr int kScorePad = 8;
constexpr int kScoreAlign = 128;

int round_up(int x, int a) { return (x + a - 1) / a * a; }

// Byte offsets of a block's shared memory for tiles of `rows` candidates.
struct ScoreLayout {
  int w[kScoreMaxLayers] = {};     // layer l's weight [out × (in + pad)] BF16
  int bias[kScoreMaxLayers] = {};  // layer l's bias widened, [out] floats
  int b0 = 0;                      // layer 0's bias [w0] floats
  int buf[2] = {};                 // the tiles: layer l's output (0: layer 0) in buf[l % 2]
  int scratch = 0;                 // one 16 x 16 float fragment per warp
  int meta = 0;                    // the tile's ids [rows] and users [rows]
  int bytes = 0;
};

ScoreLayout score_layout(int rows, int warps, int w0, const ScoreLayerBf16* layers, int L) {
  ScoreLayout s;
  int at = 0;
  auto take = [&](int bytes) {
    const int here = at;
    at = round_up(at + bytes, kScoreAlign);
    return here;
  };
  int width[2] = {w0, 0};  // the widest output each buffer holds
  for (int l = 0; l < L; ++l) {
    s.w[l] = take(layers[l].out * (layers[l].in + kScorePad) * 2);
    s.bias[l] = take(layers[l].out * 4);
    int& wb = width[(l + 1) % 2];
    wb = wb > layers[l].out ? wb : layers[l].out;
  }
  s.b0 = take(w0 * 4);
  for (int k = 0; k < 2; ++k) s.buf[k] = take(rows * (width[k] + kScorePad) * 2);
  s.scratch = take(warps * 16 * 16 * 4);
  s.meta = take(2 * rows * 4);
  s.bytes = at;
  return s;
}

struct ScoreArgs {
  const float* P;
  const int32_t* ids;
  const float* U0;
  const float* b0;
  int w0;
  const uint16_t* w[kScoreMaxLayers];
  const uint16_t* b[kScoreMaxLayers];
  int in[kScoreMaxLayers], out[kScoreMaxLayers];
  int L;
  const float* urows;
  int64_t ldu;
  const float* irows;
  int64_t ldi;
  const float* head_w;
  const float* c;
  float* logits;
  int B, S, mf;
  ScoreLayout s;
};

__device__ __forceinline__ float relu_of(float v) { return v > 0.0f ? v : 0.0f; }

// One layer of a tile: Y [rows × out] (row stride ldy) = bf16(relu(X · W^T + bias)), X
// [rows × in] (ldx) and W [out × in] (ldw) BF16 in shared memory. A warp takes units of
// MR x NC fragments of 16 x 16 (the A fragments of a unit shared by its NC columns, the B
// fragments by its MR rows), its FP32 accumulators through the warp's scratch fragment
// for the epilogue: lane l rounds row l / 2, eight columns from (l % 2)·8, one 16-byte store.
template <int MR, int NC, int kWarps>
__device__ __forceinline__ void score_layer(const uint16_t* X, int ldx, const uint16_t* W, int ldw,
                                            const float* bias, uint16_t* Y, int ldy, int in,
                                            int out, float* scratch, int warp, int lane, int rows) {
  using namespace nvcuda;
  const int row_units = rows / (16 * MR);
  const int units = row_units * (out / (16 * NC));
  const int er = lane >> 1, ec = (lane & 1) * 8;
  for (int u = warp; u < units; u += kWarps) {
    const int r0 = (u % row_units) * 16 * MR, c0 = (u / row_units) * 16 * NC;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MR][NC];
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
      for (int j = 0; j < NC; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k = 0; k < in; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[MR];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[NC];
#pragma unroll
      for (int i = 0; i < MR; ++i)
        wmma::load_matrix_sync(
            fa[i], reinterpret_cast<const __nv_bfloat16*>(X + (r0 + 16 * i) * ldx + k), ldx);
#pragma unroll
      for (int j = 0; j < NC; ++j)
        wmma::load_matrix_sync(
            fb[j], reinterpret_cast<const __nv_bfloat16*>(W + (c0 + 16 * j) * ldw + k), ldw);
#pragma unroll
      for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int j = 0; j < NC; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
      for (int j = 0; j < NC; ++j) {
        wmma::store_matrix_sync(scratch, acc[i][j], 16, wmma::mem_row_major);
        __syncwarp();
        const float4 s0 = *reinterpret_cast<const float4*>(scratch + er * 16 + ec);
        const float4 s1 = *reinterpret_cast<const float4*>(scratch + er * 16 + ec + 4);
        const int col = c0 + 16 * j + ec;
        const float4 b0 = *reinterpret_cast<const float4*>(bias + col);
        const float4 b1 = *reinterpret_cast<const float4*>(bias + col + 4);
        float v[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
        const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = relu_of(__fadd_rn(v[e], bv[e]));
        *reinterpret_cast<uint4*>(Y + (r0 + 16 * i + er) * ldy + col) =
            make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]), bf16_pair(v[4], v[5]),
                       bf16_pair(v[6], v[7]));
        __syncwarp();  // the scratch is read before the next fragment lands in it
      }
  }
}

// The layer's fragment units: 2 x 2 where they give every warp one, else narrower.
template <int kWarps>
__device__ __forceinline__ void score_layer_any(const uint16_t* X, int ldx, const uint16_t* W,
                                                int ldw, const float* bias, uint16_t* Y, int ldy,
                                                int in, int out, float* scratch, int warp, int lane,
                                                int rows) {
  if (out % 32 == 0 && (rows / 32) * (out / 32) >= kWarps)
    score_layer<2, 2, kWarps>(X, ldx, W, ldw, bias, Y, ldy, in, out, scratch, warp, lane, rows);
  else if (out % 32 == 0)
    score_layer<1, 2, kWarps>(X, ldx, W, ldw, bias, Y, ldy, in, out, scratch, warp, lane, rows);
  else
    score_layer<1, 1, kWarps>(X, ldx, W, ldw, bias, Y, ldy, in, out, scratch, warp, lane, rows);
}

// Once per block: the weights of the layers above layer 0 into shared memory (16-byte rows
// where aligned), their biases widened, and layer 0's bias.
template <int kThr>
__device__ __forceinline__ void score_stage_weights(const ScoreArgs& a, unsigned char* smem,
                                                    int tid) {
  const ScoreLayout& s = a.s;
  for (int l = 0; l < a.L; ++l) {
    const int in = a.in[l], out = a.out[l], ld = in + kScorePad;
    uint16_t* ws = reinterpret_cast<uint16_t*>(smem + s.w[l]);
    const uint16_t* wg = a.w[l];
    if (aligned16(wg)) {
      const int per_row = in / 8;
      for (int q = tid; q < out * per_row; q += kThr) {
        const int r = q / per_row, k = (q - r * per_row) * 8;
        *reinterpret_cast<uint4*>(ws + r * ld + k) =
            __ldg(reinterpret_cast<const uint4*>(wg + int64_t{r} * in + k));
      }
    } else {
      for (int q = tid; q < out * in; q += kThr) {
        const int r = q / in, k = q - r * in;
        ws[r * ld + k] = wg[q];
      }
    }
    float* bs = reinterpret_cast<float*>(smem + s.bias[l]);
    for (int j = tid; j < out; j += kThr) bs[j] = a.b[l] ? bf16_bits_to_float(a.b[l][j]) : 0.0f;
  }
  float* b0s = reinterpret_cast<float*>(smem + s.b0);
  for (int j = tid; j < a.w0; j += kThr) b0s[j] = a.b0 ? a.b0[j] : 0.0f;
}

// Layer 0 of a tile of m rows (of kRows): bf16(relu((P[id] + b0) + U0[user])) into buf0,
// eight columns per thread and four octets' loads issued before their adds; rows past the
// batch are zeros.
template <int kRows, int kThr>
__device__ __forceinline__ void score_layer0(const ScoreArgs& a, const int32_t* sid,
                                             const int32_t* suser, const float* b0s, uint16_t* buf0,
                                             int m, int tid) {
  const int oct = a.w0 / 8, total = kRows * oct, ld0 = a.w0 + kScorePad;
  constexpr int kU = 4;
  for (int q0 = tid; q0 < total; q0 += kU * kThr) {
    float4 z[kU][2], g[kU][2];
    int rr[kU], jj[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int q = q0 + u * kThr;
      rr[u] = q / oct;
      jj[u] = (q - rr[u] * oct) * 8;
      z[u][0] = z[u][1] = g[u][0] = g[u][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (q < total && rr[u] < m) {
        const float4* zp =
            reinterpret_cast<const float4*>(a.P + int64_t{sid[rr[u]]} * a.w0 + jj[u]);
        const float4* gp =
            reinterpret_cast<const float4*>(a.U0 + int64_t{suser[rr[u]]} * a.w0 + jj[u]);
        z[u][0] = __ldg(zp);
        z[u][1] = __ldg(zp + 1);
        g[u][0] = __ldg(gp);
        g[u][1] = __ldg(gp + 1);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int q = q0 + u * kThr;
      if (q >= total) continue;
      uint4 st = make_uint4(0u, 0u, 0u, 0u);
      if (rr[u] < m) {
        const float zv[8] = {z[u][0].x, z[u][0].y, z[u][0].z, z[u][0].w,
                             z[u][1].x, z[u][1].y, z[u][1].z, z[u][1].w};
        const float gv[8] = {g[u][0].x, g[u][0].y, g[u][0].z, g[u][0].w,
                             g[u][1].x, g[u][1].y, g[u][1].z, g[u][1].w};
        const float4 bl0 = *reinterpret_cast<const float4*>(b0s + jj[u]);
        const float4 bl1 = *reinterpret_cast<const float4*>(b0s + jj[u] + 4);
        const float bv[8] = {bl0.x, bl0.y, bl0.z, bl0.w, bl1.x, bl1.y, bl1.z, bl1.w};
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = relu_of(__fadd_rn(__fadd_rn(zv[e], bv[e]), gv[e]));
        st = make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]), bf16_pair(v[4], v[5]),
                        bf16_pair(v[6], v[7]));
      }
      *reinterpret_cast<uint4*>(buf0 + rr[u] * ld0 + jj[u]) = st;
    }
  }
}

// The top of a tile of m rows (of kRows) starting at row0, from the last layer's output A
// (row stride lda; columns [mf, F) of the top): warp v takes rows v, v + kWarps, …,
// kTopRows at a time, every load of a round issued before its sums; each logit as
// neumf_top_forward_kernel<J> sums it.
template <int kRows, int kWarps, int kTopRows, int J>
__device__ __forceinline__ void score_top(const ScoreArgs& a, const uint16_t* A, int lda, int mf,
                                          int F, const int32_t* sid, const int32_t* suser,
                                          const float (&wk)[J], float c0, int row0, int m, int warp,
                                          int lane) {
  for (int t0 = 0; t0 < kRows / kWarps; t0 += kTopRows) {
    float u[kTopRows][J], hi[kTopRows][J];
    uint16_t ha[kTopRows][J];
#pragma unroll
    for (int r = 0; r < kTopRows; ++r) {
      const int row = warp + kWarps * (t0 + r);
      const int64_t p = suser[row], id = sid[row];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int k = lane + 32 * j;
        u[r][j] = hi[r][j] = 0.0f;
        ha[r][j] = 0;
        if (row < m) {
          if (k < mf) {
            u[r][j] = a.urows[p * a.ldu + k];
            hi[r][j] = a.irows[id * a.ldi + k];
          } else if (k < F) {
            ha[r][j] = A[row * lda + (k - mf)];
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kTopRows; ++r) {
      const int row = warp + kWarps * (t0 + r);
      if (row < m) {  // uniform across the warp
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int k = lane + 32 * j;
          if (k < F) {
            const float hv = k < mf ? __fmul_rn(u[r][j], hi[r][j]) : bf16_bits_to_float(ha[r][j]);
            acc += hv * wk[j];
          }
        }
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) a.logits[row0 + row] = acc + c0;
      }
    }
  }
}

// kRows candidates per tile, kRows / 8 warps (each warp's share of the top is 8 rows);
// J columns per lane of F = mf + last, as neumf_top_forward_kernel<J>.
template <int kRows, int J>
__global__ void __launch_bounds__(kRows * 4, 1) score_items_kernel(const ScoreArgs a) {
  constexpr int kWarps = kRows / 8;
  constexpr int kThr = 32 * kWarps;
  constexpr int kTopRows = J >= 8 ? 2 : (J >= 4 ? 4 : 8);  // rows in flight, as the top's
  extern __shared__ __align__(kScoreAlign) unsigned char smem[];
  const ScoreLayout& s = a.s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  score_stage_weights<kThr>(a, smem, tid);
  const float* b0s = reinterpret_cast<const float*>(smem + s.b0);
  float* scratch = reinterpret_cast<float*>(smem + s.scratch) + warp * 256;
  int32_t* sid = reinterpret_cast<int32_t*>(smem + s.meta);
  int32_t* suser = sid + kRows;
  uint16_t* const buf0 = reinterpret_cast<uint16_t*>(smem + s.buf[0]);
  uint16_t* const buf1 = reinterpret_cast<uint16_t*>(smem + s.buf[1]);
  auto buf = [&](int k) { return k % 2 ? buf1 : buf0; };  // a select, not a local array

  const int last = a.out[a.L - 1], mf = a.mf, F = mf + last;
  float wk[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int k = lane + 32 * j;
    wk[j] = k < F ? a.head_w[k] : 0.0f;
  }
  const float c0 = a.c[0];
  __syncthreads();

  const int tiles = (a.B + kRows - 1) / kRows;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int row0 = t * kRows;
    const int m = a.B - row0 < kRows ? a.B - row0 : kRows;
    if (tid < kRows) {
      const bool in = tid < m;
      sid[tid] = in ? a.ids[row0 + tid] : 0;
      suser[tid] =
          in ? static_cast<int32_t>(static_cast<uint32_t>(row0 + tid) / static_cast<uint32_t>(a.S))
             : 0;
    }
    __syncthreads();
    score_layer0<kRows, kThr>(a, sid, suser, b0s, buf0, m, tid);
    __syncthreads();

    // The layers above: layer l + 1's output from buf[l % 2] into buf[(l + 1) % 2].
    for (int l = 0; l < a.L; ++l) {
      const int in = a.in[l], out = a.out[l];
      score_layer_any<kWarps>(buf(l), in + kScorePad,
                              reinterpret_cast<const uint16_t*>(smem + s.w[l]), in + kScorePad,
                              reinterpret_cast<const float*>(smem + s.bias[l]), buf(l + 1),
                              out + kScorePad, in, out, scratch, warp, lane, kRows);
      __syncthreads();
    }

    score_top<kRows, kWarps, kTopRows, J>(a, buf(a.L), last + kScorePad, mf, F, sid, suser, wk, c0,
                                          row0, m, warp, lane);
    __syncthreads();  // the tile's buffers and ids are read before the next tile's land
  }
}

// The tile height whose layout fits the device's shared memory (128 candidates, else
// 64), or 0.
int score_rows(const CudaResources& r, int w0, const ScoreLayerBf16* layers, int L,
               ScoreLayout* layout) {
  for (int rows : {128, 64}) {
    const ScoreLayout s = score_layout(rows, rows / 8, w0, layers, L);
    if (s.bytes <= r.smem_optin) {
      if (layout) *layout = s;
      return rows;
    }
  }
  return 0;
}

template <int kRows, int J>
void launch_score_items(const CudaResources& r, cudaStream_t stream, const ScoreArgs& a) {
  auto kernel = score_items_kernel<kRows, J>;
  const int threads = kRows * 4;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, a.s.bytes));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, a.s.bytes));
  const int64_t tiles = (int64_t{a.B} + kRows - 1) / kRows;
  const int64_t resident = int64_t{r.sm_count} * (per_sm > 0 ? per_sm : 1);
  const unsigned grid = static_cast<unsigned>(tiles < resident ? tiles : resident);
  kernel<<<grid, threads, a.s.bytes, stream>>>(a);
}

template <int kRows>
void launch_score_items_j(const CudaResources& r, cudaStream_t stream, const ScoreArgs& a, int F) {
  if (F <= 32)
    launch_score_items<kRows, 1>(r, stream, a);
  else if (F <= 64)
    launch_score_items<kRows, 2>(r, stream, a);
  else if (F <= 128)
    launch_score_items<kRows, 4>(r, stream, a);
  else
    launch_score_items<kRows, 8>(r, stream, a);
}

}  // namespace

int score_items_smem_bytes(const ExecContext& ctx, int w0, const ScoreLayerBf16* layers, int L) {
  ScoreLayout s;
  const CudaResources& r = cuda_resources(ctx, "score_items_fusable");
  return score_rows(r, w0, layers, L, &s) > 0 ? s.bytes : 0;
}

void neumf_score_items_bf16(const ExecContext& ctx, const float* P, const int32_t* ids,
                            const float* U0, const float* b0, int w0, const ScoreLayerBf16* layers,
                            int L, const float* urows, int64_t ldu, const float* irows, int64_t ldi,
                            const float* w, const float* c, float* logits, int64_t n, int S,
                            int mf) {
  const int64_t B = n * S;
  if (B == 0) return;
  const char* op = "neumf_score_items_bf16";
  const CudaResources& r = cuda_resources(ctx, op);
  ScoreArgs a{};
  const int rows = score_rows(r, w0, layers, L, &a.s);
  NCF_CHECK(rows > 0, op, ": the widths do not fit a block's shared memory");
  NCF_CHECK(aligned16(P) && aligned16(U0), op, ": P and U0 must be 16-byte aligned");
  a.P = P;
  a.ids = ids;
  a.U0 = U0;
  a.b0 = b0;
  a.w0 = w0;
  for (int l = 0; l < L; ++l) {
    a.w[l] = layers[l].w;
    a.b[l] = layers[l].b;
    a.in[l] = layers[l].in;
    a.out[l] = layers[l].out;
  }
  a.L = L;
  a.urows = urows;
  a.ldu = ldu;
  a.irows = irows;
  a.ldi = ldi;
  a.head_w = w;
  a.c = c;
  a.logits = logits;
  a.B = static_cast<int>(B);
  a.S = S;
  a.mf = mf;
  const int F = mf + layers[L - 1].out;
  if (rows == 128)
    launch_score_items_j<128>(r, stream_of(ctx), a, F);
  else
    launch_score_items_j<64>(r, stream_of(ctx), a, F);
  check_launch(op);
}

}  // namespace ncf::cuda
