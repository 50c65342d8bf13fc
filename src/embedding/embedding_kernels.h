// The device-side pieces of the sharded lookup's exchange (embedding.h):
// de-duplicate ids, bucketize them by owner, and move rows between batch
// order, unique order and owner order. Each op has a CPU version
// (embedding_kernels.cc) and a CUDA twin (embedding_kernels.cu) with the same
// name and arguments; both produce exactly the same output (every order is
// defined: stable sorts, no ties left open). Arrays live on ctx.device unless
// marked host.
//
// How they compose in a lookup (n batch ids, nu unique, D width):
//   unique_ids(ids → unique[nu], inverse[n])
//   bucketize_by_owner(unique → perm[nu], local[nu], counts[W])   exchange ids …
//   … owners gather rows, rows come back in owner order as recv[nu×D]
//   unpermute_rows(recv, perm → rows_unique[nu×D])     rows_unique[perm[k]] = recv[k]
//   permute_rows(rows_unique, inverse → out[n×D])       out[k] = rows_unique[inverse[k]]
// and backward the reverse: sum batch gradients per unique id (sort_reduce_rows
// with the inverse as ids), then permute_rows(·, perm) into owner order.
//
// Letters: n ids, D row width, W world size.
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

// Who owns id x: row-wise, rank x mod W holds it as local row x div W; single
// owner (table-wise), rank `owner` holds every row as local row x.
struct OwnerRule {
  bool row_wise = true;
  int W = 1;      // world size
  int owner = 0;  // the owner when !row_wise
  static OwnerRule rows(int W) { return OwnerRule{true, W, 0}; }
  static OwnerRule single(int W, int owner) { return OwnerRule{false, W, owner}; }
};

// A stable bucketing of ids[n] (all >= 0) by owner: position pos of the owner
// order holds out_perm[pos] = the input index and out_local_ids[pos] = its local
// row; owners appear in rank order, equal owners keep input order.
// counts[W] (HOST array) receives the ids per owner. Synchronizes on CUDA (the
// counts come back to the host).
void bucketize_by_owner(const ExecContext& ctx, const int32_t* ids, int64_t n,
                        const OwnerRule& rule, int64_t* out_perm, int32_t* out_local_ids,
                        int64_t* counts);

// The distinct ids of ids[n], ascending, in out_unique[*n_unique] (room for n),
// and out_inverse[k] = the index of ids[k] in out_unique. *n_unique is a host
// value; synchronizes on CUDA.
void unique_ids(const ExecContext& ctx, const int32_t* ids, int64_t n, int32_t* out_unique,
                int64_t* out_inverse, int64_t* n_unique);

// out[k, :] = src[idx[k], :] for k < n (a row gather: idx may repeat); every
// idx[k] must lie in [0, n_src). src is [n_src×D], out [n×D].
void permute_rows(const ExecContext& ctx, const float* src, int64_t n_src, const int64_t* idx,
                  float* out, int64_t n, int D);

// out[perm[k], :] = src[k, :] for k < n, the inverse of permute_rows with the
// same perm; perm must be a permutation of [0, n) (checked).
void unpermute_rows(const ExecContext& ctx, const float* src, const int64_t* perm, float* out,
                    int64_t n, int D);

// The dense gradient of a replicated table, to be allreduced: dense[N×(D+1)]
// is zeroed, then for k < n row rows[k] gets grads[k, :] in its first D columns
// and a touch count of 1 in column D. rows must be strictly increasing in
// [0, N) (sort_reduce_rows gives that; checked).
void scatter_rows_dense(const ExecContext& ctx, const int32_t* rows, const float* grads, int64_t n,
                        int D, int64_t N, float* dense);

// After the allreduce: the rows of dense[N×(D+1)] with a non-zero touch count,
// ascending, in out_rows[*n_out], and their first D columns in
// out_grads[*n_out×D] (room for N rows each). *n_out is a host value;
// synchronizes on CUDA.
void compact_touched_rows(const ExecContext& ctx, const float* dense, int64_t N, int D,
                          int32_t* out_rows, float* out_grads, int64_t* n_out);

#ifdef NCF_WITH_CUDA
// The CUDA twins (embedding_kernels.cu); called through the dispatch only.
namespace cuda {
void bucketize_by_owner(const ExecContext& ctx, const int32_t* ids, int64_t n,
                        const OwnerRule& rule, int64_t* out_perm, int32_t* out_local_ids,
                        int64_t* counts);
void unique_ids(const ExecContext& ctx, const int32_t* ids, int64_t n, int32_t* out_unique,
                int64_t* out_inverse, int64_t* n_unique);
void permute_rows(const ExecContext& ctx, const float* src, int64_t n_src, const int64_t* idx,
                  float* out, int64_t n, int D);
void unpermute_rows(const ExecContext& ctx, const float* src, const int64_t* perm, float* out,
                    int64_t n, int D);
void scatter_rows_dense(const ExecContext& ctx, const int32_t* rows, const float* grads, int64_t n,
                        int D, int64_t N, float* dense);
void compact_touched_rows(const ExecContext& ctx, const float* dense, int64_t N, int D,
                          int32_t* out_rows, float* out_grads, int64_t* n_out);
}  // namespace cuda
#endif

}  // namespace ncf
