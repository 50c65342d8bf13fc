// The NCF paper's preprocessed files (NAME.train.rating, NAME.test.rating,
// NAME.test.negative) → dataset, keeping their split and eval negatives
// exactly; every cross-file check names the file and line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "data/extend.h"
#include "data/prep_stages.h"
#include "data/sources.h"
#include "data/text_input.h"

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

// PREFIX.test.negative: "(user,item)" then TAB-separated negative item ids.
struct NegativeFile {
  uint64_t E = 0;  // negatives per line (the same on every line)
  std::vector<int64_t> user, item;
  std::vector<uint64_t> line;      // 1-based line of each entry
  std::vector<int32_t> negatives;  // lines x E
};

bool parse_negative_line(const char* b, const char* e, int64_t* user, int64_t* item,
                         std::vector<int32_t>* negs, std::string* why) {
  if (*b != '(') {
    *why = "expected \"(user,item)\" as the first field";
    return false;
  }
  const char* close = static_cast<const char*>(std::memchr(b, ')', static_cast<size_t>(e - b)));
  const char* comma =
      close ? static_cast<const char*>(std::memchr(b, ',', static_cast<size_t>(close - b)))
            : nullptr;
  if (!close || !comma) {
    *why = "expected \"(user,item)\" as the first field";
    return false;
  }
  if (!field_int(b + 1, comma, "user id", false, user, why) ||
      !field_int(comma + 1, close, "item id", false, item, why))
    return false;
  if (*item > std::numeric_limits<int32_t>::max()) {
    *why = detail::concat("item id ", *item, " does not fit int32");
    return false;
  }
  const char* p = close + 1;
  while (p < e) {
    if (*p != '\t') {
      *why = "expected TAB-separated negative item ids after \"(user,item)\"";
      return false;
    }
    ++p;
    const void* q = std::memchr(p, '\t', static_cast<size_t>(e - p));
    const char* fe = q ? static_cast<const char*>(q) : e;
    int64_t v;
    if (!field_int(p, fe, "negative item id", false, &v, why)) return false;
    if (v > std::numeric_limits<int32_t>::max()) {
      *why = detail::concat("negative item id ", v, " does not fit int32");
      return false;
    }
    negs->push_back(static_cast<int32_t>(v));
    p = fe;
  }
  return true;
}

NegativeFile read_negative_file(const std::string& file) {
  MappedFile m(file);
  NegativeFile nf;
  const char* b = skip_bom(m.begin(), m.end());
  const char* e = m.end();
  uint64_t line = 1;
  std::string why;
  std::vector<int32_t> negs;
  while (b < e) {
    const void* nl = std::memchr(b, '\n', static_cast<size_t>(e - b));
    const char* le = nl ? static_cast<const char*>(nl) : e;
    const char* te = trim_right(b, le);
    if (te > b) {
      int64_t u, i;
      negs.clear();
      if (!parse_negative_line(b, te, &u, &i, &negs, &why))
        throw_line_failure(file, {true, line, why, excerpt(b, te)});
      if (nf.user.empty()) {
        nf.E = negs.size();
      } else if (negs.size() != nf.E) {
        throw_line_failure(
            file, {true, line,
                   detail::concat(negs.size(), " negatives where line ", nf.line[0], " has ", nf.E),
                   excerpt(b, te)});
      }
      nf.user.push_back(u);
      nf.item.push_back(i);
      nf.line.push_back(line);
      nf.negatives.insert(nf.negatives.end(), negs.begin(), negs.end());
    }
    ++line;
    b = nl ? le + 1 : e;
  }
  if (nf.user.empty()) NCF_FAIL(file, ": empty file (only blank lines)");
  return nf;
}

// The NCF paper's three files, parsed and checked against each other. Ids are
// the files' own: users 0 .. U-1 in test-file order, items up to the largest seen.
struct PaperFiles {
  std::string prefix;
  std::vector<Rating> test;   // one per user, user u on entry u
  NegativeFile negatives;     // user u's E negatives on entry u
  std::vector<Rating> train;  // train pairs in file order
  uint64_t num_items = 0;
};

// The given split, grouped by user: distinct train items (sorted) and the test item.
struct PaperUsers {
  std::vector<uint64_t> off;  // U + 1, into train_items
  std::vector<int32_t> train_items;
  std::vector<uint64_t> train_n;  // distinct train items of user u (first of its range)
  std::vector<uint64_t> pos_n;    // distinct(train ∪ {test})
  std::vector<int32_t> test;
  uint64_t train_lines = 0, duplicates = 0, test_in_train = 0, neg_is_test = 0, neg_in_train = 0;
  uint64_t num_train = 0, num_positives = 0;
};

// Parse stage: the three files, with every cross-file check.
PaperFiles parse_paper_files(const std::string& prefix, uint32_t eval_negatives, int threads) {
  const std::string train_file = prefix + kNcfTrain;
  const std::string test_file = prefix + kNcfTest;
  const std::string neg_file = prefix + kNcfNegative;
  const RatingSyntax tab = syntax_of(InputFormat::kNcfPaper);
  PaperFiles p;
  p.prefix = prefix;

  // The test file fixes the users: one line per user, 0 .. U-1 in order.
  p.test = parse_ratings(test_file, tab, threads);
  const std::vector<Rating>& test = p.test;
  const uint64_t U = test.size();
  int64_t max_item = -1;
  for (uint64_t u = 0; u < U; ++u) {
    if (test[u].user != static_cast<int64_t>(u))
      NCF_FAIL(test_file, ":", test[u].line, ": user ", test[u].user, " where user ", u,
               " was expected (one test line per user, users 0.. in order)");
    max_item = std::max(max_item, test[u].item);
  }
  if (U > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    NCF_FAIL(test_file, ": ", U, " users do not fit int32 ids");

  p.negatives = read_negative_file(neg_file);
  const NegativeFile& neg = p.negatives;
  if (neg.E != eval_negatives)
    NCF_FAIL(neg_file, ": has ", neg.E, " negatives per user but ", eval_negatives,
             " eval negatives were requested (pass --eval_negatives ", neg.E,
             " or leave it unset)");
  for (uint64_t k = 0; k < neg.user.size(); ++k) {
    if (k >= U)
      NCF_FAIL(neg_file, ":", neg.line[k], ": user ", neg.user[k], " is not in ", test_file,
               " (which has users 0..", U - 1, ")");
    if (neg.user[k] != static_cast<int64_t>(k))
      NCF_FAIL(neg_file, ":", neg.line[k], ": user ", neg.user[k], " where user ", k,
               " was expected (same order as ", test_file, ")");
    if (neg.item[k] != test[k].item)
      NCF_FAIL(neg_file, ":", neg.line[k], ": test item ", neg.item[k], " of user ", k, " but ",
               test_file, ":", test[k].line, " has ", test[k].item);
  }
  if (neg.user.size() < U)
    NCF_FAIL(neg_file, ": has ", neg.user.size(), " users but ", test_file, " has ", U, "; user ",
             neg.user.size(), " (", test_file, ":", test[neg.user.size()].line, ") is missing");
  for (int32_t v : neg.negatives) max_item = std::max<int64_t>(max_item, v);

  p.train = parse_ratings(train_file, tab, threads);
  std::vector<uint64_t> per_user(U, 0);
  for (const Rating& r : p.train) {
    if (r.user >= static_cast<int64_t>(U))
      NCF_FAIL(train_file, ":", r.line, ": user ", r.user, " is not in ", test_file,
               " (which has users 0..", U - 1, ")");
    ++per_user[r.user];
    max_item = std::max(max_item, r.item);
  }
  for (uint64_t u = 0; u < U; ++u)
    if (per_user[u] == 0)
      NCF_FAIL(train_file, ": user ", u, " has no training pairs but is in ", test_file, ":",
               test[u].line);
  if (max_item >= std::numeric_limits<int32_t>::max())
    NCF_FAIL(prefix, ": item id ", max_item, " does not fit int32");
  p.num_items = static_cast<uint64_t>(max_item) + 1;
  return p;
}

// Remap stage: the ids stay; train pairs are grouped by user and a repeated
// pair is kept once. Counts what the metadata reports about the given split.
PaperUsers group_paper_users(PaperFiles* p) {
  PaperUsers g;
  const uint64_t U = p->test.size();
  const NegativeFile& neg = p->negatives;
  g.off.assign(U + 1, 0);
  for (const Rating& r : p->train) ++g.off[r.user + 1];
  for (uint64_t u = 0; u < U; ++u) g.off[u + 1] += g.off[u];
  g.train_items.resize(p->train.size());
  {
    std::vector<uint64_t> cursor(g.off.begin(), g.off.end() - 1);
    for (const Rating& r : p->train) g.train_items[cursor[r.user]++] = static_cast<int32_t>(r.item);
  }
  g.train_lines = p->train.size();
  std::vector<Rating>().swap(p->train);

  g.train_n.resize(U);
  g.pos_n.resize(U);
  g.test.resize(U);
  for (uint64_t u = 0; u < U; ++u) {
    auto first = g.train_items.begin() + g.off[u], last = g.train_items.begin() + g.off[u + 1];
    std::sort(first, last);
    g.train_n[u] = static_cast<uint64_t>(std::unique(first, last) - first);
    g.duplicates += (g.off[u + 1] - g.off[u]) - g.train_n[u];
    g.test[u] = static_cast<int32_t>(p->test[u].item);
    const bool has_test = std::binary_search(first, first + g.train_n[u], g.test[u]);
    g.test_in_train += has_test;
    g.pos_n[u] = g.train_n[u] + (has_test ? 0 : 1);
    const int32_t* ng = neg.negatives.data() + u * neg.E;
    for (uint64_t j = 0; j < neg.E; ++j) {
      g.neg_is_test += ng[j] == g.test[u];
      g.neg_in_train += std::binary_search(first, first + g.train_n[u], ng[j]);
    }
    g.num_train += g.train_n[u];
    g.num_positives += g.pos_n[u];
  }
  return g;
}

// Split stage: the files' own split, positives = train ∪ {test}.
SplitUsers paper_split(const PaperUsers& g) {
  SplitUsers s;
  s.num_users = g.test.size();
  s.sizes = [&g](uint64_t u, uint64_t* np, uint64_t* nt) {
    *np = g.pos_n[u];
    *nt = g.train_n[u];
  };
  s.split = [&g](UserBlock* b, uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const uint64_t u = b->first_user + j;
      const int32_t* tr = g.train_items.data() + g.off[u];
      const int32_t* tr_end = tr + g.train_n[u];
      const int32_t t = g.test[u];
      std::copy(tr, tr_end, b->train_of(j));
      // Sorted merge of the train items and the test item, which may be among them.
      const int32_t* at = std::lower_bound(tr, tr_end, t);
      int32_t* pos = std::copy(tr, at, b->positives_of(j));
      if (at == tr_end || *at != t) *pos++ = t;
      std::copy(at, tr_end, pos);
      b->eval_of(j)[0] = t;
    }
  };
  return s;
}

}  // namespace

DatasetMeta prepare_ncf_paper(const std::string& prefix_in, const std::string& out_dir,
                              const PrepOptions& opt) {
  const PrepProgress progress{opt.progress, "prep", Clock::now()};
  const int threads = resolve_threads(opt.threads);
  std::string prefix;
  detect_format(prefix_in, InputFormat::kNcfPaper, &prefix);
  PaperFiles files = parse_paper_files(prefix, opt.eval_negatives, threads);
  const PaperUsers users = group_paper_users(&files);
  const uint64_t U = users.test.size(), I = files.num_items, E = files.negatives.E;
  if (opt.progress)
    std::fprintf(stderr,
                 "prep: %llu users, %llu items, %llu train pairs, %llu eval negatives each "
                 "(%.1f s)\n",
                 static_cast<unsigned long long>(U), static_cast<unsigned long long>(I),
                 static_cast<unsigned long long>(users.num_train),
                 static_cast<unsigned long long>(E), progress.seconds());

  DatasetPlan plan;
  // --extend: dense ids extend the parent's by identity (extend.h).
  if (!opt.extend.prev.empty()) plan.lineage = identity_lineage(opt.extend.prev);
  plan.source = "ncf-paper:" + basename_of(prefix);
  plan.num_users = U;
  plan.num_items = I;
  plan.num_train = users.num_train;
  plan.num_positives = users.num_positives;
  plan.eval_negatives = static_cast<uint32_t>(E);
  plan.eval_sampling = EvalSampling::kGiven;
  plan.record_rows = opt.record_rows;
  plan.num_shards = opt.num_shards;
  plan.seed = opt.seed;
  plan.dropped_users = 0;
  plan.shuffle_buffer_bytes = opt.shuffle_buffer_bytes;
  plan.generator = {{"input", prefix},
                    {"format", format_name(InputFormat::kNcfPaper)},
                    {"train_lines", users.train_lines},
                    {"duplicates_removed", users.duplicates},
                    {"test_items_in_train", users.test_in_train},
                    {"negatives_equal_to_test", users.neg_is_test},
                    {"negatives_in_train", users.neg_in_train}};
  EvalNegatives negatives{I, static_cast<uint32_t>(E), opt.seed, files.negatives.negatives.data(),
                          nullptr};
  return assemble_dataset(out_dir, plan, paper_split(users), negatives, threads, progress);
}

}  // namespace ncf
