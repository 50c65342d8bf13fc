// The shared prep stages (see prep_stages.h): block planning, eval negatives,
// writing, and the loop that runs them block after block.
#include "data/prep_stages.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>

#include "common/affinity.h"
#include "common/check.h"
#include "common/parallel.h"

namespace ncf {
namespace {

constexpr uint64_t kBlockUsers = 4096;
// A block closes before its lists would pass this many int32 entries (unless it
// holds a single user), which bounds the memory of a block.
constexpr uint64_t kBlockInts = 1ull << 21;

// First user of each block, then num_users.
std::vector<uint64_t> plan_blocks(const SplitUsers& users, uint64_t list_len) {
  std::vector<uint64_t> first{0};
  uint64_t in_block = 0, ints = 0;
  for (uint64_t u = 0; u < users.num_users; ++u) {
    uint64_t np = 0, nt = 0;
    users.sizes(u, &np, &nt);
    const uint64_t need = np + nt + list_len;
    if (in_block > 0 && (in_block == kBlockUsers || ints + need > kBlockInts)) {
      first.push_back(u);
      in_block = ints = 0;
    }
    ++in_block;
    ints += need;
  }
  first.push_back(users.num_users);
  return first;
}

// Sizes a block for users [first, last): offsets and buffers.
void shape_block(const SplitUsers& users, uint64_t first, uint64_t last, uint64_t list_len,
                 UserBlock* b) {
  b->first_user = first;
  b->num_users = last - first;
  b->list_len = list_len;
  b->positive_off.assign(b->num_users + 1, 0);
  b->train_off.assign(b->num_users + 1, 0);
  for (uint64_t j = 0; j < b->num_users; ++j) {
    uint64_t np = 0, nt = 0;
    users.sizes(first + j, &np, &nt);
    b->positive_off[j + 1] = b->positive_off[j] + np;
    b->train_off[j + 1] = b->train_off[j] + nt;
  }
  b->positives.resize(b->positive_off.back());
  b->train.resize(b->train_off.back());
  b->eval.resize(b->num_users * list_len);
}

}  // namespace

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return default_threads(allowed_cpus(), {});  // prep has no node ranks: the mask size
}

void parallel_ranges(int threads, uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn) {
  std::mutex mu;
  uint64_t failed_at = UINT64_MAX;
  std::exception_ptr error;
  parallel_for(threads, static_cast<int64_t>(n), 1, [&](int64_t begin, int64_t end) {
    try {
      fn(static_cast<uint64_t>(begin), static_cast<uint64_t>(end));
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (static_cast<uint64_t>(begin) < failed_at) {
        failed_at = static_cast<uint64_t>(begin);
        error = std::current_exception();
      }
    }
  });
  if (error) std::rethrow_exception(error);
}

void eval_negatives_stage(const EvalNegatives& neg, int threads, UserBlock* block) {
  const uint64_t E = neg.count;
  NCF_CHECK(block->list_len == E + 1, "eval lists of ", block->list_len, " items for ", E,
            " negatives");
  if (neg.given_mask) {
    NCF_CHECK(neg.given, "eval masks are given without their negatives");
    const uint8_t* from = neg.given_mask + block->first_user * block->list_len;
    block->eval_mask.assign(from, from + block->num_users * block->list_len);
  } else {
    block->eval_mask.clear();
  }
  if (neg.given) {
    for (uint64_t j = 0; j < block->num_users; ++j) {
      const int32_t* from = neg.given + (block->first_user + j) * E;
      std::copy(from, from + E, block->eval_of(j) + 1);
    }
    return;
  }
  parallel_ranges(threads, block->num_users, [&](uint64_t begin, uint64_t end) {
    std::vector<uint64_t> scratch;
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = block->first_user + j;
      try {
        draw_eval_negatives(u, block->positives_of(j), block->num_positives(j), neg.num_items,
                            neg.count, neg.seed, scratch, block->eval_of(j) + 1);
      } catch (const Error& err) {
        if (!neg.describe_user) throw;
        NCF_FAIL(neg.describe_user(u), ": ", err.what());
      }
    }
  });
}

void write_stage(const UserBlock& block, DatasetWriter* writer) {
  for (uint64_t j = 0; j < block.num_users; ++j)
    writer->add_user(
        block.first_user + j, block.positives.data() + block.positive_off[j],
        block.num_positives(j), block.train.data() + block.train_off[j], block.num_train(j),
        block.eval.data() + j * block.list_len, block.list_len,
        block.eval_mask.empty() ? nullptr : block.eval_mask.data() + j * block.list_len);
}

double PrepProgress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

DatasetMeta assemble_dataset(const std::string& out_dir, const DatasetPlan& plan,
                             const SplitUsers& users, const EvalNegatives& negatives, int threads,
                             const PrepProgress& progress) {
  NCF_CHECK(users.num_users == plan.num_users, "split ", users.num_users, " users, planned ",
            plan.num_users);
  const uint64_t list_len = uint64_t{plan.eval_negatives} + 1;
  const std::vector<uint64_t> first = plan_blocks(users, list_len);
  DatasetWriter writer(out_dir, plan);
  const uint64_t U = users.num_users;
  uint64_t next_report = U / 10, positives = 0;
  UserBlock block;
  for (size_t b = 0; b + 1 < first.size(); ++b) {
    shape_block(users, first[b], first[b + 1], list_len, &block);
    parallel_ranges(threads, block.num_users,
                    [&](uint64_t begin, uint64_t end) { users.split(&block, begin, end); });
    eval_negatives_stage(negatives, threads, &block);
    write_stage(block, &writer);
    positives += block.positives.size();
    const uint64_t done = first[b + 1];
    if (progress.enabled && done >= next_report && done < U) {
      std::fprintf(stderr, "%s: %3d%% users (%llu / %llu), %llu positives, %.1f s\n",
                   progress.label.c_str(), static_cast<int>(100 * done / U),
                   static_cast<unsigned long long>(done), static_cast<unsigned long long>(U),
                   static_cast<unsigned long long>(positives), progress.seconds());
      next_report = done + U / 10;
    }
  }
  if (progress.enabled)
    std::fprintf(stderr, "%s: shuffling and writing train shards (%.1f s)\n",
                 progress.label.c_str(), progress.seconds());
  DatasetMeta meta = writer.finish();
  if (progress.enabled)
    std::fprintf(stderr, "%s: done in %.1f s\n", progress.label.c_str(), progress.seconds());
  return meta;
}

}  // namespace ncf
