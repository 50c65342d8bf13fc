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

// Room for drawn eval negatives: the items each user never interacted with.
struct Room {
  uint64_t fewest = UINT64_MAX;  // the least room of any user
  uint64_t user = 0;             // the first user with that room
  uint64_t positives = 0;        // and its positives
  uint64_t short_users = 0;      // users with room for fewer than E
};

// First user of each block, then num_users; fills *room.
std::vector<uint64_t> plan_blocks(const SplitUsers& users, uint64_t list_len, uint64_t num_items,
                                  Room* room) {
  std::vector<uint64_t> first{0};
  uint64_t in_block = 0, ints = 0;
  for (uint64_t u = 0; u < users.num_users; ++u) {
    uint64_t np = 0, nt = 0;
    users.sizes(u, &np, &nt);
    if (!users.evaluated || users.evaluated(u)) {
      const uint64_t free_items = np < num_items ? num_items - np : 0;
      if (free_items < room->fewest) *room = {free_items, u, np, room->short_users};
      room->short_users += free_items + 1 < list_len;
    }
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
  b->has_eval.clear();
  if (users.evaluated) {
    b->has_eval.resize(b->num_users);
    for (uint64_t j = 0; j < b->num_users; ++j) b->has_eval[j] = users.evaluated(first + j);
  }
}

// The user a refusal or note is about: its name in the input (the original
// id, where the data has one) and its dense id.
std::string user_name(const EvalNegatives& neg, uint64_t u) {
  if (!neg.describe_user) return detail::concat("user ", u);
  return detail::concat(neg.describe_user(u), " (dense id ", u, ")");
}

// What plan.eval_sampling means for these users (see assemble_dataset). The
// refusals are sentences about the input, without a source location.
EvalSampling decide_eval_sampling(const DatasetPlan& plan, const EvalNegatives& neg,
                                  const Room& room) {
  if (neg.given) {
    NCF_CHECK(plan.eval_sampling == EvalSampling::kGiven,
              "given eval negatives with a plan that draws them (",
              eval_sampling_name(plan.eval_sampling), ")");
    return EvalSampling::kGiven;
  }
  NCF_CHECK(plan.eval_sampling != EvalSampling::kGiven,
            "a plan of given eval negatives without any");
  const uint64_t E = plan.eval_negatives, I = plan.num_items;
  if (E == 0 || room.fewest >= E)
    return plan.eval_sampling == EvalSampling::kAuto ? EvalSampling::kDistinct : plan.eval_sampling;
  const std::string who = user_name(neg, room.user);
  if (room.fewest == 0)
    NCF_FAIL(who, " has interacted with every one of the ", I,
             " items, so no item is left to draw its eval negatives from, with or without "
             "replacement");
  const std::string others =
      room.short_users > 1 ? detail::concat(" (", room.short_users - 1, " other users too)") : "";
  // The largest E that fits every user, and the NCF paper's 99 when it fits.
  const std::string fewer =
      room.fewest >= 99
          ? detail::concat("--eval_negatives 99 (any value up to ", room.fewest,
                           " fits every user)")
          : detail::concat("--eval_negatives ", room.fewest, " (the most that fits every user)");
  if (plan.eval_sampling == EvalSampling::kDistinct)
    NCF_FAIL(who, " has ", room.positives, " positives among the ", I, " items, which leaves ",
             room.fewest, " to draw from: too few for ", E, " distinct eval negatives", others,
             ". Pass ", fewer,
             ", or --eval_sampling with_replacement to draw them with replacement and mask the "
             "repeats (TF Model Garden's and MLPerf's rule)");
  if (plan.eval_sampling == EvalSampling::kAuto)
    std::fprintf(stderr,
                 "ncf_prep: note: %s has %llu positives among the %llu items, which leaves %llu "
                 "to draw from: too few for %llu distinct eval negatives%s. Every user's eval "
                 "negatives are drawn with replacement instead, repeats masked (--eval_sampling "
                 "with_replacement, TF Model Garden's and MLPerf's rule); for distinct ones pass "
                 "%s\n",
                 who.c_str(), static_cast<unsigned long long>(room.positives),
                 static_cast<unsigned long long>(I), static_cast<unsigned long long>(room.fewest),
                 static_cast<unsigned long long>(E), others.c_str(), fewer.c_str());
  return EvalSampling::kWithReplacement;
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
    NCF_CHECK(block->has_eval.empty(), "given eval lists cover every user");
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
      if (!block->evaluated(j)) continue;
      try {
        if (neg.sampling == EvalSampling::kWithReplacement)
          draw_eval_negatives_with_replacement(u, block->positives_of(j), block->num_positives(j),
                                               neg.num_items, neg.count, neg.seed, scratch,
                                               block->eval_of(j) + 1);
        else
          draw_eval_negatives(u, block->positives_of(j), block->num_positives(j), neg.num_items,
                              neg.count, neg.seed, scratch, block->eval_of(j) + 1);
      } catch (const Error& err) {
        if (!neg.describe_user) throw;
        NCF_RETHROW(err, user_name(neg, u));
      }
    }
  });
}

void write_stage(const UserBlock& block, DatasetWriter* writer) {
  for (uint64_t j = 0; j < block.num_users; ++j) {
    const bool e = block.evaluated(j);
    writer->add_user(
        block.first_user + j, block.positives.data() + block.positive_off[j],
        block.num_positives(j), block.train.data() + block.train_off[j], block.num_train(j),
        e ? block.eval.data() + j * block.list_len : nullptr, e ? block.list_len : 0,
        !e || block.eval_mask.empty() ? nullptr : block.eval_mask.data() + j * block.list_len);
  }
}

DatasetPlan plan_of_options(const std::string& source, const PrepOptions& opt) {
  DatasetPlan plan;
  plan.source = source;
  plan.eval_negatives = opt.eval_negatives;
  plan.eval_sampling = opt.eval_sampling;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = opt.seed;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  return plan;
}

double PrepProgress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

DatasetMeta assemble_dataset(const std::string& out_dir, const DatasetPlan& planned,
                             const SplitUsers& users, const EvalNegatives& source_negatives,
                             int threads, const PrepProgress& progress) {
  NCF_CHECK(users.num_users == planned.num_users, "split ", users.num_users, " users, planned ",
            planned.num_users);
  NCF_CHECK(source_negatives.count == planned.eval_negatives, "eval lists of ",
            source_negatives.count, " negatives for a plan of ", planned.eval_negatives);
  const uint64_t list_len = uint64_t{planned.eval_negatives} + 1;
  Room room;
  const std::vector<uint64_t> first = plan_blocks(users, list_len, planned.num_items, &room);
  DatasetPlan plan = planned;
  plan.eval_sampling = decide_eval_sampling(planned, source_negatives, room);
  EvalNegatives negatives = source_negatives;
  negatives.sampling = plan.eval_sampling;
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
