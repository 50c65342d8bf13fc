// Host side of cuda_context.h shared by every build: the error texts, and the
// stand-ins that fail clearly in builds without CUDA (the real context code is
// cuda_context.cu).
#include "common/cuda_context.h"

#include "common/check.h"

namespace ncf {

const char* device_error_text(DeviceErrorCode code) {
  switch (code) {
    case DeviceErrorCode::kNone: return "no error";
    case DeviceErrorCode::kGatherRowOutOfRange: return "gather_rows: ids[index] outside [0, R)";
    case DeviceErrorCode::kUniqueRowOutOfRange:
      return "embedding optimizer: unique_rows[index] outside [0, R)";
    case DeviceErrorCode::kUniqueRowsNotIncreasing:
      return "embedding optimizer: unique_rows not strictly increasing at index";
    case DeviceErrorCode::kNegativesUserOutOfRange:
      return "sample_negatives: users[index] outside [0, num_users)";
    case DeviceErrorCode::kNegativesNoFreeItem:
      return "sample_negatives: the user interacted with all items, no negative exists";
    case DeviceErrorCode::kIndexOutOfRange: return "permute_rows: idx[index] outside [0, n_src)";
    case DeviceErrorCode::kNotAPermutation:
      return "unpermute_rows: perm[index] repeated or outside [0, n)";
    case DeviceErrorCode::kNegativeId: return "bucketize_by_owner: ids[index] is negative";
    case DeviceErrorCode::kScatterRowsInvalid:
      return "scatter_rows_dense: rows[index] outside [0, N) or not strictly increasing";
  }
  return "unknown device error";
}

#ifndef NCF_WITH_CUDA
ExecContext make_cuda_context(int device_id) {
  NCF_FAIL("make_cuda_context(", device_id,
           "): this build has no CUDA backend (configured with NCF_CUDA=OFF or without nvcc)");
}

void destroy_cuda_context(ExecContext&) {}  // nothing can have been made

void check_device_errors(const ExecContext&) {}
#endif

}  // namespace ncf
