// ncf_prep: writes a dataset directory (metadata, train/eval record shards,
// per-user positive lists) from MovieLens files, the NCF paper's files or the
// synthetic generator, and verifies one with --verify.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "common/check.h"
#include "data/dataset.h"
#include "data/source_csv.h"
#include "data/source_tfmg.h"
#include "data/sources.h"
#include "data/synthetic.h"
#include "train/flag_range.h"

namespace {

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, unit[u]);
  return buf;
}

// How the summary line says metadata.json's eval_sampling.
const char* sampling_words(const std::string& s) {
  if (s == "distinct") return "distinct negatives";
  if (s == "with_replacement") return "negatives drawn with replacement, repeats masked";
  if (s == "given") return "negatives as given";
  return "negatives";
}

void print_meta_summary(const ncf::DatasetMeta& m, const std::string& dir, double seconds) {
  uint64_t bytes = m.positives_bytes;
  for (const auto& s : m.shards) bytes += s.bytes;
  std::printf(
      "ncf_prep: wrote %s (%s)\n"
      "  users %llu (dropped %llu), items %llu, train positives %llu, eval users %llu x (1 + %u, "
      "%s)\n"
      "  %llu train records of %u rows in %zu files, %zu eval files, %s in %.2f s\n",
      dir.c_str(), m.source.c_str(), (unsigned long long)m.num_users,
      (unsigned long long)m.dropped_users, (unsigned long long)m.num_items,
      (unsigned long long)m.num_train, (unsigned long long)m.num_eval_users, m.eval_negatives,
      sampling_words(m.eval_sampling), (unsigned long long)m.num_train_records(),
      m.train_record_rows, m.shards_of("train").size(), m.shards_of("eval").size(),
      human_bytes(double(bytes)).c_str(), seconds);
  if (m.lineage.is_object()) {
    // Every count of an extension, so that nothing is dropped unseen.
    const nlohmann::json& l = m.lineage;
    auto side = [&](const char* which) {
      const std::string key = std::string(which) + "s";
      const nlohmann::json& c = l.at(key);
      const uint64_t bound = c.at("max").get<uint64_t>();
      return ncf::detail::concat(
          which, "s: ", c.at("kept").get<uint64_t>(), " of the parent's ",
          c.at("parent").get<uint64_t>(), " kept, ", c.at("new").get<uint64_t>(), " new, ",
          c.at("dropped").get<uint64_t>(), " of the parent's and ",
          c.at("new_dropped").get<uint64_t>(), " new dropped",
          bound ? ncf::detail::concat(" (--max_", which, "s ", bound, ")") : std::string(),
          c.at("renumbered").get<bool>() ? ", renumbered" : "");
    };
    std::printf("  extends %s (%s), generation %llu, %s ids\n  %s\n  %s\n",
                l.at("parent").at("dataset_id").get<std::string>().c_str(),
                l.at("parent").at("path").get<std::string>().c_str(),
                (unsigned long long)m.generation(), l.at("ids").get<std::string>().c_str(),
                side("user").c_str(), side("item").c_str());
    if (l.contains("log")) {
      const nlohmann::json& g = l.at("log");
      std::printf(
          "  log: %llu rows, %llu duplicates, %llu repeat a user's earlier items, %llu dropped "
          "with their ids; %llu new users with too few items dropped; %llu users evaluated\n",
          (unsigned long long)g.at("rows").get<uint64_t>(),
          (unsigned long long)g.at("duplicates_removed").get<uint64_t>(),
          (unsigned long long)g.at("repeats_of_history").get<uint64_t>(),
          (unsigned long long)g.at("dropped_with_ids").get<uint64_t>(),
          (unsigned long long)l.at("too_few_interactions").get<uint64_t>(),
          (unsigned long long)m.num_eval_users);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ncf_prep: prepare NeuMF training data as prebatched, CRC-checked record shards.\n"
      "  ncf_prep --synthetic ml-20m --output data/syn-ml-20m\n"
      "  ncf_prep --input ~/ml-20m --output data/ml-20m\n"
      "  ncf_prep --input ~/Data/ml-1m --format ncf-paper --output data/ncf-ml-1m\n"
      "  ncf_prep --input log.csv.gz --format csv --columns user=uid,item=sku,timestamp=ts "
      "--output data/log\n"
      "  ncf_prep --input ~/ncf_data/ml-20m --format tfmg --output data/tfmg-ml-20m\n"
      "  ncf_prep --verify data/ml-20m"};
  std::string input, format = "auto", output, verify_dir, synthetic;
  ncf::PrepOptions opt;
  ncf::SyntheticParams sp;
  uint64_t users = 0, items = 0, interactions = 0;
  uint32_t eval_negatives = 0;
  uint64_t shuffle_mb = 256;
  std::string progress = "auto";
  std::string csv_columns, csv_separator = ",", csv_header = "auto";
  double min_rating = 0;
  bool skip_bad_rows = false;
  std::string tfmg_cycles = "all";

  app.add_option("--input", input,
                 "MovieLens file or directory (u.data, ratings.dat, ratings.csv), an NCF-paper "
                 "prefix (DIR/ml-1m for ml-1m.train.rating, …), or a TF Model Garden NCF data "
                 "directory (meta_data.json, training_cycle_*/, eval_data/), or with --format csv "
                 "an interaction file (FILE or FILE.gz)");
  app.add_option("--format", format, "input format")
      ->check(CLI::IsMember(
          {"auto", "ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ncf-paper", "tfmg", "csv"}));
  auto* columns_opt =
      app.add_option("--columns", csv_columns,
                     "csv: user=C,item=C[,timestamp=C][,rating=C], each C a header name or a "
                     "0-based position");
  auto* separator_opt =
      app.add_option("--separator", csv_separator,
                     "csv: the field separator, one character (\\t or tab for TAB)")
          ->capture_default_str();
  auto* header_opt = app.add_option("--header", csv_header,
                                    "csv: yes, no, or auto (docs/preparing_data.md: a header when "
                                    "the first row's timestamp/rating fields are not "
                                    "times/numbers)")
                         ->check(CLI::IsMember({"yes", "no", "auto"}))
                         ->capture_default_str();
  auto* min_rating_opt = ncf::add_ranged(
      app, "--min_rating", min_rating,
      "csv: only rows rated at least this are positives (the others are skipped and counted)",
      ncf::FlagRange::reals(-1e9, 1e9));
  auto* skip_opt = app.add_flag("--skip_bad_rows", skip_bad_rows,
                                "csv: count and skip bad rows (reported, and counted in "
                                "metadata.json) instead of stopping at the first");
  auto* tfmg_cycles_opt =
      app.add_option(
             "--tfmg_cycles", tfmg_cycles,
             "tfmg: decode every training cycle and check each holds cycle 0's positives "
             "(all), or decode cycle 0 and only check the others' shard files exist (first)")
          ->check(CLI::IsMember({"all", "first"}))
          ->capture_default_str();
  app.add_option("--synthetic", synthetic,
                 "generate a synthetic dataset of a named shape: small, ml-1m, ml-20m, or custom "
                 "(then --users/--items/--interactions)");
  // Dense ids are int32 everywhere downstream; the interaction bound keeps
  // users x per-user counts within uint64.
  using ncf::add_ranged;
  using ncf::FlagRange;
  constexpr uint64_t kMaxId = INT32_MAX;
  const std::vector<CLI::Option*> synthetic_opts = {
      add_ranged(app, "--users", users, "synthetic: number of users (overrides the shape)",
                 FlagRange::ints(1, kMaxId)),
      add_ranged(app, "--items", items, "synthetic: number of items (overrides the shape)",
                 FlagRange::ints(2, kMaxId)),
      add_ranged(app, "--interactions", interactions,
                 "synthetic: total interactions, train + test (overrides the shape)",
                 FlagRange::ints(1, uint64_t{1} << 48)),
      add_ranged(app, "--zipf", sp.zipf_s,
                 "synthetic: item popularity exponent s (weight 1/rank^s)", FlagRange::reals(0, 4))
          ->capture_default_str(),
      add_ranged(app, "--activity_alpha", sp.activity_alpha,
                 "synthetic: Pareto tail exponent of user activity", FlagRange::reals(1.01, 10))
          ->capture_default_str(),
      add_ranged(app, "--rank", sp.rank, "synthetic: rank of the planted preferences",
                 FlagRange::ints(1, 1024))
          ->capture_default_str(),
      // Some popularity mass must stay, or items nobody's taste picks are never drawn.
      add_ranged(app, "--preference", sp.preference,
                 "synthetic: share of interactions drawn from the planted taste",
                 FlagRange::reals(0, 1).open_high())
          ->capture_default_str(),
      add_ranged(app, "--min_per_user", sp.min_per_user,
                 "synthetic: interactions per user, at least", FlagRange::ints(2, 1 << 20))
          ->capture_default_str(),
  };
  app.add_option("--output,-o", output, "dataset directory to write");
  add_ranged(app, "--eval_negatives", eval_negatives,
             "eval negatives per user, E (default 999; 99 for the NCF paper's files and the "
             "small synthetic shape)",
             FlagRange::ints(1, 1 << 20));
  std::string eval_sampling = "auto";
  auto* eval_sampling_opt =
      app.add_option("--eval_sampling", eval_sampling,
                     "how eval negatives are drawn from the items a user never interacted with "
                     "(MovieLens, csv and synthetic input): distinct (E different items), "
                     "with_replacement (E independent draws, repeats masked out of the ranking: "
                     "TF Model Garden's and MLPerf's rule), or auto (distinct when every user "
                     "leaves E items to draw from, else with_replacement, with a note); "
                     "metadata.json records the one used")
          ->check(CLI::IsMember({"auto", "distinct", "with_replacement"}))
          ->capture_default_str();
  add_ranged(app, "--record_rows", opt.record_rows, "positive pairs per train record",
             FlagRange::ints(1, 1 << 24))
      ->capture_default_str();
  add_ranged(app, "--num_shards", opt.num_shards, "files per kind (train, eval)",
             FlagRange::ints(1, 100000))
      ->capture_default_str();
  add_ranged(app, "--seed", opt.seed, "seed of every random draw", FlagRange::ints(0, UINT64_MAX))
      ->capture_default_str();
  add_ranged(app, "--threads", opt.threads, "worker threads (0: the cores this process may run on)",
             FlagRange::ints(0, 1024))
      ->capture_default_str();
  add_ranged(app, "--shuffle_buffer_mb", shuffle_mb,
             "memory bound of the train-pair shuffle; larger sets spill to temporary buckets",
             FlagRange::ints(1, 1 << 20))
      ->capture_default_str();
  auto* min_interactions_opt =
      add_ranged(app, "--min_interactions", opt.min_interactions,
                 "MovieLens and csv: users with fewer distinct items are dropped",
                 FlagRange::ints(2, 1 << 20))
          ->capture_default_str();
  app.add_option("--progress", progress,
                 "progress lines: auto (when stderr is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--verify", verify_dir, "walk and check every record of a dataset directory");
  auto* extend_opt = app.add_option(
      "--extend", opt.extend.prev,
      "a dataset to extend (docs/preparing_data.md): its original ids keep their places, the "
      "input's new users and items follow, each user's history stays among its positives");
  auto* max_users_opt =
      ncf::add_ranged(app, "--max_users", opt.extend.max_users,
                      "with --extend: keep the N most recently active users, drop the rest "
                      "(counted and listed); 0: keep all",
                      ncf::FlagRange::ints(0, INT32_MAX));
  auto* max_items_opt =
      ncf::add_ranged(app, "--max_items", opt.extend.max_items,
                      "with --extend: keep the N most recently active items, drop the rest "
                      "(counted and listed); 0: keep all",
                      ncf::FlagRange::ints(0, INT32_MAX));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    try {
      ncf::throw_if_range_refusal(e);
    } catch (const std::exception& refusal) {
      std::fprintf(stderr, "ncf_prep: error: %s\n", refusal.what());
      return 1;
    }
    return app.exit(e);
  }

  opt.progress = progress == "on" || (progress == "auto" && isatty(2));
  opt.shuffle_buffer_bytes = shuffle_mb << 20;
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    const int modes = !input.empty() + !synthetic.empty() + !verify_dir.empty();
    if (modes != 1)
      NCF_FAIL("give exactly one of --input, --synthetic or --verify (got ", modes, ")");
    // Flags of one kind of input only (for some, the kind is known once it is
    // detected, below).
    auto refuse_given = [](const CLI::Option* o, const char* applies_to) {
      if (o->count() > 0) NCF_FAIL(o->get_name(), " applies to ", applies_to, " only");
    };
    if (format != "csv")
      for (const CLI::Option* o :
           {columns_opt, separator_opt, header_opt, min_rating_opt, skip_opt})
        refuse_given(o, "--format csv");
    if (synthetic.empty())
      for (const CLI::Option* o : synthetic_opts) refuse_given(o, "--synthetic");
    if (extend_opt->count() == 0)
      for (const CLI::Option* o : {max_users_opt, max_items_opt}) refuse_given(o, "--extend");
    if (!verify_dir.empty()) refuse_given(extend_opt, "--input and --synthetic");
    if (!opt.extend.prev.empty()) {
      // The parent must load (its metadata checked) before anything is read.
      ncf::DatasetMeta::load(opt.extend.prev);
      if (output.empty()) NCF_FAIL("--output is required to write a dataset");
      namespace fs = std::filesystem;
      std::error_code ec;
      if (fs::equivalent(opt.extend.prev, output, ec))
        NCF_FAIL("--extend ", opt.extend.prev, " and --output ", output,
                 " are the same directory: an extension is written beside its parent");
    }
    if (!verify_dir.empty() || !synthetic.empty()) {
      refuse_given(min_interactions_opt, "MovieLens and csv input");
      refuse_given(tfmg_cycles_opt, "TF Model Garden input");
    }
    // Where ncf_prep draws no eval negatives, the flag would be ignored.
    auto refuse_sampling = [&](const char* why) {
      if (eval_sampling_opt->count() > 0)
        NCF_FAIL("--eval_sampling applies to MovieLens, csv and synthetic input only: ", why);
    };
    if (!verify_dir.empty())
      refuse_sampling(
          "--verify checks a dataset as it is (its metadata.json records its sampling)");
    opt.eval_sampling = ncf::parse_eval_sampling(eval_sampling);
    // Dense ids extend by identity: nothing can be renumbered or dropped.
    auto refuse_bounds = [&](const char* input) {
      for (const CLI::Option* o : {max_users_opt, max_items_opt})
        if (o->count() > 0)
          NCF_FAIL(o->get_name(), " applies to input with its own ids (MovieLens, csv): ", input,
                   " ids are dense and extend by identity");
    };
    if (!verify_dir.empty()) {
      ncf::VerifySummary s = ncf::verify_dataset(verify_dir, opt.progress);
      if (!s.warning.empty()) std::fprintf(stderr, "ncf_prep: warning: %s\n", s.warning.c_str());
      std::printf(
          "ncf_prep: %s OK: %llu shard files, %llu train records (%llu positives), %llu eval "
          "records, %s checked in %.2f s\n",
          verify_dir.c_str(), (unsigned long long)s.num_shards, (unsigned long long)s.train_records,
          (unsigned long long)s.train_rows, (unsigned long long)s.eval_records,
          human_bytes(double(s.bytes)).c_str(), s.seconds);
      if (!s.lineage.empty()) std::printf("ncf_prep: %s\n", s.lineage.c_str());
      return 0;
    }
    if (output.empty()) NCF_FAIL("--output is required to write a dataset");
    if (!synthetic.empty()) {
      refuse_bounds("synthetic");
      if (synthetic == "custom") {
        if (!users || !items || !interactions)
          NCF_FAIL("--synthetic custom needs --users, --items and --interactions");
        sp.shape = {"custom", users, items, interactions};
      } else {
        sp.shape = ncf::synthetic_shape(synthetic);
        if (users) sp.shape.num_users = users, sp.shape.name = "custom";
        if (items) sp.shape.num_items = items, sp.shape.name = "custom";
        if (interactions) sp.shape.num_interactions = interactions, sp.shape.name = "custom";
      }
      // The embedded "small" shape has 1,000 items: the paper's 99 negatives fit it.
      opt.eval_negatives = eval_negatives ? eval_negatives : (synthetic == "small" ? 99 : 999);
      ncf::DatasetMeta m = ncf::generate_synthetic(sp, output, opt);
      print_meta_summary(m, output, elapsed());
      return 0;
    }
    // TF Model Garden shards: named, or a directory that holds their layout.
    if (format == "tfmg" || (format == "auto" && ncf::is_tfmg_dir(input))) {
      refuse_given(min_interactions_opt, "MovieLens and csv input");
      refuse_sampling("TF Model Garden shards carry their own eval negatives and masks");
      refuse_bounds("TF Model Garden");
      opt.eval_negatives = eval_negatives;  // 0: as many as the data has
      ncf::DatasetMeta m =
          ncf::prepare_tfmg(input, output, opt, ncf::parse_tfmg_cycles(tfmg_cycles));
      print_meta_summary(m, output, elapsed());
      return 0;
    }
    std::string resolved;
    ncf::InputFormat want = ncf::parse_input_format(format);
    ncf::InputFormat fmt = ncf::detect_format(input, want, &resolved);
    refuse_given(tfmg_cycles_opt, "TF Model Garden input");
    if (fmt == ncf::InputFormat::kNcfPaper) {
      refuse_given(min_interactions_opt, "MovieLens and csv input");
      refuse_sampling("the NCF paper's files carry their own eval negatives");
      refuse_bounds("NCF-paper");
    }
    ncf::DatasetMeta m;
    if (fmt == ncf::InputFormat::kCsv) {
      ncf::CsvOptions csv;
      csv.columns = csv_columns;
      csv.separator = ncf::parse_csv_separator(csv_separator);
      csv.header = ncf::parse_csv_header(csv_header);
      if (min_rating_opt->count() > 0) csv.min_rating = min_rating;
      csv.skip_bad_rows = skip_bad_rows;
      opt.eval_negatives = eval_negatives ? eval_negatives : 999;
      m = ncf::prepare_csv(resolved, csv, output, opt);
    } else if (fmt == ncf::InputFormat::kNcfPaper) {
      opt.eval_negatives = eval_negatives ? eval_negatives : 99;
      m = ncf::prepare_ncf_paper(resolved, output, opt);
    } else {
      opt.eval_negatives = eval_negatives ? eval_negatives : 999;
      m = ncf::prepare_movielens(resolved, fmt, output, opt);
    }
    print_meta_summary(m, output, elapsed());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ncf_prep: error: %s\n", e.what());
    return 1;
  }
}
