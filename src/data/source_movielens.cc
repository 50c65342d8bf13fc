// MovieLens ratings files (u.data, ratings.dat, ratings.csv) → dataset: the
// parse stage (text_input.h's rating-line reader), the remap stage (ids made
// dense in ascending raw order, repeated pairs kept once) and the split stage
// (leave-one-out by time); prep_stages.h does the rest.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "common/check.h"
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

// Ratings grouped by user: dense users in ascending raw id, each user's raw
// items in file order, and the item of the user's latest rating.
struct UserGroups {
  uint64_t num_ratings = 0;
  std::vector<uint64_t> off;      // num_users + 1
  std::vector<int64_t> items;     // raw items, user by user
  std::vector<int64_t> raw_user;  // dense → raw user id
  std::vector<int64_t> latest;    // raw item of the latest rating
};

// A MovieLens file with dense ids: kept users 0 .. U-1, items 0 .. I-1 (both in
// ascending raw id), each user's distinct items (CSR, ascending) and latest item.
struct DenseRatings {
  uint64_t num_items = 0;
  uint64_t raw_users = 0, duplicates = 0, dropped = 0;
  std::vector<uint64_t> pos_off;  // U + 1
  std::vector<int32_t> pos;
  std::vector<int32_t> latest;    // U
  std::vector<int64_t> raw_user;  // U: the original id of each dense user, ascending
  std::vector<int64_t> raw_item;  // I: the same for items
  uint64_t num_users() const { return latest.size(); }
};

// Remap stage, users: a counting sort by user, stable so file order stays
// within a user; the latest rating is picked on the way, and iterating in file
// order with >= makes the later line win a timestamp tie.
UserGroups group_by_user(std::vector<Rating> ratings) {
  UserGroups g;
  const uint64_t n = ratings.size();
  g.num_ratings = n;
  std::vector<int64_t> raw_ids(n);
  for (uint64_t k = 0; k < n; ++k) raw_ids[k] = ratings[k].user;
  const DenseIds all_users(std::move(raw_ids));
  const uint64_t num_users = static_cast<uint64_t>(all_users.size());
  std::vector<uint32_t> user_of(n);
  g.off.assign(num_users + 1, 0);
  for (uint64_t k = 0; k < n; ++k) {
    user_of[k] = static_cast<uint32_t>(all_users(ratings[k].user));
    ++g.off[user_of[k] + 1];
  }
  for (uint64_t u = 0; u < num_users; ++u) g.off[u + 1] += g.off[u];
  g.items.resize(n);
  g.raw_user.resize(num_users);
  g.latest.resize(num_users);
  std::vector<int64_t> latest_ts(num_users, std::numeric_limits<int64_t>::min());
  std::vector<uint64_t> cursor(g.off.begin(), g.off.end() - 1);
  for (uint64_t k = 0; k < n; ++k) {
    const Rating& r = ratings[k];
    const uint32_t u = user_of[k];
    g.items[cursor[u]++] = r.item;
    g.raw_user[u] = r.user;
    if (r.timestamp >= latest_ts[u]) {
      latest_ts[u] = r.timestamp;
      g.latest[u] = r.item;
    }
  }
  return g;
}

// Remap stage, items: a repeated (user, item) counts once (the latest item is
// the latest rating overall, so also that item's latest), users with fewer than
// min_interactions distinct items are dropped, and the kept users' items become
// dense. The item map is monotone, so each sorted list stays sorted.
DenseRatings remap_ids(UserGroups g, uint32_t min_interactions, int threads,
                       const std::string& file) {
  DenseRatings d;
  const uint64_t raw_users = g.raw_user.size();
  d.raw_users = raw_users;
  std::vector<uint64_t> distinct(raw_users);
  parallel_ranges(threads, raw_users, [&](uint64_t b, uint64_t e) {
    for (uint64_t u = b; u < e; ++u) {
      auto first = g.items.begin() + g.off[u], last = g.items.begin() + g.off[u + 1];
      std::sort(first, last);
      distinct[u] = static_cast<uint64_t>(std::unique(first, last) - first);
    }
  });
  uint64_t kept = 0, nnz = 0;
  for (uint64_t u = 0; u < raw_users; ++u) {
    d.duplicates += (g.off[u + 1] - g.off[u]) - distinct[u];
    if (distinct[u] >= min_interactions) {
      ++kept;
      nnz += distinct[u];
    }
  }
  d.dropped = raw_users - kept;
  if (kept == 0)
    NCF_FAIL(file, ": no usable user: all ", raw_users, " users have fewer than ", min_interactions,
             " distinct rated items (one is held out for test, the rest train)");
  if (kept > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(file, ": ", kept, " users do not fit int32 ids");

  std::vector<int64_t> kept_items;
  kept_items.reserve(nnz);
  for (uint64_t u = 0; u < raw_users; ++u)
    if (distinct[u] >= min_interactions)
      kept_items.insert(kept_items.end(), g.items.begin() + g.off[u],
                        g.items.begin() + g.off[u] + distinct[u]);
  const DenseIds items(std::move(kept_items));
  d.num_items = static_cast<uint64_t>(items.size());
  d.raw_item = items.raw_ids();
  if (d.num_items > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(file, ": ", d.num_items, " items do not fit int32 ids");

  d.pos_off.assign(kept + 1, 0);
  std::vector<uint64_t> src_user(kept);  // kept → pre-drop dense user
  for (uint64_t u = 0, k = 0; u < raw_users; ++u)
    if (distinct[u] >= min_interactions) {
      src_user[k] = u;
      d.pos_off[k + 1] = d.pos_off[k] + distinct[u];
      ++k;
    }
  d.pos.resize(nnz);
  d.latest.resize(kept);
  d.raw_user.resize(kept);
  parallel_ranges(threads, kept, [&](uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t u = src_user[k];
      for (uint64_t j = 0; j < distinct[u]; ++j)
        d.pos[d.pos_off[k] + j] = static_cast<int32_t>(items(g.items[g.off[u] + j]));
      d.latest[k] = static_cast<int32_t>(items(g.latest[u]));
      d.raw_user[k] = g.raw_user[u];
    }
  });
  return d;
}

// Split stage: leave-one-out, each user's latest item held out, the rest train.
SplitUsers leave_one_out(const DenseRatings& d) {
  SplitUsers s;
  s.num_users = d.num_users();
  s.sizes = [&d](uint64_t u, uint64_t* np, uint64_t* nt) {
    *np = d.pos_off[u + 1] - d.pos_off[u];
    *nt = *np - 1;
  };
  s.split = [&d](UserBlock* b, uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = b->first_user + j;
      const int32_t* p = d.pos.data() + d.pos_off[u];
      const uint64_t np = d.pos_off[u + 1] - d.pos_off[u];
      std::copy(p, p + np, b->positives_of(j));
      int32_t* train = b->train_of(j);
      for (uint64_t q = 0; q < np; ++q)
        if (p[q] != d.latest[u]) *train++ = p[q];
      b->eval_of(j)[0] = d.latest[u];
    }
  };
  return s;
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
  const DenseRatings d =
      remap_ids(group_by_user(std::move(ratings)), opt.min_interactions, threads, file);
  const uint64_t U = d.num_users(), I = d.num_items;
  if (opt.progress)
    std::fprintf(stderr,
                 "prep: %llu users (%llu dropped with < %u items), %llu items, %llu duplicate "
                 "ratings removed (%.1f s)\n",
                 static_cast<unsigned long long>(U), static_cast<unsigned long long>(d.dropped),
                 opt.min_interactions, static_cast<unsigned long long>(I),
                 static_cast<unsigned long long>(d.duplicates), progress.seconds());

  DatasetPlan plan;
  plan.source = "movielens:" + movielens_name(file);
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = d.pos.size() - U;
  plan.num_positives = d.pos.size();
  plan.eval_negatives = opt.eval_negatives;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = opt.seed;
  plan.dropped_users = d.dropped;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.raw_users = &d.raw_user;
  plan.raw_items = &d.raw_item;
  plan.generator = {{"input", file},
                    {"format", format_name(f)},
                    {"ratings", num_ratings},
                    {"duplicates_removed", d.duplicates},
                    {"raw_users", d.raw_users},
                    {"min_interactions", opt.min_interactions}};
  EvalNegatives negatives{I, opt.eval_negatives, opt.seed, nullptr, [&](uint64_t u) {
                            return detail::concat(file, ": raw user ", d.raw_user[u]);
                          }};
  return assemble_dataset(out_dir, plan, leave_one_out(d), negatives, threads, progress);
}

std::vector<Rating> read_movielens(const std::string& file, InputFormat fmt) {
  if (fmt == InputFormat::kAuto) {
    std::string resolved;
    fmt = detect_format(file, fmt, &resolved);
    NCF_CHECK(is_movielens(fmt), file, " is not a MovieLens ratings file (", format_name(fmt), ")");
    return parse_ratings(resolved, syntax_of(fmt), resolve_threads(0));
  }
  NCF_CHECK(is_movielens(fmt), "read_movielens: not a MovieLens format: ", format_name(fmt));
  return parse_ratings(file, syntax_of(fmt), resolve_threads(0));
}

}  // namespace ncf
