// Online negative sampling (docs/design.md, step 2): each positive (u, i) at
// stream position p of epoch e gets num_neg items drawn uniformly from the items
// u never interacted with. Draws come from CounterRng keyed by (seed, epoch, p),
// so a sample does not depend on the rank count, the rank, the thread count or
// the device: the CUDA path draws the same items as the CPU, bit for bit.
#pragma once

#include <cstdint>

#include "common/device.h"
#include "common/philox.h"
#include "data/dataset.h"

// Loops over K lanes unrolled in device code (their arrays stay in registers).
#ifdef __CUDA_ARCH__
#define NCF_NEGATIVES_UNROLL _Pragma("unroll")
#else
#define NCF_NEGATIVES_UNROLL
#endif

namespace ncf {

// The per-positive draw, shared by the CPU loop and the CUDA kernel (one
// formula, so both devices draw the same items).
namespace negatives_detail {

// The draw stream of the positive at stream position p of epoch `epoch`.
NCF_HD CounterRng positive_rng(uint64_t seed, int64_t epoch, uint64_t p) {
  return CounterRng{seed, kStreamTrainNegatives, (static_cast<uint64_t>(epoch) << 40) | p};
}

NCF_HD bool sorted_contains(const int32_t* a, int64_t n, int32_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && a[lo] == x;
}

// out[0..num_neg) = items drawn uniformly from [0, num_items) minus the
// user's sorted positives pos[0..count) (rejection; count < num_items).
NCF_HD void draw_negatives(const CounterRng& rng, const int32_t* pos, int64_t count,
                           uint64_t num_items, int num_neg, int32_t* out) {
  // Draw d is rng.below(d, num_items); each Philox block serves two draws.
  uint64_t d = 0;
  Philox4 b = rng.block(0);
  for (int j = 0; j < num_neg; ++j) {
    int32_t c;
    do {
      if (d > 0 && (d & 1) == 0) b = rng.block(static_cast<uint32_t>(d >> 1));
      c = static_cast<int32_t>(CounterRng::scale(CounterRng::half(b, d), num_items));
      ++d;
    } while (sorted_contains(pos, count, c));
    out[j] = c;
  }
}

// The same draws as draw_negatives, K at a time: the round takes the next m = min(K, still
// wanted) draws of the stream, searches pos for all m in lock step (every search of a
// list of `count` runs the same number of halvings, so the m probes of a halving are
// independent loads in flight together) and keeps the free ones in draw order, up to the
// count still wanted; a round with a draw taken runs again. The draws kept are the first
// num_neg free draws of the stream, as in draw_negatives: the same items in the same order.
// On a GPU one thread's num_neg searches are one chain of dependent loads either way; here
// the chain is one search long (two when a draw is taken) instead of num_neg.
template <int K>
NCF_HD void draw_negatives_ahead(const CounterRng& rng, const int32_t* pos, int64_t count,
                                 uint64_t num_items, int num_neg, int32_t* out) {
  uint64_t d = 0;
  int j = 0;
  while (j < num_neg) {
    const int m = num_neg - j < K ? num_neg - j : K;
    int32_t c[K];
    int64_t base[K];
    NCF_NEGATIVES_UNROLL
    for (int i = 0; i < K; ++i) {
      base[i] = 0;
      c[i] = 0;
      if (i < m) {
        const uint64_t di = d + static_cast<uint64_t>(i);
        c[i] = static_cast<int32_t>(CounterRng::scale(
            CounterRng::half(rng.block(static_cast<uint32_t>(di >> 1)), di), num_items));
      }
    }
    // pos's lower bound for c[i] lies in [base[i], base[i] + len]; len halves each round.
    for (int64_t len = count; len > 1;) {
      const int64_t half = len / 2;
      NCF_NEGATIVES_UNROLL
      for (int i = 0; i < K; ++i)
        if (i < m && pos[base[i] + half] < c[i]) base[i] += half;
      len -= half;
    }
    NCF_NEGATIVES_UNROLL
    for (int i = 0; i < K; ++i) {
      if (i < m && j < num_neg) {
        // The lower bound is base or base + 1: c is taken where either holds it.
        const bool taken =
            count > 0 && (pos[base[i]] == c[i] ||
                          (pos[base[i]] < c[i] && base[i] + 1 < count && pos[base[i] + 1] == c[i]));
        if (!taken) out[j++] = c[i];
      }
    }
    d += static_cast<uint64_t>(m);
  }
}

}  // namespace negatives_detail

// For k < n: out_items[k·(1+num_neg)] = items[k] with label 1, followed by
// num_neg negatives with label 0; out_users repeats users[k]. positions[k] is
// the positive's stream position (slice_begin + k for a TrainBatch).
// CPU only (the lists are host memory); the overload below serves both devices.
void sample_negatives(const ExecContext& ctx, const PositiveLists& positives, uint64_t num_items,
                      const int32_t* users, const int32_t* items, int64_t slice_begin, int64_t n,
                      int num_neg, uint64_t seed, int64_t epoch, int32_t* out_users,
                      int32_t* out_items, float* out_labels);

// A copy of the per-user positive lists (CSR) on one device, made once per run:
// offsets[U+1] (int64) and items[nnz] (int32, each user's items ascending).
struct DevicePositiveLists {
  Buffer<int64_t> offsets;  // [U+1]
  Buffer<int32_t> items;    // [nnz]
  uint64_t num_users = 0;   // U

  DevicePositiveLists() = default;
  DevicePositiveLists(const PositiveLists& positives, Device device);
  // From host CSR arrays (checked: offsets start at 0, never decrease, end at nnz).
  DevicePositiveLists(Device device, const int64_t* offsets, const int32_t* items,
                      uint64_t num_users);
  Device device() const { return offsets.device(); }
};

// The same sampling on lists held on ctx.device (all arrays on ctx.device).
// On CUDA, a user outside [0, U) or one with no free item cannot throw from the
// kernel: its rows get item -1 and the device error record is raised at the
// next synchronizing op (common/cuda_context.h).
void sample_negatives(const ExecContext& ctx, const DevicePositiveLists& positives,
                      uint64_t num_items, const int32_t* users, const int32_t* items,
                      int64_t slice_begin, int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                      int32_t* out_users, int32_t* out_items, float* out_labels);

// The CUDA kernel draws its positive's negatives through draw_negatives_ahead, the CPU
// loop one draw at a time (draw_negatives): the same items.

#ifdef NCF_WITH_CUDA
// The CUDA twin (negatives.cu); called through the dispatch in negatives.cc only.
namespace cuda {
void sample_negatives(const ExecContext& ctx, const DevicePositiveLists& positives,
                      uint64_t num_items, const int32_t* users, const int32_t* items,
                      int64_t slice_begin, int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                      int32_t* out_users, int32_t* out_items, float* out_labels);
}  // namespace cuda
#endif

}  // namespace ncf
