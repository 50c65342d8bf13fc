// The device-side pieces of the collection's exchange (collection.h): the key
// layout of all tables, ids into keys, de-duplicate keys, bucketize them by
// owner, and move rows between batch order, unique order and owner order. Each op has a CPU version
// (embedding_kernels.cc) and a CUDA twin (embedding_kernels.cu) with the same
// name and arguments; both produce exactly the same output (every order is
// defined: stable sorts, no ties left open). Arrays live on ctx.device unless
// marked host.
//
// How they compose in a lookup (n batch ids, nu unique, D width):
//   ids_to_keys(each table's ids → keys[n], all tables in one array)
//   unique_ids(keys → unique[nu], inverse[n])
//   bucketize_by_owner(unique → perm[nu], rows[nu], counts[W])   exchange rows …
//   … owners gather rows, rows come back in owner order as recv[nu×D]
//   unpermute_rows(recv, perm → rows_unique[nu×D])     rows_unique[perm[k]] = recv[k]
//   permute_rows(rows_unique, inverse → out[n×D])       out[k] = rows_unique[inverse[k]]
// and backward the reverse: sum batch gradients per unique key (sort_reduce_rows
// with the keys), then permute_rows(·, perm) into owner order.
//
// Letters: n ids, D row width, W world size.
#pragma once

#include <cstdint>

#include "common/device.h"
#include "common/philox.h"  // NCF_HD

namespace ncf {

// How a table is spread over the ranks (embedding/plan.h chooses):
//   row-wise    rank id mod W holds id as its row id div W;
//   table-wise  rank `owner` holds every row;
//   replicated  every rank holds every row (never routed).
enum class Placement : int8_t { kRowWise, kTableWise, kReplicated };

constexpr int kMaxTables = 8;

// Where every row of every table lives. Keys number the rows of all T tables
// in one range: table t's id x is key key_begin[t] + x. Each rank keeps the
// rows it holds in one flat array: table 0's rows, then table 1's, and so on,
// so a row has one flat row index on the rank that holds it. A plain struct,
// passed by value to kernels.
struct KeyLayout {
  int W = 1;  // world size
  int T = 0;  // tables
  int64_t key_begin[kMaxTables + 1] = {};
  Placement placement[kMaxTables] = {};
  int owner[kMaxTables] = {};  // table-wise: the rank holding the table

  NCF_HD int64_t num_keys() const { return key_begin[T]; }
  NCF_HD int64_t num_rows(int t) const { return key_begin[t + 1] - key_begin[t]; }
  // Rows of table t that rank p holds.
  NCF_HD int64_t rows_on(int t, int p) const {
    const int64_t N = num_rows(t);
    switch (placement[t]) {
      case Placement::kRowWise:
        return N > p ? (N - p + W - 1) / W : 0;
      case Placement::kTableWise:
        return p == owner[t] ? N : 0;
      case Placement::kReplicated:
        return N;
    }
    return 0;
  }
  // The first flat row of table t on rank p, and the flat rows rank p holds.
  NCF_HD int64_t begin_on(int t, int p) const {
    int64_t b = 0;
    for (int u = 0; u < t; ++u) b += rows_on(u, p);
    return b;
  }
  NCF_HD int64_t total_rows_on(int p) const { return begin_on(T, p); }
  // The table of a key in [0, num_keys()).
  NCF_HD int table_of(int64_t key) const {
    int t = 0;
    while (t + 1 < T && key >= key_begin[t + 1]) ++t;
    return t;
  }
  // The rank holding a key of a routed (row- or table-wise) table, and the
  // key's flat row there.
  NCF_HD void route(int64_t key, int* to, int32_t* row) const {
    const int t = table_of(key);
    const int64_t x = key - key_begin[t];
    const int p = placement[t] == Placement::kRowWise ? static_cast<int>(x % W) : owner[t];
    *to = p;
    *row = static_cast<int32_t>(begin_on(t, p) + (placement[t] == Placement::kRowWise ? x / W : x));
  }
  // The global id of flat row k on rank p, and its table (*t).
  NCF_HD int64_t id_of_row(int64_t k, int p, int* t) const {
    int u = 0;
    while (u + 1 < T && k >= begin_on(u + 1, p)) ++u;
    *t = u;
    const int64_t j = k - begin_on(u, p);
    return placement[u] == Placement::kRowWise ? j * W + p : j;
  }
};

// keys[k] = ids[k] + offset for k < n, each id checked to lie in [0, bound)
// (the message names the position and the id): one table's ids as keys.
void ids_to_keys(const ExecContext& ctx, const int32_t* ids, int64_t n, int64_t offset,
                 int64_t bound, int32_t* keys);

// A stable bucketing of keys[n] of routed tables by the rank holding them:
// position pos of the owner order holds out_perm[pos] = the input index and
// out_rows[pos] = the key's flat row on its owner; owners appear in rank
// order, equal owners keep input order. counts[W] (HOST array) receives the
// keys per owner. Keys outside [0, num_keys()) or of a replicated table are an
// error. Synchronizes on CUDA (the counts come back to the host).
void bucketize_by_owner(const ExecContext& ctx, const int32_t* keys, int64_t n,
                        const KeyLayout& layout, int64_t* out_perm, int32_t* out_rows,
                        int64_t* counts);

// The distinct ids of ids[n], ascending, in out_unique[*n_unique] (room for n),
// and out_inverse[k] = the index of ids[k] in out_unique. *n_unique is a host
// value; synchronizes on CUDA. With bound > 0 every id must lie in [0, bound)
// (checked), and the CUDA sort reads only the bits below bound.
void unique_ids(const ExecContext& ctx, const int32_t* ids, int64_t n, int32_t* out_unique,
                int64_t* out_inverse, int64_t* n_unique, int64_t bound = 0);

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

// BF16 payloads (--exchange_dtype bf16; common/bf16.h's conversions, so both
// devices give the same bits): the sender packs, the receiver widens, and a
// rank that keeps rows for itself rounds them in place, so W = 1 computes what
// a larger W does.
// out[k] = src[k] rounded to the nearest BF16 (ties to even), as bits, k < n.
void pack_bf16(const ExecContext& ctx, const float* src, uint16_t* out, int64_t n);
// out[k] = the float of bits src[k] (exact), k < n.
void unpack_bf16(const ExecContext& ctx, const uint16_t* src, float* out, int64_t n);
// x[k] = x[k] rounded to the nearest BF16, in place, k < n.
void round_bf16(const ExecContext& ctx, float* x, int64_t n);

#ifdef NCF_WITH_CUDA
// The CUDA twins (embedding_kernels.cu); called through the dispatch only.
namespace cuda {
void ids_to_keys(const ExecContext& ctx, const int32_t* ids, int64_t n, int64_t offset,
                 int64_t bound, int32_t* keys);
void bucketize_by_owner(const ExecContext& ctx, const int32_t* keys, int64_t n,
                        const KeyLayout& layout, int64_t* out_perm, int32_t* out_rows,
                        int64_t* counts);
void unique_ids(const ExecContext& ctx, const int32_t* ids, int64_t n, int32_t* out_unique,
                int64_t* out_inverse, int64_t* n_unique, int64_t bound);
void permute_rows(const ExecContext& ctx, const float* src, int64_t n_src, const int64_t* idx,
                  float* out, int64_t n, int D);
void unpermute_rows(const ExecContext& ctx, const float* src, const int64_t* perm, float* out,
                    int64_t n, int D);
void scatter_rows_dense(const ExecContext& ctx, const int32_t* rows, const float* grads, int64_t n,
                        int D, int64_t N, float* dense);
void compact_touched_rows(const ExecContext& ctx, const float* dense, int64_t N, int D,
                          int32_t* out_rows, float* out_grads, int64_t* n_out);
void pack_bf16(const ExecContext& ctx, const float* src, uint16_t* out, int64_t n);
void unpack_bf16(const ExecContext& ctx, const uint16_t* src, float* out, int64_t n);
void round_bf16(const ExecContext& ctx, float* x, int64_t n);
}  // namespace cuda
#endif

}  // namespace ncf
