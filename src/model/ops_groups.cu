// CUDA twins of layer 0's group ops in ops_groups.h (same names and arguments; the CPU
// functions check the arguments and forward here when ctx.device is kCuda): the streaming
// group kernels, the BF16 epilogue (launch_bias_act_bf16, which linear_forward_bf16
// shares) and gather_bias_act. Everything runs on ctx.stream.

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "model/ops_internal.cuh"

namespace ncf::cuda {

namespace {

// ---- groups (repeat_rows, group_bias_act, group_sum_backward) ------------------------

__global__ void repeat_rows_kernel(const float* X, int64_t ldx, int w, float* Y, int64_t n, int S) {
  for (int64_t i = thread_first(); i < n * S * w; i += thread_stride()) {
    const int64_t b = i / w, k = i % w;
    Y[i] = X[(b / S) * ldx + k];
  }
}

struct GroupRowsOp {  // column sums of dYg
  const float* dYg;
  int64_t lddyg;
  __device__ double operator()(int64_t p, int c) const { return dYg[p * lddyg + c]; }
};

// ---- streaming kernels ------------------------------------------------------------------
// The group sum these replaced (bench/kernels/group_sum.cu, which times it beside
// them) masked in place inside its sums' loop: a load, a conditional store into the
// lines the warp is reading, the next load, with no __restrict__, so each thread had
// one load in flight and a warp waited on a chain of round trips (such chains reach
// 5-8% of HBM bandwidth). These issue every load of a row group before any store,
// store the masked values in full (the unmasked lanes rewrite what they read, bit for
// bit), and sum in the same order in double: the same results as the replaced
// kernels, bit for bit.

constexpr int kGroupRowsInFlight = 8;  // rows of a group loaded before the first store

// One thread per (group p, L columns from j): the group's rows are taken
// kGroupRowsInFlight at a time, all their loads first; the masked rows are
// stored whole (kRelu), and each column's sum runs in s order in double, as the
// CPU twin's. A warp covers 32·L consecutive columns of one row.
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

// group_bias_act as a streaming kernel: one thread per (group p, L columns from j)
// loads the group's row of Yg and the bias once, then its S rows of Y
// kGroupRowsInFlight at a time (all loads first), and stores each row whole:
// Y = act((Y + Yg) + bias) with the CPU twin's two round-to-nearest adds (the bias 0
// when there is none), so the same bits. One division per thread and S·L elements,
// where the kernel it replaced (bench/kernels/group_bias_act.cu) did two per element.
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
// 63% of HBM peak, the GPU kit's step_ncu_bf16 stage, 2026-11-27), and fits 80
// without a spill for 3 (sm_90, ptxas -v), faster at 3 (the GPU kit's step_*_2blocks stages at
// ddeff27).
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
    if constexpr (L == 8) kernel = group_sum_bf16_kernel<L, true, true, 3>;
    kernel<<<grid, kThreads, 0, stream>>>(nullptr, dY, n, S, out, dYg, lddyg, mask,
                                          relu_mask_words(out));
  } else if (relu) {
    group_sum_bf16_kernel<L, true><<<grid, kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg);
  } else {
    group_sum_bf16_kernel<L, false><<<grid, kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg);
  }
}

}  // namespace

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
  if (out % 4 == 0 && aligned16(Y) && aligned16(Yg)) {
    mask_done = out % 128 == 0;
    launch_group_bias_act_stream<4>(stream, Y, Yg, bias, n, S, out, relu,
                                    mask_done ? mask : nullptr);
  } else {
    launch_group_bias_act_stream<1>(stream, Y, Yg, bias, n, S, out, relu);
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
  if (n > 0) {
    const bool vec = out % 4 == 0 && aligned16(dY) && (!relu || mask || aligned16(Y));
    if (vec) {
      launch_group_sum_stream<4>(stream, Y, dY, n, S, out, dYg, lddyg, relu,
                                 aligned16(dYg) && lddyg % 4 == 0, mask);
    } else {
      launch_group_sum_stream<1>(stream, Y, dY, n, S, out, dYg, lddyg, relu, false, mask);
    }
    check_launch(op);
  }
  if (db) group_bias_grad(ctx, stream, dYg, lddyg, n, out, db, op);
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
