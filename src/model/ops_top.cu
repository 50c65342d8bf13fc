// CUDA twins of NeuMF's top in ops_top.h (same names and arguments; the CPU functions
// check the arguments and forward here when ctx.device is kCuda): GMF, the column copies,
// the head and the loss as separate kernels, and the fused top. Sums over the batch use
// the fixed-order reductions of cuda_util.cuh. Everything runs on ctx.stream.

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "model/ops_internal.cuh"

namespace ncf::cuda {

namespace {

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
// the GPU kit's eval_ncu_bf16 stage, 2026-11-27). Training's groups of 5 stay
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
// eligible warp per scheduler (the GPU kit's step_ncu_top stage, 2026-11-27).
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

// The end of neumf_top_backward_kernel<J>: each warp's lane sums into shared memory, then
// thread c adds column c's over the warps in warp order (dc and the loss also over lanes, in
// lane order) into partial[blockIdx.x, c] (neumf_top_partial_cols columns).
template <int J>
__device__ __forceinline__ void top_backward_block_sums(double (&sh)[kTopWarps][kTopSlots][32],
                                                        const double (&dwg)[J],
                                                        const double (&dwa)[J],
                                                        const double (&dbs)[J], double dcl,
                                                        double lossl, int mf, int last,
                                                        double* __restrict__ partial) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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

// Block x takes groups [x·kNeumfTopGroups, …), warp v of them v, v + 8, …; each
// lane sums its columns' terms over its warp's rows (in double, row order), then
// the block adds its warps' sums in warp order (dc and the loss also over lanes,
// in lane order) into partial[x, ·] (neumf_top_partial_cols columns).
// J: columns per lane of each part (mf and last ≤ 32·J); R: rows in flight per warp;
// kMinBlocks: blocks per SM that __launch_bounds__ asks ptxas to fit (its register cap).
// On an H200 the BF16 J = 2 kernel (110 registers, 8 rows) ran 2 blocks per SM at 25%
// occupancy and 44% of HBM peak, 41% of its warps' cycles between instructions spent
// waiting on L1TEX (the GPU kit's step_ncu_top stage, 2026-11-27); with 4 rows
// it fits 78 registers without a spill (sm_90, ptxas -v) and 3 blocks
// (the kernel at 2 blocks per SM, 8 rows, lost to it: the GPU kit's step_*_2blocks stages at
// ddeff27). R changes only how many rows' loads are issued before their adds, not the order of any
// sum: every R gives the same bits.
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

  top_backward_block_sums<J>(sh, dwg, dwa, dbs, dcl, lossl, mf, last, partial);
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
        launch(neumf_top_backward_kernel<2, TA, 4, 3>);
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

}  // namespace ncf::cuda
