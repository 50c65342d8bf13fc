// Per-rank readers of a dataset directory. A background thread reads and
// validates records (CRCs, sizes, id ranges: the --verify checks) into a bounded
// queue, so the step loop only pops ready batches.
//
// Train stream: each epoch the train records are put in an order fixed by
// (seed, epoch); their valid rows, end to end, form the epoch's stream of n
// positives. Global step t takes stream positions [t·P, min((t+1)·P, n)) for P
// positives per global step, wherever record boundaries fall; rank r of W takes
// the r-th of W near-equal contiguous slices of it. A step's content therefore
// does not depend on W.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/format.h"

namespace ncf {

struct TrainBatch {
  int64_t epoch = 0;
  int64_t step = 0;            // global step within the epoch
  int64_t step_begin = 0;      // stream position of the global step's first positive
  int64_t step_count = 0;      // positives in the global step, over all ranks
  int64_t slice_begin = 0;     // stream position of this rank's first positive
  std::vector<int32_t> users;  // this rank's positives (n = users.size())
  std::vector<int32_t> items;
};

struct EvalBatch {
  int64_t first_record = 0;    // global index of the batch's first eval record
  int64_t num_users = 0;       // n
  std::vector<int32_t> users;  // n: each record's user (record r is user r when every user
                               // has one; an extended dataset's name theirs)
  std::vector<int32_t> items;  // n x L, row u: the positive then E negatives
  std::vector<uint8_t> mask;   // n x L, 0 = duplicate, not counted
};

// A bounded single-producer single-consumer queue that carries the producer's
// exception to the consumer.
template <typename T>
class PrefetchQueue {
 public:
  explicit PrefetchQueue(size_t depth) : depth_(depth) {}
  // Producer: blocks while full; returns false when the consumer cancelled.
  bool push(T&& v) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return q_.size() < depth_ || cancelled_; });
    if (cancelled_) return false;
    q_.push_back(std::move(v));
    cv_.notify_all();
    return true;
  }
  void close(std::exception_ptr err = nullptr) {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    err_ = err;
    cv_.notify_all();
  }
  // Consumer: false at the end; rethrows the producer's error.
  bool pop(T* out) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !q_.empty() || closed_; });
    if (!q_.empty()) {
      *out = std::move(q_.front());
      q_.pop_front();
      cv_.notify_all();
      return true;
    }
    if (err_) std::rethrow_exception(err_);
    return false;
  }
  void cancel() {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

 private:
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool closed_ = false, cancelled_ = false;
  std::exception_ptr err_;
};

// Random access to records by global index across a kind's shard files.
class ShardSet {
 public:
  ShardSet(const std::string& dir, const DatasetMeta& meta, const std::string& kind);
  // Reads record g (global index) into *payload; returns its byte offset.
  uint64_t read(uint64_t g, std::string* payload, const std::string** path);
  uint64_t num_records() const { return num_records_; }

 private:
  std::vector<std::unique_ptr<ShardCursor>> files_;  // in global record order
  uint64_t num_records_ = 0;
};

class TrainReader {
 public:
  // step_positives: P, positives per global step (batch_size / (1 + num_neg)).
  TrainReader(const std::string& dir, const DatasetMeta& meta, int rank, int world,
              int64_t step_positives, uint64_t seed, bool shuffle_records = true,
              size_t prefetch = 4);
  ~TrainReader();

  int64_t steps_per_epoch() const { return (num_positives_ + P_ - 1) / P_; }
  int64_t positives() const { return num_positives_; }
  // Starts reading epoch `epoch` in the background (ends any unfinished one).
  void start_epoch(int64_t epoch);
  // Next step of the epoch for this rank; false after the last step.
  bool next(TrainBatch* out);
  // The record order of an epoch (exposed for tests).
  std::vector<uint64_t> record_order(int64_t epoch) const;

 private:
  void produce(int64_t epoch);
  void stop();

  std::string dir_;
  DatasetMeta meta_;
  int rank_, world_;
  int64_t P_, num_positives_;
  uint64_t seed_;
  bool shuffle_;
  size_t depth_;
  ShardSet shards_;
  std::unique_ptr<PrefetchQueue<TrainBatch>> queue_;
  std::thread thread_;
};

class EvalReader {
 public:
  // Rank r reads users [r·U/W, (r+1)·U/W) in batches of up to batch_users. With
  // threads > 1 each batch's records are read and decoded by up to that many
  // threads of the process's pool (common/parallel.h), each over its own open
  // files: the same batches, and on damaged input the same first error, as one
  // thread gives.
  EvalReader(const std::string& dir, const DatasetMeta& meta, int rank, int world,
             int64_t batch_users, size_t prefetch = 4, int threads = 1);
  ~EvalReader();
  int64_t first_user() const { return begin_; }
  int64_t num_users() const { return end_ - begin_; }
  void start();
  bool next(EvalBatch* out);

 private:
  void produce();
  void stop();

  DatasetMeta meta_;
  int64_t begin_, end_, batch_;
  size_t depth_;
  int threads_;
  ShardSet shards_;
  std::vector<std::unique_ptr<ShardSet>> more_shards_;  // threads 1 .. threads-1
  std::unique_ptr<PrefetchQueue<EvalBatch>> queue_;
  std::thread thread_;
};

}  // namespace ncf
