// Per-rank read throughput of a dataset directory through the readers the
// trainer uses (src/data/reader.h), with every check on: frame CRCs, sizes,
// headers, id ranges, duplicate masks. One timed pass = one epoch of rank r's
// train slices (TrainReader, P positives per global step), then one pass of
// its eval users (EvalReader). Prints records/s, positives/s and GB/s, where
// GB/s counts the bytes of the record frames the rank reads.
//
// Before timing, the readers are checked against an independent walk of the
// shard files (ShardCursor + the record decoders, in file order): the
// positives delivered to all W ranks, and the eval lists, must equal the
// files' contents as multisets (count and an order-free hash).
//
//   bench_reader --data_dir DIR [--world W] [--rank r] [--positives P] [--reps N]
//                [--evict]   (drop the dataset's pages before each pass: cold reads)
//                [--only train|eval]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/check.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/reader.h"

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string data_dir;
  int world = 1;
  int rank = 0;
  int64_t positives = 1048576 / 5;  // P of the ml-20m-mlperf preset
  int64_t eval_users = 0;           // users per eval batch (0: the trainer's default size)
  int reps = 3;
  int threads = 1;  // threads decoding each eval batch
  bool verify = true;
  bool evict = false;
  std::string only = "both";  // train, eval or both (one reader alone, e.g. under perf)
};

// Order-free digest of a multiset of rows: sum of a mixed hash per row.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t pair_hash(int32_t u, int32_t i) {
  return mix((uint64_t(uint32_t(u)) << 32) | uint32_t(i));
}

struct Digest {
  uint64_t rows = 0, sum = 0;
  bool operator==(const Digest& o) const { return rows == o.rows && sum == o.sum; }
};

// Drops the page cache of the dataset's shard files (only these files), so the
// next pass reads from the disk.
void evict_pages(const std::string& dir, const DatasetMeta& meta) {
  for (const ShardInfo& s : meta.shards) {
    const std::string path = dir + "/" + s.name;
    int fd = ::open(path.c_str(), O_RDONLY);
    NCF_CHECK(fd >= 0, "cannot open ", path, " to evict its pages");
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Independent of the readers' record order: every train record of every shard
// in file order, through the shard cursor --verify uses.
Digest walk_train(const std::string& dir, const DatasetMeta& meta) {
  Digest d;
  std::vector<int32_t> users(meta.train_record_rows), items(meta.train_record_rows);
  std::string payload;
  const uint32_t num_shards = static_cast<uint32_t>(meta.shards_of("train").size());
  for (uint32_t s = 0; s < num_shards; ++s) {
    ShardCursor cur(dir, meta, "train", s);
    uint64_t off = 0;
    for (uint64_t g = cur.info().first_record; cur.next(&payload, &off); ++g) {
      const uint64_t valid = train_record_valid_rows(meta, g);
      decode_train_record(payload, meta, valid, cur.path(), off, users.data(), items.data());
      for (uint64_t j = 0; j < valid; ++j) d.sum += pair_hash(users[j], items[j]);
      d.rows += valid;
    }
  }
  return d;
}

Digest walk_eval(const std::string& dir, const DatasetMeta& meta) {
  Digest d;
  const int64_t L = meta.eval_negatives + 1;
  std::vector<int32_t> items(L);
  std::vector<uint8_t> mask(L);
  std::string payload;
  const uint32_t num_shards = static_cast<uint32_t>(meta.shards_of("eval").size());
  int64_t user = -1;
  for (uint32_t s = 0; s < num_shards; ++s) {
    ShardCursor cur(dir, meta, "eval", s);
    uint64_t off = 0;
    for (uint64_t r = cur.info().first_record; cur.next(&payload, &off); ++r) {
      user = decode_eval_record(payload, meta, r, user, cur.path(), off, items.data(), mask.data());
      for (int64_t j = 0; j < L; ++j)
        d.sum += pair_hash(int32_t(user), items[j]) * (mask[j] ? 3 : 1) + uint64_t(j);
      d.rows += 1;
    }
  }
  return d;
}

// Train records rank r reads in an epoch: the reader keeps the last decoded
// record, so a record is read again only when the rank's slices leave it and
// come back (never for W = 1).
uint64_t train_frames_read(const DatasetMeta& meta, const std::vector<uint64_t>& order, int64_t P,
                           int rank, int world) {
  const uint64_t N = order.size(), R = meta.train_record_rows;
  const int64_t T = int64_t(meta.num_train);
  std::vector<int64_t> start(N + 1, 0);
  for (uint64_t k = 0; k < N; ++k)
    start[k + 1] = start[k] + int64_t(order[k] + 1 < N ? R : meta.num_train - (N - 1) * R);
  uint64_t reads = 0;
  int64_t cached = -1;
  for (int64_t b = 0; b < T; b += P) {
    const int64_t n = std::min(P, T - b);
    const int64_t lo = b + n * rank / world, hi = b + n * (rank + 1) / world;
    for (int64_t p = lo; p < hi;) {
      int64_t k = std::upper_bound(start.begin(), start.end(), p) - start.begin() - 1;
      if (k != cached) ++reads, cached = k;
      p = std::min(hi, start[k + 1]);
    }
  }
  return reads;
}

// CPU seconds (user + sys) of the whole process, all threads: under a loaded
// machine the wall time mostly measures the other jobs, this much less so.
double cpu_seconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Pass {
  double seconds = 0;
  double cpu = 0;     // process CPU seconds during the pass
  uint64_t rows = 0;  // positives (train) or users (eval) delivered
  uint64_t batches = 0;
  Digest digest;
};

// digest: hash every row (the verify pass); otherwise only sum the ids, so the
// consumer's own work stays small beside the reader's.
Pass train_pass(TrainReader& reader, int64_t epoch, bool digest) {
  Pass p;
  const double c0 = cpu_seconds();
  auto t0 = Clock::now();
  reader.start_epoch(epoch);
  TrainBatch b;
  while (reader.next(&b)) {
    p.rows += b.users.size();
    ++p.batches;
    if (digest) {
      for (size_t j = 0; j < b.users.size(); ++j) p.digest.sum += pair_hash(b.users[j], b.items[j]);
    } else {
      for (size_t j = 0; j < b.users.size(); ++j) p.digest.sum += uint32_t(b.users[j] ^ b.items[j]);
    }
  }
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  p.cpu = cpu_seconds() - c0;
  p.digest.rows = p.rows;
  return p;
}

Pass eval_pass(EvalReader& reader, int64_t L, bool digest) {
  Pass p;
  const double c0 = cpu_seconds();
  auto t0 = Clock::now();
  reader.start();
  EvalBatch b;
  while (reader.next(&b)) {
    p.rows += uint64_t(b.num_users);
    ++p.batches;
    const int64_t n = b.num_users * L;
    if (digest) {
      for (int64_t k = 0; k < n; ++k)
        p.digest.sum +=
            pair_hash(b.users[size_t(k / L)], b.items[k]) * (b.mask[k] ? 3 : 1) + uint64_t(k % L);
    } else {
      for (int64_t k = 0; k < n; ++k) p.digest.sum += uint32_t(b.items[k]) + b.mask[k];
    }
  }
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  p.cpu = cpu_seconds() - c0;
  p.digest.rows = p.rows;
  return p;
}

// One line per pass and the best; rates per wall second, and GB per CPU second
// (user + sys of the reader thread and the consumer together).
void report(const char* what, const std::vector<Pass>& passes, double records, double positives,
            double bytes) {
  double best = passes[0].seconds, worst = best, best_cpu = passes[0].cpu;
  for (const Pass& p : passes) {
    best = std::min(best, p.seconds);
    worst = std::max(worst, p.seconds);
    best_cpu = std::min(best_cpu, p.cpu);
  }
  for (size_t r = 0; r < passes.size(); ++r) {
    const double t = passes[r].seconds;
    std::printf(
        "%-6s rep %zu: %8.3f s %12.0f records/s %14.0f positives/s %8.3f GB/s"
        "   cpu %7.3f s %8.3f GB/cpu-s\n",
        what, r + 1, t, records / t, positives / t, bytes / t / 1e9, passes[r].cpu,
        bytes / passes[r].cpu / 1e9);
  }
  std::printf(
      "%-6s best: %8.3f s %12.0f records/s %14.0f positives/s %8.3f GB/s"
      "   cpu %7.3f s %8.3f GB/cpu-s  (spread of wall times %.0f%%)\n",
      what, best, records / best, positives / best, bytes / best / 1e9, best_cpu,
      bytes / best_cpu / 1e9, 100.0 * (worst - best) / best);
}

int run(const Options& o) {
  const DatasetMeta meta = DatasetMeta::load(o.data_dir);
  NCF_CHECK(o.world >= 1 && o.rank >= 0 && o.rank < o.world, "flag --rank ", o.rank,
            " must be in [0, --world ", o.world, ")");
  NCF_CHECK(o.positives > 0, "flag --positives must be > 0, got ", o.positives);
  const int64_t L = meta.eval_negatives + 1;
  // The trainer's default eval batch is 100,000 samples (users x L) per rank.
  const int64_t eval_users = o.eval_users > 0 ? o.eval_users : std::max<int64_t>(1, 100000 / L);
  std::printf(
      "# %s: %llu users, %llu items, %llu train positives in %llu records of %u rows "
      "(%llu-byte frames), %llu eval users x %lld (%llu-byte frames)\n",
      o.data_dir.c_str(), (unsigned long long)meta.num_users, (unsigned long long)meta.num_items,
      (unsigned long long)meta.num_train, (unsigned long long)meta.num_train_records(),
      meta.train_record_rows, (unsigned long long)meta.train_frame_bytes,
      (unsigned long long)meta.num_eval_users, (long long)L,
      (unsigned long long)meta.eval_frame_bytes);
  std::printf(
      "# rank %d of W = %d, P = %lld positives per global step, %lld eval users per "
      "batch decoded by %d thread(s), %s page cache\n",
      o.rank, o.world, (long long)o.positives, (long long)eval_users, o.threads,
      o.evict ? "cold (evicted before each pass)" : "warm");

  if (o.verify) {
    // All W ranks together must deliver exactly the files' contents.
    const Digest want_t = walk_train(o.data_dir, meta), want_e = walk_eval(o.data_dir, meta);
    Digest got_t, got_e;
    for (int r = 0; r < o.world; ++r) {
      TrainReader tr(o.data_dir, meta, r, o.world, o.positives, meta.seed);
      Pass p = train_pass(tr, 0, true);
      got_t.rows += p.digest.rows;
      got_t.sum += p.digest.sum;
      EvalReader er(o.data_dir, meta, r, o.world, eval_users, 4, o.threads);
      Pass q = eval_pass(er, L, true);
      got_e.rows += q.digest.rows;
      got_e.sum += q.digest.sum;
    }
    const bool ok = got_t == want_t && got_e == want_e;
    std::printf("# verify: train %llu rows (files %llu), eval %llu users (files %llu): %s\n",
                (unsigned long long)got_t.rows, (unsigned long long)want_t.rows,
                (unsigned long long)got_e.rows, (unsigned long long)want_e.rows,
                ok ? "readers match the files" : "MISMATCH");
    if (!ok) return 1;
  }

  TrainReader train(o.data_dir, meta, o.rank, o.world, o.positives, meta.seed);
  EvalReader eval(o.data_dir, meta, o.rank, o.world, eval_users, 4, o.threads);
  std::vector<Pass> tpass, epass;
  uint64_t t_rows = 0, t_frames = 0, e_rows = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    const int64_t epoch = rep + 1;
    if (o.only != "eval") {
      if (o.evict) evict_pages(o.data_dir, meta);
      Pass p = train_pass(train, epoch, false);
      t_rows = p.rows;
      t_frames = train_frames_read(meta, train.record_order(epoch), o.positives, o.rank, o.world);
      tpass.push_back(p);
    }
    if (o.only != "train") {
      if (o.evict) evict_pages(o.data_dir, meta);
      Pass q = eval_pass(eval, L, false);
      e_rows = q.rows;
      epass.push_back(q);
    }
  }
  if (!tpass.empty())
    std::printf("# train: %llu positives in %llu steps; %llu record frames read (%.1f MB)\n",
                (unsigned long long)t_rows, (unsigned long long)train.steps_per_epoch(),
                (unsigned long long)t_frames, double(t_frames * meta.train_frame_bytes) / 1e6);
  if (!epass.empty())
    std::printf("# eval: %llu users (records) = %llu items; %.1f MB of frames\n",
                (unsigned long long)e_rows, (unsigned long long)(e_rows * L),
                double(e_rows * meta.eval_frame_bytes) / 1e6);
  if (!tpass.empty())
    report("train", tpass, double(t_frames), double(t_rows),
           double(t_frames * meta.train_frame_bytes));
  // Eval "positives" counts list entries (1 + E per user), what the scorer consumes.
  if (!epass.empty())
    report("eval", epass, double(e_rows), double(e_rows * L),
           double(e_rows * meta.eval_frame_bytes));
  return 0;
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  ncf::Options o;
  CLI::App app{"bench_reader: per-rank read throughput of the train and eval readers"};
  app.add_option("--data_dir", o.data_dir, "dataset directory written by ncf_prep")->required();
  app.add_option("--world", o.world, "W, ranks the stream is split over")->capture_default_str();
  app.add_option("--rank", o.rank, "the rank whose slices are timed")->capture_default_str();
  app.add_option("--positives", o.positives,
                 "P, positives per global step (batch_size / (1 + num_neg))")
      ->capture_default_str();
  app.add_option("--eval_users", o.eval_users,
                 "users per eval batch (0: 100000 / (1 + E), the trainer's default)")
      ->capture_default_str();
  app.add_option("--reps", o.reps, "timed passes")->capture_default_str();
  app.add_option("--threads", o.threads, "threads decoding each eval batch (GPU ranks: --threads)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_flag("!--no_verify", o.verify, "skip the check against the files");
  app.add_option("--only", o.only, "time only this reader: train, eval or both")
      ->check(CLI::IsMember({"train", "eval", "both"}))
      ->capture_default_str();
  app.add_flag("--evict", o.evict, "drop the dataset's pages from the page cache before each pass");
  CLI11_PARSE(app, argc, argv);
  try {
    return ncf::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_reader: %s\n", e.what());
    return 1;
  }
}
