// Popularity baseline: score every item by its number of training positives
// and rank each user's eval list by it, with ncf_dist's protocol (the positive
// loses ties, masked duplicates are not counted). The floor a trained NeuMF
// has to clear on the same eval records.
//
// The ranking is done twice, by the naive loop below and by the trainer's
// hit_ndcg kernel (src/model/metrics.h); the program fails if they disagree.
//
//   bench_popularity --data_dir DIR [--topk 10] [--json FILE]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "data/dataset.h"
#include "data/reader.h"
#include "model/metrics.h"

namespace ncf {
namespace {

struct Options {
  std::string data_dir;
  int topk = 10;
  std::string json;
};

int run(const Options& o) {
  NCF_CHECK(o.topk > 0, "flag --topk must be > 0, got ", o.topk);
  const DatasetMeta meta = DatasetMeta::load(o.data_dir);
  const int64_t I = int64_t(meta.num_items), L = meta.eval_negatives + 1;

  // Item popularity over one pass of the train stream (record order is irrelevant).
  std::vector<int64_t> count(I, 0);
  TrainReader train(o.data_dir, meta, 0, 1, int64_t(meta.train_record_rows), meta.seed,
                    /*shuffle_records=*/false);
  train.start_epoch(0);
  TrainBatch tb;
  uint64_t seen = 0;
  while (train.next(&tb)) {
    for (int32_t i : tb.items) ++count[i];
    seen += tb.items.size();
  }
  NCF_CHECK(seen == meta.num_train, "train stream gave ", seen, " positives, metadata says ",
            meta.num_train);

  EvalReader eval(o.data_dir, meta, 0, 1, std::max<int64_t>(1, 100000 / L));
  eval.start();
  EvalBatch eb;
  double hr = 0, ndcg = 0, hr_k = 0, ndcg_k = 0;
  int64_t users = 0, ties = 0;
  std::vector<float> scores;
  const ExecContext ctx;  // CPU, one thread
  while (eval.next(&eb)) {
    const int64_t n = eb.num_users;
    for (int64_t u = 0; u < n; ++u) {
      const int32_t* it = &eb.items[u * L];
      const uint8_t* m = &eb.mask[u * L];
      const int64_t pos = count[it[0]];
      int64_t rank = 0;
      for (int64_t j = 1; j < L; ++j) {
        if (!m[j]) continue;
        if (count[it[j]] >= pos) ++rank;  // ties rank above the positive
        if (count[it[j]] == pos) ++ties;
      }
      if (rank < o.topk) {
        hr += 1;
        ndcg += std::log(2.0) / std::log(double(rank) + 2.0);
      }
    }
    // The same lists through the trainer's metric kernel. Counts are exact in
    // float up to 2^24 positives per item, far above these data sets.
    scores.resize(size_t(n * L));
    for (int64_t k = 0; k < n * L; ++k) scores[k] = float(count[eb.items[k]]);
    double h = 0, g = 0;
    hit_ndcg(ctx, scores.data(), eb.mask.data(), n, int(L), o.topk, &h, &g);
    hr_k += h;
    ndcg_k += g;
    users += n;
  }
  NCF_CHECK(users == int64_t(meta.num_eval_users), "eval gave ", users, " users, metadata says ",
            meta.num_eval_users);
  hr /= double(users), ndcg /= double(users), hr_k /= double(users), ndcg_k /= double(users);
  const bool agree = std::fabs(hr - hr_k) < 1e-12 && std::fabs(ndcg - ndcg_k) < 1e-9;
  std::printf("popularity baseline on %s (%s): %lld users x %lld, K = %d\n", o.data_dir.c_str(),
              meta.source.c_str(), (long long)users, (long long)L, o.topk);
  std::printf(
      "HR@%d %.4f  NDCG@%d %.4f  (hit_ndcg kernel: %.4f / %.4f, %s); "
      "%lld counted negatives tie with the positive\n",
      o.topk, hr, o.topk, ndcg, hr_k, ndcg_k, agree ? "agree" : "DISAGREE", (long long)ties);
  if (!o.json.empty()) {
    nlohmann::json j = {{"data_dir", o.data_dir},
                        {"source", meta.source},
                        {"users", users},
                        {"list_length", L},
                        {"topk", o.topk},
                        {"hr", hr},
                        {"ndcg", ndcg}};
    std::ofstream f(o.json);
    NCF_CHECK(bool(f), "flag --json: cannot open ", o.json, " for writing");
    f << j.dump() << "\n";
  }
  return agree ? 0 : 1;
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  ncf::Options o;
  CLI::App app{"bench_popularity: HR@K / NDCG@K of ranking eval lists by item popularity"};
  app.add_option("--data_dir", o.data_dir, "dataset directory written by ncf_prep")->required();
  app.add_option("--topk", o.topk, "K of HR@K and NDCG@K")->capture_default_str();
  app.add_option("--json", o.json, "also write the result as one JSON object to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return ncf::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_popularity: %s\n", e.what());
    return 1;
  }
}
