// The ops of the host tier (collection.h, --device_table_budget): rows copied between the
// home arrays in host memory and the device cache's slots, the map from a rank's flat rows
// to their slots, and BF16 rows rounded back into their slots. CPU code in tier_ops.cc,
// CUDA twins (same names and arguments) in tier_ops.cu. On a GPU the home arrays are host
// memory registered with the device (common/cuda_context.h HostRegistration), which these
// kernels read and write directly.
#pragma once

#include <cstdint>

#include "common/device.h"
#include "embedding/table_ops.h"  // RowId, RowRounding

namespace ncf {

// dst row dst_rows[k] = src row src_rows[k] for k < n (null: row k), rows of `width`
// elements of elem_bytes (2 or 4) each; src_rows in [0, src_R) and dst_rows in [0, dst_R)
// (checked), dst_rows distinct (not checked).
void copy_rows(const ExecContext& ctx, const void* src, const RowId* src_rows, int64_t src_R,
               void* dst, const RowId* dst_rows, int64_t dst_R, int64_t n, int width,
               int elem_bytes);

// out[k] = map[rows[k]] for k < n, rows in [0, R): the cache slot of each flat row. A row
// whose map entry is negative (not in the cache) fails, naming its position and row.
void map_rows(const ExecContext& ctx, const int32_t* map, const RowId* rows, int64_t R, int64_t n,
              int32_t* out);

// map[rows[k]] = values[k] (values null: `fill`) for k < n; rows in [0, R), distinct.
void assign_map(const ExecContext& ctx, int32_t* map, const RowId* rows, const int32_t* values,
                int32_t fill, int64_t n, int64_t R);

// dst[slots[k], d] = src[k, d] rounded stochastically to BF16 with key.draw(key_rows[k], d,
// D): store_rows_bf16's values (the same key per flat row), stored in cache slots.
void store_rows_bf16_at(const ExecContext& ctx, const float* src, const RowId* key_rows,
                        const RowId* slots, uint16_t* dst, int64_t C, int64_t n, int D,
                        const RowRounding& key);

namespace cuda {
void copy_rows(const ExecContext& ctx, const void* src, const RowId* src_rows, int64_t src_R,
               void* dst, const RowId* dst_rows, int64_t dst_R, int64_t n, int width,
               int elem_bytes);
void map_rows(const ExecContext& ctx, const int32_t* map, const RowId* rows, int64_t R, int64_t n,
              int32_t* out);
void assign_map(const ExecContext& ctx, int32_t* map, const RowId* rows, const int32_t* values,
                int32_t fill, int64_t n, int64_t R);
void store_rows_bf16_at(const ExecContext& ctx, const float* src, const RowId* key_rows,
                        const RowId* slots, uint16_t* dst, int64_t C, int64_t n, int D,
                        const RowRounding& key);
}  // namespace cuda

}  // namespace ncf
