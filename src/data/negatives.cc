// CPU implementation of online negative sampling (see negatives.h), the
// DevicePositiveLists uploads, and the dispatch to the CUDA twin.
#include "data/negatives.h"

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"

namespace ncf {
namespace {

void check_sampling(int64_t n, int num_neg, const int32_t* users, const int32_t* items,
                    const int32_t* out_users, const int32_t* out_items, const float* out_labels) {
  NCF_CHECK(n >= 0, "sample_negatives: negative count n=", n);
  NCF_CHECK(num_neg >= 0, "sample_negatives: num_neg=", num_neg, " must be >= 0");
  NCF_CHECK(n == 0 || (users && items && out_users && out_items && out_labels),
            "sample_negatives: an input or output array is null with n=", n);
}

// The CPU loop over host CSR arrays offsets[U+1], pos_items[nnz].
void sample_cpu(const ExecContext& ctx, const int64_t* offsets, const int32_t* pos_items,
                uint64_t num_users, uint64_t num_items, const int32_t* users, const int32_t* items,
                int64_t slice_begin, int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                int32_t* out_users, int32_t* out_items, float* out_labels) {
  const int64_t S = 1 + num_neg;
  parallel_for(ctx.threads, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      // Two positives ahead: their users' list bounds, then (once those are in cache)
      // the first probes of the search in the list; the users come in stream order, so
      // each list is a cache miss otherwise.
      if (k + 8 < end) __builtin_prefetch(offsets + users[k + 8]);
      if (k + 4 < end) {
        const int32_t v = users[k + 4];
        if (v >= 0 && uint64_t(v) < num_users) {
          const int32_t* list = pos_items + offsets[v];
          const int64_t len = offsets[v + 1] - offsets[v];
          // The probes of the search's first four halvings (a list of up to 256 items:
          // every line of it), so that only its last few halvings can miss.
          for (int64_t j = 1; j < 16; ++j) __builtin_prefetch(list + len * j / 16);
        }
      }
      const int32_t u = users[k];
      NCF_CHECK(u >= 0 && uint64_t(u) < num_users, "sample_negatives: users[", k, "]=", u,
                " outside [0, ", num_users, ")");
      const int32_t* pb = pos_items + offsets[u];
      const int64_t count = offsets[u + 1] - offsets[u];
      if (uint64_t(count) >= num_items)
        NCF_FAIL("user ", u, " interacted with all ", num_items, " items: no negative exists");
      const CounterRng rng = negatives_detail::positive_rng(seed, epoch, uint64_t(slice_begin + k));
      int32_t* ou = out_users + k * S;
      int32_t* oi = out_items + k * S;
      float* ol = out_labels + k * S;
      oi[0] = items[k];
      negatives_detail::draw_negatives(rng, pb, count, num_items, num_neg, oi + 1);
      for (int64_t j = 0; j < S; ++j) {
        ou[j] = u;
        ol[j] = j == 0 ? 1.0f : 0.0f;
      }
    }
  });
}

void check_csr(const int64_t* offsets, uint64_t num_users, const char* what) {
  NCF_CHECK(offsets != nullptr, what, ": offsets is null");
  NCF_CHECK(offsets[0] == 0, what, ": offsets[0]=", offsets[0], " must be 0");
  for (uint64_t u = 0; u < num_users; ++u)
    NCF_CHECK(offsets[u + 1] >= offsets[u], what, ": offsets decrease at user ", u, ": ",
              offsets[u], " then ", offsets[u + 1]);
}

}  // namespace

void sample_negatives(const ExecContext& ctx, const PositiveLists& positives, uint64_t num_items,
                      const int32_t* users, const int32_t* items, int64_t slice_begin, int64_t n,
                      int num_neg, uint64_t seed, int64_t epoch, int32_t* out_users,
                      int32_t* out_items, float* out_labels) {
  NCF_CHECK(ctx.device == Device::kCpu,
            "sample_negatives: PositiveLists live in host memory; "
            "on cuda, pass a DevicePositiveLists");
  check_sampling(n, num_neg, users, items, out_users, out_items, out_labels);
  sample_cpu(ctx, positives.offsets(), positives.items(), positives.num_users(), num_items, users,
             items, slice_begin, n, num_neg, seed, epoch, out_users, out_items, out_labels);
}

DevicePositiveLists::DevicePositiveLists(Device device, const int64_t* host_offsets,
                                         const int32_t* host_items, uint64_t users)
    : num_users(users) {
  check_csr(host_offsets, users, "DevicePositiveLists");
  const int64_t nnz = host_offsets[users];
  NCF_CHECK(nnz == 0 || host_items != nullptr, "DevicePositiveLists: items is null with nnz=", nnz);
  offsets = Buffer<int64_t>(device, users + 1);
  items = Buffer<int32_t>(device, size_t(nnz));
  device_copy(device, offsets.data(), Device::kCpu, host_offsets, offsets.bytes());
  device_copy(device, items.data(), Device::kCpu, host_items, items.bytes());
}

DevicePositiveLists::DevicePositiveLists(const PositiveLists& positives, Device device)
    : DevicePositiveLists(device, positives.offsets(), positives.items(), positives.num_users()) {}

void sample_negatives(const ExecContext& ctx, const DevicePositiveLists& positives,
                      uint64_t num_items, const int32_t* users, const int32_t* items,
                      int64_t slice_begin, int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                      int32_t* out_users, int32_t* out_items, float* out_labels) {
  NCF_CHECK(positives.device() == ctx.device, "sample_negatives: the positive lists are on ",
            device_name(positives.device()), ", the context on ", device_name(ctx.device));
  NCF_CHECK(positives.offsets.size() == positives.num_users + 1,
            "sample_negatives: DevicePositiveLists is empty (default-constructed)");
  check_sampling(n, num_neg, users, items, out_users, out_items, out_labels);
  NCF_DISPATCH_CUDA(ctx, sample_negatives, ctx, positives, num_items, users, items, slice_begin, n,
                    num_neg, seed, epoch, out_users, out_items, out_labels);
  sample_cpu(ctx, positives.offsets.data(), positives.items.data(), positives.num_users, num_items,
             users, items, slice_begin, n, num_neg, seed, epoch, out_users, out_items, out_labels);
}

}  // namespace ncf
