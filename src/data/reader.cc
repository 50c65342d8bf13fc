// Per-rank prefetching readers: see reader.h for the stream definition.
#include "data/reader.h"

#include <algorithm>

#include "common/check.h"
#include "common/parallel.h"
#include "common/philox.h"
#include "data/format.h"

namespace ncf {

// ---------------------------------------------------------------- ShardSet ---

ShardSet::ShardSet(const std::string& dir, const DatasetMeta& meta, const std::string& kind) {
  const auto shards = meta.shards_of(kind);
  for (uint32_t s = 0; s < shards.size(); ++s) {
    files_.push_back(std::make_unique<ShardCursor>(dir, meta, kind, s));
    num_records_ += shards[s]->num_records;
  }
}

uint64_t ShardSet::read(uint64_t g, std::string* payload, const std::string** path) {
  auto it = std::upper_bound(
      files_.begin(), files_.end(), g,
      [](uint64_t v, const std::unique_ptr<ShardCursor>& f) { return v < f->info().first_record; });
  NCF_CHECK(it != files_.begin() && g < num_records_, "record ", g, " out of range");
  ShardCursor& f = **(it - 1);
  *path = &f.path();
  return f.read(g - f.info().first_record, payload);
}

// ------------------------------------------------------------- TrainReader ---

TrainReader::TrainReader(const std::string& dir, const DatasetMeta& meta, int rank, int world,
                         int64_t step_positives, uint64_t seed, bool shuffle_records,
                         size_t prefetch)
    : dir_(dir),
      meta_(meta),
      rank_(rank),
      world_(world),
      P_(step_positives),
      num_positives_(static_cast<int64_t>(meta.num_train)),
      seed_(seed),
      shuffle_(shuffle_records),
      depth_(std::max<size_t>(1, prefetch)),
      shards_(dir, meta, "train") {
  NCF_CHECK(world > 0 && rank >= 0 && rank < world, "bad rank ", rank, " of ", world);
  NCF_CHECK(P_ > 0, "positives per step must be > 0, got ", P_);
}

TrainReader::~TrainReader() { stop(); }

void TrainReader::stop() {
  if (queue_) queue_->cancel();
  if (thread_.joinable()) thread_.join();
  queue_.reset();
}

std::vector<uint64_t> TrainReader::record_order(int64_t epoch) const {
  const uint64_t num_records = meta_.num_train_records();
  std::vector<uint64_t> order(num_records);
  for (uint64_t k = 0; k < num_records; ++k) order[k] = k;
  if (shuffle_) {
    CounterRng rng{seed_, kStreamEpochOrder, static_cast<uint64_t>(epoch)};
    for (uint64_t i = num_records; i > 1; --i) std::swap(order[i - 1], order[rng.below(i, i)]);
  }
  return order;
}

void TrainReader::start_epoch(int64_t epoch) {
  stop();
  queue_ = std::make_unique<PrefetchQueue<TrainBatch>>(depth_);
  thread_ = std::thread([this, epoch] { produce(epoch); });
}

bool TrainReader::next(TrainBatch* out) {
  NCF_CHECK(queue_ != nullptr, "next() before start_epoch()");
  return queue_->pop(out);
}

void TrainReader::produce(int64_t epoch) {
  try {
    const uint64_t num_records = meta_.num_train_records();
    const int64_t record_rows = meta_.train_record_rows;
    const std::vector<uint64_t> order = record_order(epoch);
    auto valid_of = [&](uint64_t g) {
      return static_cast<int64_t>(train_record_valid_rows(meta_, g));
    };
    // start[k]: stream position of the first row of the k-th record in order.
    std::vector<int64_t> start(num_records + 1, 0);
    for (uint64_t k = 0; k < num_records; ++k) start[k + 1] = start[k] + valid_of(order[k]);

    std::vector<int32_t> users(record_rows), items(record_rows);
    int64_t cached = -1;  // index k (in order) of the record held in users/items
    std::string payload;
    for (int64_t t = 0; t < steps_per_epoch(); ++t) {
      TrainBatch b;
      b.epoch = epoch;
      b.step = t;
      b.step_begin = t * P_;
      b.step_count = std::min(P_, num_positives_ - b.step_begin);
      const int64_t lo = b.step_begin + b.step_count * rank_ / world_;
      const int64_t hi = b.step_begin + b.step_count * (rank_ + 1) / world_;
      b.slice_begin = lo;
      b.users.resize(hi - lo);
      b.items.resize(hi - lo);
      int64_t p = lo;
      while (p < hi) {
        int64_t k = std::upper_bound(start.begin(), start.end(), p) - start.begin() - 1;
        if (k != cached) {
          const std::string* path;
          uint64_t off = shards_.read(order[k], &payload, &path);
          decode_train_record(payload, meta_, valid_of(order[k]), *path, off, users.data(),
                              items.data());
          cached = k;
        }
        int64_t from = p - start[k];
        int64_t n = std::min(hi, start[k + 1]) - p;
        std::copy_n(users.begin() + from, n, b.users.begin() + (p - lo));
        std::copy_n(items.begin() + from, n, b.items.begin() + (p - lo));
        p += n;
      }
      if (!queue_->push(std::move(b))) return;
    }
    queue_->close();
  } catch (...) {
    queue_->close(std::current_exception());
  }
}

// -------------------------------------------------------------- EvalReader ---

EvalReader::EvalReader(const std::string& dir, const DatasetMeta& meta, int rank, int world,
                       int64_t batch_users, size_t prefetch, int threads)
    : meta_(meta),
      begin_(static_cast<int64_t>(meta.num_eval_users * rank / world)),
      end_(static_cast<int64_t>(meta.num_eval_users * (rank + 1) / world)),
      batch_(batch_users),
      depth_(std::max<size_t>(1, prefetch)),
      threads_(std::max(1, threads)),
      shards_(dir, meta, "eval") {
  NCF_CHECK(world > 0 && rank >= 0 && rank < world, "bad rank ", rank, " of ", world);
  NCF_CHECK(batch_users > 0, "eval batch must hold at least one user, got ", batch_users);
  const int parts = int(std::min<int64_t>(threads_, std::max<int64_t>(1, batch_)));
  for (int p = 1; p < parts; ++p)
    more_shards_.push_back(std::make_unique<ShardSet>(dir, meta, "eval"));
}

EvalReader::~EvalReader() { stop(); }

void EvalReader::stop() {
  if (queue_) queue_->cancel();
  if (thread_.joinable()) thread_.join();
  queue_.reset();
}

void EvalReader::start() {
  stop();
  queue_ = std::make_unique<PrefetchQueue<EvalBatch>>(depth_);
  thread_ = std::thread([this] { produce(); });
}

bool EvalReader::next(EvalBatch* out) {
  NCF_CHECK(queue_ != nullptr, "next() before start()");
  return queue_->pop(out);
}

void EvalReader::produce() {
  try {
    const int64_t L = meta_.eval_negatives + 1;
    const int max_parts = 1 + int(more_shards_.size());
    std::vector<std::string> payloads(static_cast<size_t>(max_parts));
    std::vector<std::exception_ptr> errors(static_cast<size_t>(max_parts));
    int64_t last = -1;  // the previous record's user: they ascend
    for (int64_t u0 = begin_; u0 < end_; u0 += batch_) {
      EvalBatch b;
      b.first_record = u0;
      b.num_users = std::min(batch_, end_ - u0);
      b.items.resize(b.num_users * L);
      b.mask.resize(b.num_users * L);
      b.users.resize(b.num_users);
      // Part p: records [n·p/parts, n·(p+1)/parts) of the batch, through its own files.
      // A part's first record is checked against the previous part's last user
      // below, once every part is decoded; the first part's against `last`.
      const int64_t n = b.num_users;
      const int parts = int(std::min<int64_t>(max_parts, n));
      auto decode_part = [&](int64_t p) {
        ShardSet& files = p == 0 ? shards_ : *more_shards_[size_t(p - 1)];
        int64_t after = p == 0 ? last : -1;
        try {
          for (int64_t k = n * p / parts; k < n * (p + 1) / parts; ++k) {
            const std::string* path;
            const uint64_t off = files.read(u0 + k, &payloads[size_t(p)], &path);
            after = decode_eval_record(payloads[size_t(p)], meta_, u0 + k, after, *path, off,
                                       &b.items[k * L], &b.mask[k * L]);
            b.users[k] = int32_t(after);
          }
        } catch (...) {
          errors[size_t(p)] = std::current_exception();
        }
      };
      if (parts > 1) {
        parallel_for(parts, parts, 1, [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) decode_part(p);
        });
      } else {
        decode_part(0);
      }
      // In record order: a part's first record decoded again with the previous
      // user as `after` (what one thread checks), then the part's own error.
      for (int p = 0; p < parts; ++p) {
        const int64_t k = n * p / parts;
        if (p > 0 && !meta_.every_user_evaluated()) {
          const std::string* path;
          const uint64_t off = shards_.read(u0 + k, &payloads[0], &path);
          decode_eval_record(payloads[0], meta_, u0 + k, b.users[k - 1], *path, off,
                             &b.items[k * L], &b.mask[k * L]);
        }
        if (errors[size_t(p)]) std::rethrow_exception(errors[size_t(p)]);
      }
      if (n > 0) last = b.users[n - 1];
      if (!queue_->push(std::move(b))) return;
    }
    queue_->close();
  } catch (...) {
    queue_->close(std::current_exception());
  }
}

}  // namespace ncf
