// Grouping by user, duplicates, the drop rule and leave-one-out: see
// interactions.h. The passes over the rows run on the pool by ranges of user
// keys (each thread reads every row and handles its own users), so no two
// threads write one user's entries and the result is the serial one.
#include "data/interactions.h"

#include <algorithm>
#include <limits>

#include "common/check.h"
#include "common/parallel.h"

namespace ncf {

namespace {

template <typename T>
void release(std::vector<T>& v) {
  std::vector<T>().swap(v);
}

// fn(lo, hi) for `parts` ranges of [0, keys) on the pool, one range per part.
void for_key_ranges(int parts, uint64_t keys, const std::function<void(uint64_t, uint64_t)>& fn) {
  parallel_ranges(parts, static_cast<uint64_t>(parts), [&](uint64_t p0, uint64_t p1) {
    for (uint64_t p = p0; p < p1; ++p)
      fn(keys * p / uint64_t(parts), keys * (p + 1) / uint64_t(parts));
  });
}

// Rows per user key (at off[u + 1]) and the item and time of each user's
// latest row: in file order, with >=, so the later row wins a tie. Each
// item's latest time.
struct Latest {
  std::vector<uint64_t> off;
  std::vector<uint32_t> latest_key;
  std::vector<int64_t> latest_t, item_t;
};

Latest latest_rows(const Interactions& in, int parts) {
  const uint64_t n = in.user.size(), UK = in.num_user_keys, IK = in.num_item_keys;
  Latest l;
  std::vector<uint64_t>& off = l.off;
  std::vector<uint32_t>& latest_key = l.latest_key;
  std::vector<int64_t>&latest_t = l.latest_t, &item_t = l.item_t;
  off.assign(UK + 1, 0);
  latest_key.assign(UK, 0);
  latest_t.assign(UK, std::numeric_limits<int64_t>::min());
  item_t.assign(IK, std::numeric_limits<int64_t>::min());
  for_key_ranges(parts, UK, [&](uint64_t lo, uint64_t hi) {
    for (uint64_t k = 0; k < n; ++k) {
      const uint32_t u = in.user[k];
      if (u < lo || u >= hi) continue;
      ++off[u + 1];
      const int64_t t = in.time.empty() ? int64_t(k) : in.time[k];
      if (t >= latest_t[u]) {
        latest_t[u] = t;
        latest_key[u] = in.item[k];
      }
    }
  });
  for_key_ranges(parts, IK, [&](uint64_t lo, uint64_t hi) {
    for (uint64_t k = 0; k < n; ++k) {
      const uint32_t i = in.item[k];
      if (i >= lo && i < hi)
        item_t[i] = std::max(item_t[i], in.time.empty() ? int64_t(k) : in.time[k]);
    }
  });
  return l;
}

}  // namespace

HeldOutUsers hold_out_latest(Interactions in, uint32_t min_interactions, int threads,
                             const std::string& file) {
  HeldOutUsers d;
  const uint64_t n = in.user.size();
  NCF_CHECK(in.item.size() == n && (in.time.empty() || in.time.size() == n), "interactions: ", n,
            " users, ", in.item.size(), " items, ", in.time.size(), " times");
  d.interactions = n;
  const uint64_t UK = in.num_user_keys, IK = in.num_item_keys;
  const int parts = std::max(1, threads);

  Latest l = latest_rows(in, parts);
  std::vector<uint64_t>& off = l.off;
  const std::vector<uint32_t>& latest_key = l.latest_key;
  const std::vector<int64_t>&latest_t = l.latest_t, &item_t = l.item_t;
  release(in.time);
  uint64_t present = 0;
  for (uint64_t u = 0; u < UK; ++u) {
    present += off[u + 1] > 0;
    off[u + 1] += off[u];
  }
  d.raw_users = present;

  // Each user's items, in file order (a stable counting sort).
  std::vector<uint32_t> grouped(n);
  {
    std::vector<uint64_t> cursor(off.begin(), off.end() - 1);
    for_key_ranges(parts, UK, [&](uint64_t lo, uint64_t hi) {
      for (uint64_t k = 0; k < n; ++k) {
        const uint32_t u = in.user[k];
        if (u >= lo && u < hi) grouped[cursor[u]++] = in.item[k];
      }
    });
  }
  release(in.user);
  release(in.item);

  // Distinct items per user, ascending, at the front of the user's range.
  std::vector<uint32_t> distinct(UK, 0);
  parallel_ranges(threads, UK, [&](uint64_t b, uint64_t e) {
    for (uint64_t u = b; u < e; ++u) {
      auto first = grouped.begin() + ptrdiff_t(off[u]),
           last = grouped.begin() + ptrdiff_t(off[u + 1]);
      std::sort(first, last);
      distinct[u] = static_cast<uint32_t>(std::unique(first, last) - first);
    }
  });
  uint64_t kept = 0, nnz = 0, total_distinct = 0;
  for (uint64_t u = 0; u < UK; ++u) {
    total_distinct += distinct[u];
    if (off[u + 1] > off[u] && distinct[u] >= min_interactions) {
      ++kept;
      nnz += distinct[u];
    }
  }
  d.duplicates = n - total_distinct;
  d.dropped = present - kept;
  if (kept == 0)
    NCF_FAIL(file, ": no usable user: all ", present, " users have fewer than ", min_interactions,
             " distinct rated items (one is held out for test, the rest train)");
  if (kept > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(file, ": ", kept, " users do not fit int32 ids");

  // Items: dense over the kept users' items, in key order.
  std::vector<int32_t> item_dense(IK, -1);
  d.user_key.reserve(kept);
  d.pos_off.assign(kept + 1, 0);
  for (uint64_t u = 0; u < UK; ++u) {
    if (off[u + 1] == off[u] || distinct[u] < min_interactions) continue;
    for (uint64_t j = off[u]; j < off[u] + distinct[u]; ++j) item_dense[grouped[j]] = 0;
    d.user_key.push_back(static_cast<uint32_t>(u));
    d.pos_off[d.user_key.size()] = d.pos_off[d.user_key.size() - 1] + distinct[u];
  }
  for (uint64_t i = 0; i < IK; ++i)
    if (item_dense[i] == 0) {
      if (d.item_key.size() >= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
        NCF_FAIL(file, ": more items than int32 ids hold");
      item_dense[i] = static_cast<int32_t>(d.item_key.size());
      d.item_key.push_back(static_cast<uint32_t>(i));
    }

  // The kept users' lists with dense items; the item map is monotone, so each
  // sorted list stays sorted.
  d.user_time.resize(kept);
  d.item_time.resize(d.item_key.size());
  for (uint64_t k = 0; k < kept; ++k) d.user_time[k] = latest_t[d.user_key[k]];
  for (uint64_t i = 0; i < d.item_key.size(); ++i) d.item_time[i] = item_t[d.item_key[i]];
  d.pos.resize(nnz);
  d.latest.resize(kept);
  parallel_ranges(threads, kept, [&](uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      const uint32_t u = d.user_key[k];
      int32_t* out = d.pos.data() + d.pos_off[k];
      for (uint64_t j = 0; j < distinct[u]; ++j) out[j] = item_dense[grouped[off[u] + j]];
      d.latest[k] = item_dense[latest_key[u]];
    }
  });
  return d;
}

void activity_of(const HeldOutUsers& d, std::vector<int64_t>* users, std::vector<int64_t>* items) {
  users->assign(2 * d.num_users(), 0);
  items->assign(2 * d.num_items(), 0);
  for (uint64_t u = 0; u < d.num_users(); ++u) (*users)[2 * u + 1] = d.user_time[u];
  for (uint64_t i = 0; i < d.num_items(); ++i) (*items)[2 * i + 1] = d.item_time[i];
}

SplitUsers leave_one_out(const HeldOutUsers& d) {
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

}  // namespace ncf
