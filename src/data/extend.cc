// ncf_prep --extend: see extend.h.
#include "data/extend.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <numeric>
#include <tuple>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"
#include "data/id_map.h"
#include "data/prep_stages.h"

namespace ncf {
namespace {

// When an id was last active: the generation, then the time (larger: later).
struct Recency {
  uint64_t generation = 0;
  int64_t time = std::numeric_limits<int64_t>::min();
  bool operator<(const Recency& o) const {
    return generation != o.generation ? generation < o.generation : time < o.time;
  }
};

// PREV's per-id recency: its activity file, or, for a dataset written
// without one, its generation with no time (every id ties).
std::vector<Recency> prev_recency(const std::string& dir, const DatasetMeta& meta, int which) {
  const uint64_t n = which == 0 ? meta.num_users : meta.num_items;
  std::vector<Recency> r(n, Recency{meta.generation(), std::numeric_limits<int64_t>::min()});
  if (meta.activity.empty()) return r;
  const IdMapInfo& info = meta.activity[size_t(which)];
  const std::string path = dir + "/" + info.name;
  std::vector<int64_t> a(2 * n);
  FileHandle f(path, O_RDONLY);
  if (uint64_t(f.size()) != info.bytes)
    NCF_FAIL(path, ": file has ", f.size(), " bytes but the metadata says ", info.bytes);
  f.read_at(0, a.data(), a.size() * 8);
  if (crc32c(a.data(), a.size() * 8) != info.crc32c)
    NCF_FAIL(path, ": file CRC-32C does not match the metadata's; re-run ncf_prep");
  for (uint64_t d = 0; d < n; ++d) r[d] = {uint64_t(a[2 * d]), a[2 * d + 1]};
  return r;
}

// The ids of one table after the bound: candidates are PREV's ids (codes
// 0 .. P-1) then the new ones (codes P ..), in the order dense ids follow.
struct Kept {
  std::vector<int32_t> dense;  // code -> dense id, or -1 when dropped
  uint64_t kept_prev = 0, kept_new = 0, dropped_prev = 0, dropped_new = 0;
};

Kept keep_most_recent(const std::vector<Recency>& recency, uint64_t prev, uint64_t bound) {
  const uint64_t n = recency.size();
  Kept k;
  k.dense.assign(n, 0);
  if (bound > 0 && n > bound) {
    // The `bound` latest; ties to the lower code.
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    auto later = [&](uint32_t a, uint32_t b) {
      if (recency[a] < recency[b]) return false;
      if (recency[b] < recency[a]) return true;
      return a < b;
    };
    std::nth_element(order.begin(), order.begin() + ptrdiff_t(bound), order.end(), later);
    for (uint64_t j = bound; j < n; ++j) k.dense[order[j]] = -1;
  }
  int32_t next = 0;
  for (uint64_t c = 0; c < n; ++c) {
    const bool in = k.dense[c] == 0;
    k.dense[c] = in ? next++ : -1;
    if (c < prev)
      (in ? k.kept_prev : k.dropped_prev)++;
    else
      (in ? k.kept_new : k.dropped_new)++;
  }
  return k;
}

}  // namespace

nlohmann::json identity_lineage(const std::string& prev_dir) {
  const DatasetMeta prev = DatasetMeta::load(prev_dir);
  if (!prev.id_maps.empty())
    NCF_FAIL("--extend ", prev_dir, ": the dataset has original ids (", prev.id_maps[0].name,
             "), but this input's ids are dense (NCF-paper, TF Model Garden, synthetic): extend it "
             "with the same kind of input it was made from");
  std::vector<std::string> ancestors{prev.dataset_id};
  for (const std::string& a : prev.ancestors()) ancestors.push_back(a);
  return {{"generation", prev.generation() + 1},
          {"ids", "identity"},
          {"parent",
           {{"dataset_id", prev.dataset_id},
            {"path", std::filesystem::absolute(prev_dir).lexically_normal().string()},
            {"num_users", prev.num_users},
            {"num_items", prev.num_items},
            {"generation", prev.generation()}}},
          {"ancestors", ancestors}};
}

namespace {

// A dense user's records: its history (PREV's positives of kept items), its
// log items, the held-out one, and what its log rows counted.
struct UserLists {
  std::vector<int32_t> positives, train;
  int32_t held_out = -1;
  uint64_t repeats = 0, dropped_rows = 0;
};

// PREV, checked to be extensible by a log of `log`'s kind of ids.
DatasetMeta load_parent(const std::string& prev_dir, const KeyedLog& log, const std::string& file) {
  DatasetMeta prev = DatasetMeta::load(prev_dir);
  if (prev.id_maps.empty())
    NCF_FAIL("--extend ", prev_dir, ": the dataset has dense ids only (", prev.source, "), but ",
             file, " has its own ids: a log extends a dataset made from a log");
  if (prev.id_maps[0].strings != log.strings)
    NCF_FAIL("--extend ", prev_dir, ": the dataset's ids are ",
             prev.id_maps[0].strings ? "strings" : "integers", " (", prev.id_maps[0].name, "), ",
             file, "'s are ", log.strings ? "strings" : "integers",
             ": extend it with the same kind of input it was made from");
  return prev;
}

// extend_dataset's stages, run in the order they are declared; each fills the
// members above it. Keys are the log's (user and item keys of Interactions),
// codes the candidates' (PREV's ids, then the new ones), dense ids the
// extension's.
struct Extension {
  Extension(KeyedLog& log_, const PrepOptions& opt_, const std::string& file_)
      : log(log_),
        opt(opt_),
        file(file_),
        prev_dir(opt_.extend.prev),
        threads(resolve_threads(opt_.threads)),
        prev(load_parent(prev_dir, log_, file_)),
        prev_maps(load_id_maps(prev_dir, prev)),
        prev_pos(prev_dir, prev),
        P_u(prev.num_users),
        P_i(prev.num_items),
        G(prev.generation() + 1),
        in(log_.in),
        n(in.user.size()),
        UK(in.num_user_keys),
        IK(in.num_item_keys) {}

  KeyedLog& log;
  const PrepOptions& opt;
  const std::string& file;
  const std::string& prev_dir;
  const int threads;
  const DatasetMeta prev;
  const IdMaps prev_maps;
  const PositiveLists prev_pos;
  const uint64_t P_u, P_i, G;
  Interactions& in;
  const uint64_t n, UK, IK;

  int64_t time_of(uint64_t k) const { return in.time.empty() ? int64_t(k) : in.time[k]; }
  // The later of two rows: by time, then by row.
  bool later(uint64_t a, uint64_t b) const {
    const int64_t ta = time_of(a), tb = time_of(b);
    return ta != tb ? ta > tb : a > b;
  }

  // Rows by user key (file order), then each user's distinct items with their
  // latest row first in its range.
  std::vector<uint64_t> off, rows, distinct;
  uint64_t total_distinct = 0;
  void group_rows() {
    off.assign(UK + 1, 0);
    for (uint64_t k = 0; k < n; ++k) ++off[in.user[k] + 1];
    for (uint64_t u = 0; u < UK; ++u) off[u + 1] += off[u];
    rows.resize(n);
    {
      std::vector<uint64_t> cursor(off.begin(), off.end() - 1);
      for (uint64_t k = 0; k < n; ++k) rows[cursor[in.user[k]]++] = k;
    }
    distinct.assign(UK, 0);
    parallel_ranges(threads, UK, [&](uint64_t b, uint64_t e) {
      for (uint64_t u = b; u < e; ++u) {
        auto first = rows.begin() + ptrdiff_t(off[u]), last = rows.begin() + ptrdiff_t(off[u + 1]);
        // By item, the latest row of each item first; then one row per item.
        std::sort(first, last, [&](uint64_t a, uint64_t c) {
          return in.item[a] != in.item[c] ? in.item[a] < in.item[c] : later(a, c);
        });
        distinct[u] =
            uint64_t(std::unique(first, last,
                                 [&](uint64_t a, uint64_t c) { return in.item[a] == in.item[c]; }) -
                     first);
      }
    });
    for (uint64_t u = 0; u < UK; ++u) total_distinct += distinct[u];
  }

  // PREV's dense id of each key, or -1.
  std::vector<int64_t> prev_of_ukey, prev_of_ikey;
  void find_prev_ids() {
    prev_of_ukey.resize(UK);
    prev_of_ikey.resize(IK);
    parallel_ranges(threads, UK, [&](uint64_t b, uint64_t e) {
      for (uint64_t u = b; u < e; ++u) {
        const auto d = log.strings ? prev_maps.user.find(log.user_strings[u])
                                   : prev_maps.user.dense(log.user_ids[u]);
        prev_of_ukey[u] = d ? *d : -1;
      }
    });
    parallel_ranges(threads, IK, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) {
        const auto d = log.strings ? prev_maps.item.find(log.item_strings[i])
                                   : prev_maps.item.dense(log.item_ids[i]);
        prev_of_ikey[i] = d ? *d : -1;
      }
    });
  }

  // New users need min_interactions distinct items; known ones never drop.
  std::vector<uint8_t> ukey_ok;
  uint64_t too_few = 0;
  void pick_users() {
    ukey_ok.assign(UK, 0);
    for (uint64_t u = 0; u < UK; ++u) {
      ukey_ok[u] = prev_of_ukey[u] >= 0 || distinct[u] >= opt.min_interactions;
      too_few += !ukey_ok[u] && off[u + 1] > off[u];
    }
  }

  // Recency of every candidate: PREV's ids (codes below P), then the new ones.
  std::vector<Recency> urec, irec;
  std::vector<int64_t> code_of_ukey, code_of_ikey;
  std::vector<uint64_t> ukey_of_code, ikey_of_code;  // new codes' keys
  void rank_candidates() {
    urec = prev_recency(prev_dir, prev, 0);
    irec = prev_recency(prev_dir, prev, 1);
    code_of_ukey.assign(UK, -1);
    code_of_ikey.assign(IK, -1);
    for (uint64_t u = 0; u < UK; ++u) {
      if (!ukey_ok[u]) continue;
      if (prev_of_ukey[u] >= 0) {
        code_of_ukey[u] = prev_of_ukey[u];
      } else {
        code_of_ukey[u] = int64_t(urec.size());
        urec.push_back({});
        ukey_of_code.push_back(u);
      }
      Recency r{G, std::numeric_limits<int64_t>::min()};
      for (uint64_t j = off[u]; j < off[u] + distinct[u]; ++j)
        r.time = std::max(r.time, time_of(rows[j]));
      urec[size_t(code_of_ukey[u])] = r;
    }
    // Items of the kept users' rows, new ones in key order (ascending ids).
    std::vector<Recency> ikey_rec(IK, Recency{0, std::numeric_limits<int64_t>::min()});
    std::vector<uint8_t> ikey_used(IK, 0);
    for (uint64_t u = 0; u < UK; ++u) {
      if (!ukey_ok[u]) continue;
      for (uint64_t j = off[u]; j < off[u] + distinct[u]; ++j) {
        const uint32_t i = in.item[rows[j]];
        ikey_used[i] = 1;
        ikey_rec[i] = {G, std::max(ikey_rec[i].time, time_of(rows[j]))};
      }
    }
    for (uint64_t i = 0; i < IK; ++i) {
      if (!ikey_used[i]) continue;
      if (prev_of_ikey[i] >= 0) {
        code_of_ikey[i] = prev_of_ikey[i];
      } else {
        code_of_ikey[i] = int64_t(irec.size());
        irec.push_back({});
        ikey_of_code.push_back(i);
      }
      irec[size_t(code_of_ikey[i])] = ikey_rec[i];
    }
  }

  // The candidates the bounds keep, and each dense id's PREV id and key (or -1).
  Kept ku, ki;
  uint64_t U = 0, I = 0;
  std::vector<int64_t> user_prev, user_key, item_prev, item_key;
  std::vector<int32_t> item_of_prev, item_of_ikey;  // PREV item / item key -> dense item
  void keep_and_number() {
    ku = keep_most_recent(urec, P_u, opt.extend.max_users);
    ki = keep_most_recent(irec, P_i, opt.extend.max_items);
    U = ku.kept_prev + ku.kept_new;
    I = ki.kept_prev + ki.kept_new;
    if (U > uint64_t(INT32_MAX) || I > uint64_t(INT32_MAX))
      NCF_FAIL(file, ": extending ", prev_dir, " gives ", U, " users and ", I,
               " items, beyond int32 ids");
    user_prev.assign(U, -1);
    user_key.assign(U, -1);
    item_prev.assign(I, -1);
    item_key.assign(I, -1);
    item_of_prev.assign(P_i, -1);
    for (uint64_t c = 0; c < P_u; ++c)
      if (ku.dense[c] >= 0) user_prev[size_t(ku.dense[c])] = int64_t(c);
    for (uint64_t c = 0; c < P_i; ++c)
      if (ki.dense[c] >= 0) {
        item_prev[size_t(ki.dense[c])] = int64_t(c);
        item_of_prev[c] = ki.dense[c];
      }
    for (uint64_t u = 0; u < UK; ++u)
      if (code_of_ukey[u] >= 0 && ku.dense[size_t(code_of_ukey[u])] >= 0)
        user_key[size_t(ku.dense[size_t(code_of_ukey[u])])] = int64_t(u);
    item_of_ikey.assign(IK, -1);
    for (uint64_t i = 0; i < IK; ++i)
      if (code_of_ikey[i] >= 0 && ki.dense[size_t(code_of_ikey[i])] >= 0) {
        item_of_ikey[i] = ki.dense[size_t(code_of_ikey[i])];
        item_key[size_t(item_of_ikey[i])] = int64_t(i);
      }
  }

  // Dense user u's lists; computed twice (sizes, then the lists), in parallel.
  void lists_of(uint64_t u, UserLists* l) const {
    l->positives.clear();
    l->train.clear();
    l->held_out = -1;
    l->repeats = l->dropped_rows = 0;
    if (user_prev[u] >= 0) {
      const uint64_t p = uint64_t(user_prev[u]);
      for (const int32_t* it = prev_pos.begin(p); it != prev_pos.end(p); ++it)
        if (item_of_prev[size_t(*it)] >= 0) l->positives.push_back(item_of_prev[size_t(*it)]);
    }
    const size_t history = l->positives.size();  // ascending: the kept PREV items keep their order
    if (user_key[u] < 0) return;
    const uint64_t k = uint64_t(user_key[u]);
    uint64_t best_row = 0;
    for (uint64_t j = off[k]; j < off[k] + distinct[k]; ++j) {
      const int32_t item = item_of_ikey[in.item[rows[j]]];
      if (item < 0) {
        ++l->dropped_rows;
        continue;
      }
      const bool seen =
          std::binary_search(l->positives.begin(), l->positives.begin() + ptrdiff_t(history), item);
      l->repeats += seen;
      l->train.push_back(item);
      if (!seen && (l->held_out < 0 || later(rows[j], best_row))) {
        l->held_out = item;
        best_row = rows[j];
      }
    }
    for (int32_t item : l->train)
      if (!std::binary_search(l->positives.begin(), l->positives.begin() + ptrdiff_t(history),
                              item))
        l->positives.push_back(item);
    std::sort(l->positives.begin(), l->positives.end());
    if (l->held_out >= 0) l->train.erase(std::find(l->train.begin(), l->train.end(), l->held_out));
    std::sort(l->train.begin(), l->train.end());
  }

  // Each dense user's list sizes and held-out item, and the totals; refuses
  // an extension with nothing to train on or evaluate.
  std::vector<uint32_t> np, nt;
  std::vector<int32_t> held;
  uint64_t repeats = 0, dropped_rows = 0, num_train = 0, num_positives = 0, num_eval = 0;
  void size_lists() {
    // A user's lists hold fewer than num_items (< 2^31) entries; the counts
    // of repeats and dropped rows are sums, whatever order the ranges end in.
    np.resize(U);
    nt.resize(U);
    held.resize(U);
    std::atomic<uint64_t> repeat_sum{0}, dropped_sum{0};
    parallel_ranges(threads, U, [&](uint64_t b, uint64_t e) {
      UserLists l;
      uint64_t rep = 0, dro = 0;
      for (uint64_t u = b; u < e; ++u) {
        lists_of(u, &l);
        np[u] = uint32_t(l.positives.size());
        nt[u] = uint32_t(l.train.size());
        held[u] = l.held_out;
        rep += l.repeats;
        dro += l.dropped_rows;
      }
      repeat_sum += rep;
      dropped_sum += dro;
    });
    repeats = repeat_sum;
    dropped_rows = dropped_sum;
    // Rows of users dropped by the bound.
    for (uint64_t u = 0; u < UK; ++u)
      if (ukey_ok[u] && ku.dense[size_t(code_of_ukey[u])] < 0) dropped_rows += distinct[u];
    for (uint64_t u = 0; u < U; ++u) {
      num_train += nt[u];
      num_positives += np[u];
      num_eval += held[u] >= 0;
    }
    if (num_eval == 0 || num_train == 0)
      NCF_FAIL(file, ": extending ", prev_dir, " leaves ", num_train, " training pairs and ",
               num_eval,
               " users with a new item to hold out for evaluation: the log adds nothing to "
               "train on and evaluate (every interaction repeats one the dataset has, or was "
               "dropped)");
  }

  // The maps, activity and dropped ids.
  std::vector<int64_t> raw_user, raw_item, drop_user_ids, drop_item_ids;
  StringList str_user, str_item, drop_user_str, drop_item_str;
  std::vector<int64_t> user_activity, item_activity;
  void add_id(int which, int64_t prev_id, int64_t key, std::vector<int64_t>* ints,
              StringList* strs) const {
    const IdMap& pm = which == 0 ? prev_maps.user : prev_maps.item;
    if (log.strings)
      strs->push_back(prev_id >= 0 ? pm.string(prev_id)
                                   : (which == 0 ? log.user_strings[uint64_t(key)]
                                                 : log.item_strings[uint64_t(key)]));
    else
      ints->push_back(
          prev_id >= 0 ? pm.raw(prev_id)
                       : (which == 0 ? log.user_ids[uint64_t(key)] : log.item_ids[uint64_t(key)]));
  }
  void id_files() {
    for (uint64_t u = 0; u < U; ++u) add_id(0, user_prev[u], user_key[u], &raw_user, &str_user);
    for (uint64_t i = 0; i < I; ++i) add_id(1, item_prev[i], item_key[i], &raw_item, &str_item);
    for (uint64_t c = 0; c < ku.dense.size(); ++c)
      if (ku.dense[c] < 0)
        add_id(0, c < P_u ? int64_t(c) : -1, c < P_u ? -1 : int64_t(ukey_of_code[c - P_u]),
               &drop_user_ids, &drop_user_str);
    for (uint64_t c = 0; c < ki.dense.size(); ++c)
      if (ki.dense[c] < 0)
        add_id(1, c < P_i ? int64_t(c) : -1, c < P_i ? -1 : int64_t(ikey_of_code[c - P_i]),
               &drop_item_ids, &drop_item_str);
    user_activity.resize(2 * U);
    item_activity.resize(2 * I);
    for (uint64_t c = 0; c < ku.dense.size(); ++c)
      if (ku.dense[c] >= 0) {
        user_activity[2 * size_t(ku.dense[c])] = int64_t(urec[c].generation);
        user_activity[2 * size_t(ku.dense[c]) + 1] = urec[c].time;
      }
    for (uint64_t c = 0; c < ki.dense.size(); ++c)
      if (ki.dense[c] >= 0) {
        item_activity[2 * size_t(ki.dense[c])] = int64_t(irec[c].generation);
        item_activity[2 * size_t(ki.dense[c]) + 1] = irec[c].time;
      }
  }

  // metadata.json's "lineage": the parent, and every count of the extension.
  nlohmann::json lineage() const {
    std::vector<std::string> ancestors{prev.dataset_id};
    for (const std::string& a : prev.ancestors()) ancestors.push_back(a);
    auto counts = [](uint64_t parent, const Kept& k, uint64_t bound) {
      return nlohmann::json{{"parent", parent},
                            {"kept", k.kept_prev},
                            {"new", k.kept_new},
                            {"dropped", k.dropped_prev},
                            {"new_dropped", k.dropped_new},
                            {"max", bound},
                            {"renumbered", k.dropped_prev > 0}};
    };
    return {{"generation", G},
            {"ids", "original"},
            {"parent",
             {{"dataset_id", prev.dataset_id},
              {"path", std::filesystem::absolute(prev_dir).lexically_normal().string()},
              {"num_users", P_u},
              {"num_items", P_i},
              {"generation", G - 1}}},
            {"ancestors", ancestors},
            {"users", counts(P_u, ku, opt.extend.max_users)},
            {"items", counts(P_i, ki, opt.extend.max_items)},
            {"too_few_interactions", too_few},
            {"log",
             {{"rows", n},
              {"duplicates_removed", n - total_distinct},
              {"repeats_of_history", repeats},
              {"dropped_with_ids", dropped_rows}}},
            {"eval_users", num_eval}};
  }

  // The counts, maps and lineage into `plan`, then the dataset.
  DatasetMeta write(DatasetPlan& plan, const std::string& out_dir, const PrepProgress& progress) {
    plan.lineage = lineage();
    plan.num_users = U;
    plan.num_items = I;
    plan.num_train = num_train;
    plan.num_positives = num_positives;
    plan.num_eval_users = num_eval;
    plan.dropped_users = too_few;
    plan.ids_in_lineage_order = true;
    plan.user_activity = &user_activity;
    plan.item_activity = &item_activity;
    if (log.strings) {
      plan.user_strings = &str_user;
      plan.item_strings = &str_item;
      plan.dropped_user_strings = &drop_user_str;
      plan.dropped_item_strings = &drop_item_str;
    } else {
      plan.raw_users = &raw_user;
      plan.raw_items = &raw_item;
      plan.dropped_user_ids = &drop_user_ids;
      plan.dropped_item_ids = &drop_item_ids;
    }
    SplitUsers split;
    split.num_users = U;
    split.sizes = [&](uint64_t u, uint64_t* p, uint64_t* t) {
      *p = np[u];
      *t = nt[u];
    };
    split.evaluated = [&](uint64_t u) { return held[u] >= 0; };
    split.split = [&](UserBlock* b, uint64_t begin, uint64_t end) {
      UserLists l;
      for (uint64_t j = begin; j < end; ++j) {
        lists_of(b->first_user + j, &l);
        std::copy(l.positives.begin(), l.positives.end(), b->positives_of(j));
        std::copy(l.train.begin(), l.train.end(), b->train_of(j));
        b->eval_of(j)[0] = l.held_out;
      }
    };
    EvalNegatives negatives{I, opt.eval_negatives, opt.seed, nullptr, [&](uint64_t u) {
                              return detail::concat(file, ": user ",
                                                    log.strings
                                                        ? "\"" + std::string(str_user[u]) + "\""
                                                        : std::to_string(raw_user[u]));
                            }};
    return assemble_dataset(out_dir, plan, split, negatives, threads, progress);
  }
};

}  // namespace

DatasetMeta extend_dataset(KeyedLog log, DatasetPlan plan, const PrepOptions& opt,
                           const std::string& out_dir, const std::string& file) {
  const PrepProgress progress{opt.progress, "prep", std::chrono::steady_clock::now()};
  Extension x(log, opt, file);
  x.group_rows();
  x.find_prev_ids();
  x.pick_users();
  x.rank_candidates();
  x.keep_and_number();
  x.size_lists();
  x.id_files();
  if (opt.progress)
    std::fprintf(stderr, "prep: extended %s by %llu rows: %llu users, %llu items (%.1f s)\n",
                 x.prev_dir.c_str(), static_cast<unsigned long long>(x.n),
                 static_cast<unsigned long long>(x.U), static_cast<unsigned long long>(x.I),
                 progress.seconds());
  return x.write(plan, out_dir, progress);
}

}  // namespace ncf
