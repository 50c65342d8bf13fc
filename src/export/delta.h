// Delta exports for serving: what turns the NumPy export of an older checkpoint
// into the NumPy export of a newer one, and applying it.
//
//   ncf_export --checkpoint NEWER --format npy --output DELTA --since OLDER
//   ncf_export --apply DELTA --base OLD_EXPORT --output NEW_EXPORT
//
// Rows are matched by original id (the checkpoints' copies of their datasets'
// maps), never by dense index: a newer dataset may hold more ids, fewer, or the
// same ids in another order. DELTA holds, for each table T (user, item):
//   T_changed_rows.npy    int64 [C]: the NEWER rows, ascending, whose values the
//                         delta carries: rows whose id OLDER lacks, and rows
//                         whose float32 bits differ from OLDER's row of that id
//   T_changed_values.npy  float32 [C×D]: those rows' values
//   T_base_rows.npy       int64 [N − P]: for NEWER rows P, P+1, …, N−1 the OLDER
//                         row of the same id, or −1 (an id OLDER lacks); rows
//                         below P (manifest: same_prefix) are the same row in
//                         OLDER, so an unchanged prefix costs nothing
// and, copied whole into the new export: the tower's arrays, the id arrays the
// full export has, and export_manifest.json (the new export's manifest.json).
// manifest.json says what base the delta applies to (the OLDER checkpoint's
// step and dataset, and the size and CRC-32C of the base's two table files, the
// only base files the apply reads), the new tables' sizes and CRC-32Cs (the
// apply checks what it wrote), the counts per table, and every file of the
// delta with its size and CRC-32C; it is sealed with its own CRC-32C (the
// checkpoint manifest's scheme).
#pragma once

#include <cstdint>
#include <string>

#include "export/trained_model.h"

namespace ncf {

constexpr const char* kDeltaFormat = "ncf_export npy delta";
constexpr int kDeltaVersion = 1;

// Rows of one table in a delta.
struct TableDeltaCounts {
  int64_t rows = 0;         // N: NEWER's rows
  int64_t base_rows = 0;    // OLDER's rows
  int64_t same_prefix = 0;  // P: NEWER rows [0, P) are OLDER's rows [0, P)
  int64_t changed = 0;      // ids in both whose row differs
  int64_t added = 0;        // ids OLDER lacks
  int64_t dropped = 0;      // OLDER's ids NEWER lacks
};

struct DeltaSummary {
  TableDeltaCounts users, items;
  int64_t delta_bytes = 0;  // every file of the delta, manifest.json included
  int64_t full_bytes = 0;   // every file of NEWER's full NumPy export
};

// Writes the delta from `older` to `newer` into `dir` (through a temporary
// directory beside it, renamed into place when whole; `dir` must not exist or
// be empty). `data_dir`: as for export_npy (NEWER's id arrays). Refuses
// checkpoints of different tower shapes or id kinds, naming both.
DeltaSummary export_npy_delta(const TrainedModel& newer, const TrainedModel& older,
                              const std::string& data_dir, const std::string& dir);

struct ApplySummary {
  std::string checkpoint;  // NEWER's path, as its export names it
  int64_t step = 0, base_step = 0;
  TableDeltaCounts users, items;
};

// Writes NEWER's full NumPy export into `output` (same temporary-directory
// rule) from the delta and the base export, after checking every file of the
// delta against its manifest and the base's manifest and table files against
// the identity the delta names; each refusal names the file and both values.
ApplySummary apply_npy_delta(const std::string& delta, const std::string& base,
                             const std::string& output);

}  // namespace ncf
