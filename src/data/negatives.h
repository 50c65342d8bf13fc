// Online negative sampling (shared/DESIGN.md step 2): each positive (u, i) at
// stream position p of epoch e gets num_neg items drawn uniformly from the items
// u never interacted with. Draws come from CounterRng keyed by (seed, epoch, p),
// so a sample does not depend on the rank count, the rank or the thread count.
#pragma once

#include <cstdint>

#include "common/device.h"
#include "data/dataset.h"

namespace ncf {

// For k < n: out_items[k·(1+num_neg)] = items[k] with label 1, followed by
// num_neg negatives with label 0; out_users repeats users[k]. positions[k] is
// the positive's stream position (slice_begin + k for a TrainBatch).
void sample_negatives(const ExecContext& ctx, const PositiveLists& positives, uint64_t num_items,
                      const int32_t* users, const int32_t* items, int64_t slice_begin,
                      int64_t n, int num_neg, uint64_t seed, int64_t epoch,
                      int32_t* out_users, int32_t* out_items, float* out_labels);

}  // namespace ncf
