// MovieLens ratings files (u.data, ratings.dat, ratings.csv) → dataset: the
// parse stage (text_input.h's rating-line reader) and the raw ids as keys in
// ascending order; the remap and split stages (repeated pairs kept once,
// leave-one-out by time) are interactions.h's, shared with the CSV source, and
// prep_stages.h does the rest.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "common/check.h"
#include "data/extend.h"
#include "data/interactions.h"
#include "data/prep_stages.h"
#include "data/sources.h"
#include "data/text_input.h"

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

// Raw ids → dense 0-based ids in ascending raw order. A direct table when the
// raw range is small (MovieLens: ids up to a few 100k), a sorted list otherwise.
class DenseIds {
 public:
  // ids: every occurrence (repeats allowed), all >= 0.
  explicit DenseIds(std::vector<int64_t> ids) {
    if (ids.empty()) return;
    auto [mn, mx] = std::minmax_element(ids.begin(), ids.end());
    min_ = *mn;
    const uint64_t range = static_cast<uint64_t>(*mx - *mn) + 1;
    if (range <= std::max<uint64_t>(4 * ids.size(), 1u << 20) && range < (1ull << 31)) {
      table_.assign(range, -1);
      for (int64_t v : ids) table_[v - min_] = 0;
      int64_t next = 0;
      for (auto& t : table_)
        if (t == 0) t = static_cast<int32_t>(next++);
      size_ = next;
    } else {
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      sorted_ = std::move(ids);
      size_ = static_cast<int64_t>(sorted_.size());
    }
  }
  int64_t size() const { return size_; }
  // raw[d] for every dense id d: the ascending distinct inputs.
  std::vector<int64_t> raw_ids() const {
    if (table_.empty()) return sorted_;
    std::vector<int64_t> raw;
    raw.reserve(size_t(size_));
    for (size_t k = 0; k < table_.size(); ++k)
      if (table_[k] >= 0) raw.push_back(min_ + int64_t(k));
    return raw;
  }
  // Dense id of a raw id that was among the inputs.
  int64_t operator()(int64_t raw) const {
    if (!table_.empty()) return table_[raw - min_];
    return std::lower_bound(sorted_.begin(), sorted_.end(), raw) - sorted_.begin();
  }

 private:
  int64_t min_ = 0, size_ = 0;
  std::vector<int32_t> table_;
  std::vector<int64_t> sorted_;
};

// Data set name for metadata "source": the folder name when it looks like a
// GroupLens release (ml-20m/ratings.csv), else the file name.
std::string movielens_name(const std::string& file) {
  std::string parent = basename_of(std::filesystem::path(file).parent_path().string());
  if (parent.rfind("ml-", 0) == 0) return parent;
  return basename_of(file);
}

}  // namespace

DatasetMeta prepare_movielens(const std::string& path, InputFormat fmt, const std::string& out_dir,
                              const PrepOptions& opt) {
  const PrepProgress progress{opt.progress, "prep", Clock::now()};
  const int threads = resolve_threads(opt.threads);
  std::string file;
  const InputFormat f = detect_format(path, fmt, &file);
  if (f == InputFormat::kNcfPaper)
    NCF_FAIL(path, " holds NCF-paper files (", file, kNcfTrain, "): use --format ncf-paper");
  if (opt.min_interactions < 1)
    NCF_FAIL("min_interactions must be >= 1, got ", opt.min_interactions);

  std::vector<Rating> ratings = parse_ratings(file, syntax_of(f), threads);
  const uint64_t num_ratings = ratings.size();
  if (opt.progress)
    std::fprintf(stderr, "prep: read %llu ratings from %s in %.1f s\n",
                 static_cast<unsigned long long>(num_ratings), file.c_str(), progress.seconds());
  if (num_ratings >= (1ull << 32))
    NCF_FAIL(file, ": ", num_ratings, " ratings, more than this reader handles (2^32)");
  // Keys in ascending raw-id order, so the shared stage's dense ids follow the raw ids.
  Interactions in;
  std::vector<int64_t> all_users, all_items;  // key → raw id
  {
    std::vector<int64_t> ids(num_ratings);
    for (uint64_t k = 0; k < num_ratings; ++k) ids[k] = ratings[k].user;
    const DenseIds users(std::move(ids));
    ids.assign(num_ratings, 0);
    for (uint64_t k = 0; k < num_ratings; ++k) ids[k] = ratings[k].item;
    const DenseIds items(std::move(ids));
    all_users = users.raw_ids();
    all_items = items.raw_ids();
    in.num_user_keys = all_users.size();
    in.num_item_keys = all_items.size();
    in.user.resize(num_ratings);
    in.item.resize(num_ratings);
    in.time.resize(num_ratings);
    parallel_ranges(threads, num_ratings, [&](uint64_t b, uint64_t e) {
      for (uint64_t k = b; k < e; ++k) {
        in.user[k] = static_cast<uint32_t>(users(ratings[k].user));
        in.item[k] = static_cast<uint32_t>(items(ratings[k].item));
        in.time[k] = ratings[k].timestamp;
      }
    });
  }
  std::vector<Rating>().swap(ratings);
  if (!opt.extend.prev.empty()) {
    KeyedLog log;
    log.in = std::move(in);
    log.user_ids = std::move(all_users);
    log.item_ids = std::move(all_items);
    DatasetPlan plan = plan_of_options("movielens:" + movielens_name(file), opt);
    plan.generator = {{"input", file},
                      {"format", format_name(f)},
                      {"ratings", num_ratings},
                      {"min_interactions", opt.min_interactions},
                      {"max_users", opt.extend.max_users},
                      {"max_items", opt.extend.max_items}};
    return extend_dataset(std::move(log), plan, opt, out_dir, file);
  }
  const HeldOutUsers d = hold_out_latest(std::move(in), opt.min_interactions, threads, file);
  const uint64_t U = d.num_users(), I = d.num_items();
  std::vector<int64_t> raw_user(U), raw_item(I);
  for (uint64_t u = 0; u < U; ++u) raw_user[u] = all_users[d.user_key[u]];
  for (uint64_t i = 0; i < I; ++i) raw_item[i] = all_items[d.item_key[i]];
  if (opt.progress)
    std::fprintf(stderr,
                 "prep: %llu users (%llu dropped with < %u items), %llu items, %llu duplicate "
                 "ratings removed (%.1f s)\n",
                 static_cast<unsigned long long>(U), static_cast<unsigned long long>(d.dropped),
                 opt.min_interactions, static_cast<unsigned long long>(I),
                 static_cast<unsigned long long>(d.duplicates), progress.seconds());

  DatasetPlan plan = plan_of_options("movielens:" + movielens_name(file), opt);
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = d.pos.size() - U;
  plan.num_positives = d.pos.size();
  plan.dropped_users = d.dropped;
  // Each id's latest activity (generation 0), what a bounded --extend keeps by.
  std::vector<int64_t> user_activity, item_activity;
  activity_of(d, &user_activity, &item_activity);
  plan.user_activity = &user_activity;
  plan.item_activity = &item_activity;
  plan.raw_users = &raw_user;
  plan.raw_items = &raw_item;
  plan.generator = {{"input", file},
                    {"format", format_name(f)},
                    {"ratings", num_ratings},
                    {"duplicates_removed", d.duplicates},
                    {"raw_users", d.raw_users},
                    {"min_interactions", opt.min_interactions}};
  EvalNegatives negatives{I, opt.eval_negatives, opt.seed, nullptr,
                          [&](uint64_t u) { return detail::concat(file, ": user ", raw_user[u]); }};
  return assemble_dataset(out_dir, plan, leave_one_out(d), negatives, threads, progress);
}

std::vector<Rating> read_movielens(const std::string& file, InputFormat fmt) {
  if (fmt == InputFormat::kAuto) {
    std::string resolved;
    fmt = detect_format(file, fmt, &resolved);
    NCF_REQUIRE(is_movielens(fmt), file, " is not a MovieLens ratings file (it reads as ",
                format_name(fmt), ")");
    return parse_ratings(resolved, syntax_of(fmt), resolve_threads(0));
  }
  NCF_CHECK(is_movielens(fmt), "read_movielens: not a MovieLens format: ", format_name(fmt));
  return parse_ratings(file, syntax_of(fmt), resolve_threads(0));
}

}  // namespace ncf
