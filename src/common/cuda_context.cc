// Host side of cuda_context.h shared by every build: the error texts, the wait
// pollers and the polling loop, and the stand-ins that fail clearly in builds
// without CUDA (the real context code is cuda_context.cu).
#include "common/cuda_context.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"

namespace ncf {

namespace {

struct PollerRegistry {
  std::mutex mu;
  std::vector<std::pair<const void*, std::function<void()>>> pollers;
  std::atomic<int> count{0};  // pollers.size(), read without the lock
};

PollerRegistry& registry() {
  static PollerRegistry* r = new PollerRegistry;  // never destroyed: waits may run at exit
  return *r;
}

}  // namespace

void register_wait_poller(const void* key, std::function<void()> poll) {
  NCF_CHECK(poll != nullptr, "register_wait_poller: empty poller");
  PollerRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [k, p] : r.pollers)
    if (k == key) {
      p = std::move(poll);
      return;
    }
  r.pollers.emplace_back(key, std::move(poll));
  r.count.store(int(r.pollers.size()));
}

void unregister_wait_poller(const void* key) {
  PollerRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.pollers.erase(std::remove_if(r.pollers.begin(), r.pollers.end(),
                                 [key](const auto& kp) { return kp.first == key; }),
                  r.pollers.end());
  r.count.store(int(r.pollers.size()));
}

bool wait_pollers_registered() { return registry().count.load() > 0; }

namespace {

// Copies the pollers first, so that one may (un)register without deadlocking.
void run_wait_pollers() {
  PollerRegistry& r = registry();
  if (r.count.load() == 0) return;
  std::vector<std::function<void()>> now;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& kp : r.pollers) now.push_back(kp.second);
  }
  for (const auto& poll : now) poll();
}

}  // namespace

void wait_until(const std::function<bool()>& done) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::milliseconds(2);
  constexpr auto kPollEvery = std::chrono::milliseconds(1);
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  const auto start = Clock::now();
  auto last_poll = start;
  auto sleep = std::chrono::microseconds(50);
  bool polled = false;
  while (!done()) {
    const auto now = Clock::now();
    if (!polled || now - last_poll >= kPollEvery) {
      run_wait_pollers();
      last_poll = now;
      polled = true;
    }
    if (now - start < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kMaxSleep);
    }
  }
}

const char* device_error_text(DeviceErrorCode code) {
  switch (code) {
    case DeviceErrorCode::kNone:
      return "no error";
    case DeviceErrorCode::kGatherRowOutOfRange:
      return "gather_rows: ids[index] outside [0, R)";
    case DeviceErrorCode::kUniqueRowOutOfRange:
      return "embedding optimizer: unique_rows[index] outside [0, R)";
    case DeviceErrorCode::kUniqueRowsNotIncreasing:
      return "embedding optimizer: unique_rows not strictly increasing at index";
    case DeviceErrorCode::kNegativesUserOutOfRange:
      return "sample_negatives: users[index] outside [0, num_users)";
    case DeviceErrorCode::kNegativesNoFreeItem:
      return "sample_negatives: the user interacted with all items, no negative exists";
    case DeviceErrorCode::kIndexOutOfRange:
      return "permute_rows: idx[index] outside [0, n_src)";
    case DeviceErrorCode::kTopKExcludedOutOfRange:
      return "top_k: excluded[index] outside the items [0, I)";
    case DeviceErrorCode::kRowNotCached:
      return "map_rows: rows[index] is not in the device cache";
    case DeviceErrorCode::kCopyRowOutOfRange:
      return "copy_rows or store_rows_bf16_at: rows[index] outside [0, bound)";
    case DeviceErrorCode::kSortIdOutOfRange:
      return "unique_ids, sort_reduce_rows or item_runs: ids[index] outside [0, bound)";
    case DeviceErrorCode::kNotAPermutation:
      return "unpermute_rows: perm[index] repeated or outside [0, n)";
    case DeviceErrorCode::kScatterRowsInvalid:
      return "scatter_rows_dense: rows[index] outside [0, N) or not strictly increasing";
    case DeviceErrorCode::kIdOutOfRange:
      return "ids_to_keys: ids[index] outside the table's rows [0, bound)";
    case DeviceErrorCode::kKeyNotRouted:
      return "bucketize_by_owner: keys[index] is not a key of a routed table";
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
