// The host tier's ops on CPU ranks (and the checks of both twins): see tier_ops.h.
#include "embedding/tier_ops.h"

#include <algorithm>
#include <cstring>

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"

namespace ncf {

namespace {

constexpr int64_t kGrain = 1 << 10;  // rows per chunk, at least

void check_rows(const char* op, const char* what, const RowId* rows, int64_t R, int64_t n) {
  if (!rows) {
    NCF_CHECK(n <= R, op, ": ", n, " rows ", what, " a table of ", R);
    return;
  }
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(rows[k] >= 0 && rows[k] < R, op, ": ", what, " rows[", k, "]=", rows[k],
              " outside [0, ", R, ")");
}

}  // namespace

void copy_rows(const ExecContext& ctx, const void* src, const RowId* src_rows, int64_t src_R,
               void* dst, const RowId* dst_rows, int64_t dst_R, int64_t n, int width,
               int elem_bytes) {
  const char* op = "copy_rows";
  NCF_CHECK(n >= 0 && width >= 1 && (elem_bytes == 2 || elem_bytes == 4), op, ": n=", n,
            " width=", width, " elem_bytes=", elem_bytes);
  if (n == 0) return;
  NCF_CHECK(src && dst, op, ": src or dst is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, copy_rows, ctx, src, src_rows, src_R, dst, dst_rows, dst_R, n, width,
                    elem_bytes);
  check_rows(op, "from", src_rows, src_R, n);
  check_rows(op, "into", dst_rows, dst_R, n);
  const size_t row_bytes = size_t(width) * size_t(elem_bytes);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  parallel_for(ctx.threads, n, kGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t from = src_rows ? src_rows[k] : k, to = dst_rows ? dst_rows[k] : k;
      std::memcpy(d + size_t(to) * row_bytes, s + size_t(from) * row_bytes, row_bytes);
    }
  });
}

void map_rows(const ExecContext& ctx, const int32_t* map, const RowId* rows, int64_t R, int64_t n,
              int32_t* out) {
  const char* op = "map_rows";
  NCF_CHECK(n >= 0, op, ": n=", n);
  if (n == 0) return;
  NCF_CHECK(map && rows && out, op, ": map, rows or out is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, map_rows, ctx, map, rows, R, n, out);
  if (R <= 0) check_rows(op, "of", rows, R, n);  // no row inside: refused, naming rows[0]
  // One pass without branches; a bad row, if any, is found and named after it.
  bool bad = false;
  for (int64_t k = 0; k < n; ++k) {
    const RowId r = rows[k];
    const bool inside = uint64_t(r) < uint64_t(R);
    const int32_t slot = map[inside ? r : 0];
    out[k] = slot;
    bad |= !inside || slot < 0;
  }
  if (!bad) return;
  check_rows(op, "of", rows, R, n);
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(out[k] >= 0, op, ": rows[", k, "]=", rows[k], " is not in the device cache");
}

void assign_map(const ExecContext& ctx, int32_t* map, const RowId* rows, const int32_t* values,
                int32_t fill, int64_t n, int64_t R) {
  const char* op = "assign_map";
  NCF_CHECK(n >= 0, op, ": n=", n);
  if (n == 0) return;
  NCF_CHECK(map && rows, op, ": map or rows is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, assign_map, ctx, map, rows, values, fill, n, R);
  check_rows(op, "of", rows, R, n);
  for (int64_t k = 0; k < n; ++k) map[rows[k]] = values ? values[k] : fill;
}

void store_rows_bf16_at(const ExecContext& ctx, const float* src, const RowId* key_rows,
                        const RowId* slots, uint16_t* dst, int64_t C, int64_t n, int D,
                        const RowRounding& key) {
  const char* op = "store_rows_bf16_at";
  NCF_CHECK(n >= 0 && D >= 1, op, ": n=", n, " D=", D);
  if (n == 0) return;
  NCF_CHECK(src && key_rows && slots && dst, op, ": an array is null with n=", n);
  NCF_CHECK(key.step >= 0 && uint64_t(key.step + 1) * uint64_t(D) < (uint64_t{1} << 34), op,
            ": step ", key.step, " x width ", D, " passes the rounding stream's 2^34 words");
  NCF_DISPATCH_CUDA(ctx, store_rows_bf16_at, ctx, src, key_rows, slots, dst, C, n, D, key);
  check_rows(op, "into", slots, C, n);
  parallel_for(ctx.threads, n, kGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r = key_rows[k], slot = slots[k];
      for (int d = 0; d < D; ++d)
        dst[slot * D + d] = float_to_bf16_bits_stochastic(src[k * D + d], key.draw(r, d, D));
    }
  });
}

}  // namespace ncf
