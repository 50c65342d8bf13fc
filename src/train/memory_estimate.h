// The memory guard's arithmetic for one rank: its tables, exchange buffers, step
// and eval buffers and, on a GPU, what the CUDA path allocates besides them: the
// scratch arena at its largest (CudaResources::scratch, common/cuda_context.h) and
// the fixed costs of a CUDA context (the context itself, cuBLAS's and cuBLASLt's
// workspaces). Everything here is a function of the flags, the dataset's sizes and
// the plan, never of a live GPU, so the bounds can be checked on a CPU against
// hand-worked numbers. The Trainer compares the total with the rank's limit.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cuda_sizes.h"
#include "common/device.h"
#include "data/dataset.h"
#include "embedding/plan.h"
#include "train/config.h"

namespace ncf {

// ---- fixed costs of a CUDA rank ------------------------------------------------
// Allowances, not measurements. The context (module images loaded lazily, device
// heap, stacks): a few hundred MiB on a Hopper GPU; 512 MiB is taken. cuBLAS's
// workspace and cuBLASLt's are the 32 MiB each that make_cuda_context allocates
// (cuda::kCublasWorkspaceBytes, set on the cuBLAS handle; cuda::kLtWorkspaceBytes).
// The free memory the guard compares with is read after this rank's context and
// both workspaces exist, so on a GPU of its own the guard errs by up to these
// 576 MiB on the safe side; ranks sharing a GPU, and a --memory_limit_gb, need them
// counted.
constexpr int64_t kCudaContextBytes = int64_t{512} << 20;
constexpr int64_t kCublasWorkspaceBytes = int64_t(cuda::kCublasWorkspaceBytes);
constexpr int64_t kCublasLtWorkspaceBytes = int64_t(cuda::kLtWorkspaceBytes);
inline int64_t cuda_fixed_bytes() {
  return kCudaContextBytes + kCublasWorkspaceBytes + kCublasLtWorkspaceBytes;
}

// ---- CUB temporary storage, upper bounds (CUB 3.x, CUDA 13) ----------------------
// DeviceRadixSort::SortPairs, n pairs: the alternate key and value buffers
// n·(K + V), the one-sweep look-back (256 counters of 4 bytes per tile of at least
// 4096 items: n/4), and the digit histograms, counters and alignment (256 KiB
// covers them for any n below 2^31).
int64_t cub_sort_pairs_bytes(int64_t n, int key_bytes, int value_bytes);
// DeviceScan and DeviceRunLengthEncode over n items: one tile state of at most 24
// bytes per tile of at least 128 items (n/4 is above it), plus padding and alignment.
int64_t cub_scan_bytes(int64_t n);
// DeviceSegmentedRadixSort::SortKeys over n keys: the alternate key buffer.
int64_t cub_segmented_sort_keys_bytes(int64_t n, int key_bytes);

// ---- the scratch arena -------------------------------------------------------------
// The largest carve of one CUDA op is the arena's peak need; the arena grows to
// max(need, 1.5 × its size), so it never exceeds 1.5 × that peak.

// sort_runs (embedding/table_ops.cu: sort_reduce_rows and the fused update) over
// n ids of width D: sorted ids, positions, run lengths and starts, sub-run counts
// and starts, the sub-run partial sums ((2n/kSubRun + 1) × D floats), the CUB
// temporary, the unique ids when the op owns them, and the fused dense Adam's
// [map_rows] row map.
int64_t sort_runs_scratch_bytes(int64_t n, int D, bool own_unique, int64_t map_rows);

// What a rank's CUDA ops are given, at most.
struct ScratchShapes {
  int W = 1;
  int D = 0;   // table width (mf + layers[0]/2)
  int mf = 0;  // GMF factors
  std::vector<int> layers;
  bool dedup = false;
  bool bf16 = false;        // --precision bf16: the GEMMs copy their operands
  bool dense_adam = false;  // the fused update carves a row map of the rank's rows
  bool train = true;        // false: evaluation and serving only
  // Per plan table: routed (exchanged) or not, rows of its largest replicated
  // copy, and ids received per step by this rank as owner (balanced row-wise:
  // its own count; table-wise: every rank's, on the owner).
  std::vector<bool> routed;
  std::vector<int64_t> replicated_rows;  // 0 unless replicated at W > 1
  int64_t routed_rows = 0;               // rows this rank holds of the routed tables (W = 1: all)
  std::vector<int64_t> train_lookups;    // ids per table per step (user n, item n·S)
  std::vector<int64_t> train_received;   // ids this rank receives per table as owner
  int64_t positives = 0;                 // n: the step's users (groups of S samples)
  int S = 1;
  std::vector<int64_t> eval_lookups;  // per eval batch (U users, U·L items)
  int64_t eval_users = 0;             // U
  int64_t eval_list = 1;              // L = 1 + E
  int64_t score_users = 0;            // full ranking / serving: users scored against ...
  int64_t score_items = 0;            // ... every item at once (0: no such scoring)
  bool top_k = false;                 // serving: top_k over those scores
  int64_t pairs = 0;                  // serving: (user, item) pairs scored per round
};

// The shapes of a job: flags, dataset sizes, the plan, and this rank.
ScratchShapes scratch_shapes(const TrainConfig& cfg, const DatasetMeta& meta,
                             const EmbeddingPlan& plan, int rank);
// The largest single carve over every op of a step, an evaluation and serving.
int64_t cuda_scratch_peak_bytes(const ScratchShapes& s);
// What the arena can grow to: 1.5 × the peak.
inline int64_t cuda_scratch_arena_bytes(int64_t peak) { return peak + (peak + 1) / 2; }

// ---- one rank's estimate -----------------------------------------------------------
struct MemoryEstimate {
  std::vector<int64_t> tables;  // per plan table: rows and optimizer state (rows only: rows)
  int64_t exchange = 0;         // the collection's grow-only exchange buffers
  int64_t step = 0;             // the tower's step buffers and the eval buffers
  int64_t samples = 0;          // training samples of one step on this rank
  int64_t scratch = 0;          // CUDA: the scratch arena at most (0 on the host)
  int64_t workspaces = 0;       // CUDA: context and cuBLAS/cuBLASLt workspaces (0 on the host)
  int64_t total() const;
};

// Evaluation by items (Trainer::eval_by_items) keeps, per item, its GMF columns
// and its layer-0 product: I × (mf + out0) floats, for the rest of the run. It is
// taken where that is no more than the items' MLP rows an eval batch of `batch`
// candidates would otherwise hold (batch × h): an item table, not a user-sized
// one. While the products are made, the table [I × D] and its MLP columns [I × h]
// are there too.
bool eval_items_fit(int64_t items, int mf, int h, int out0, int64_t batch);

// The evaluation's lists a GPU rank keeps on its device from the second evaluation on
// (Trainer's lists cache): its users (4 bytes), candidates (4 bytes each) and duplicate
// masks (1 byte each) over `users` users of `list` entries, where that is at most
// kEvalListsCacheMaxBytes; 0 where it is more (the lists are then read for every
// evaluation).
constexpr int64_t kEvalListsCacheMaxBytes = int64_t{2} << 30;
int64_t eval_lists_cache_bytes(int64_t users, int64_t list);

// cfg.eval_only: rows only (no optimizer state), no training buffers.
MemoryEstimate estimate_rank_memory(const TrainConfig& cfg, const DatasetMeta& meta,
                                    const EmbeddingPlan& plan, int rank, Device device);

}  // namespace ncf
