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

// Every flag's value, and the options whose presence decides what applies.
struct PrepFlags {
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
  size_t csv_max_row_bytes = ncf::CsvOptions().max_row_bytes;
  size_t csv_block_bytes = ncf::CsvOptions().block_bytes;
  std::string tfmg_cycles = "all";
  std::string eval_sampling = "auto";

  std::vector<CLI::Option*> csv_opts, synthetic_opts;
  CLI::Option *min_rating_opt = nullptr, *tfmg_cycles_opt = nullptr, *eval_sampling_opt = nullptr,
              *min_interactions_opt = nullptr, *extend_opt = nullptr, *max_users_opt = nullptr,
              *max_items_opt = nullptr;
};

using ncf::add_ranged;
using ncf::FlagRange;

// --input, --format and the flags of one input format (csv, tfmg).
void add_input_flags(CLI::App& app, PrepFlags& f) {
  app.add_option("--input", f.input,
                 "MovieLens file or directory (u.data, ratings.dat, ratings.csv), an NCF-paper "
                 "prefix (DIR/ml-1m for ml-1m.train.rating, …), or a TF Model Garden NCF data "
                 "directory (meta_data.json, training_cycle_*/, eval_data/), or with --format csv "
                 "an interaction file (FILE or FILE.gz)");
  app.add_option("--format", f.format, "input format")
      ->check(CLI::IsMember(
          {"auto", "ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ncf-paper", "tfmg", "csv"}));
  f.csv_opts.push_back(
      app.add_option("--columns", f.csv_columns,
                     "csv: user=C,item=C[,timestamp=C][,rating=C], each C a header name or a "
                     "0-based position"));
  f.csv_opts.push_back(app.add_option("--separator", f.csv_separator,
                                      "csv: the field separator, one character (\\t or tab for "
                                      "TAB)")
                           ->capture_default_str());
  f.csv_opts.push_back(app.add_option("--header", f.csv_header,
                                      "csv: yes, no, or auto (docs/preparing_data.md: a header "
                                      "when the first row's timestamp/rating fields are not "
                                      "times/numbers)")
                           ->check(CLI::IsMember({"yes", "no", "auto"}))
                           ->capture_default_str());
  f.min_rating_opt = add_ranged(
      app, "--min_rating", f.min_rating,
      "csv: only rows rated at least this are positives (the others are skipped and counted)",
      FlagRange::reals(-1e9, 1e9));
  f.csv_opts.push_back(f.min_rating_opt);
  f.csv_opts.push_back(app.add_flag("--skip_bad_rows", f.skip_bad_rows,
                                    "csv: count and skip bad rows (reported, and counted in "
                                    "metadata.json) instead of stopping at the first"));
  f.csv_opts.push_back(
      add_ranged(app, "--csv_max_row_bytes", f.csv_max_row_bytes,
                 "csv: the longest row, in bytes (quoted line breaks and all); a longer one "
                 "stops the run, a quote still open there is a bad row",
                 FlagRange::ints(1, ncf::kMaxCsvSizeFlag))
          ->capture_default_str());
  f.csv_opts.push_back(add_ranged(app, "--csv_block_bytes", f.csv_block_bytes,
                                  "csv: the read block size, in bytes: the file is read (and "
                                  "inflated) a block at a time, a few blocks in memory",
                                  FlagRange::ints(1, ncf::kMaxCsvSizeFlag))
                           ->capture_default_str());
  f.tfmg_cycles_opt =
      app.add_option(
             "--tfmg_cycles", f.tfmg_cycles,
             "tfmg: decode every training cycle and check each holds cycle 0's positives "
             "(all), or decode cycle 0 and only check the others' shard files exist (first)")
          ->check(CLI::IsMember({"all", "first"}))
          ->capture_default_str();
}

// --synthetic and its shape's flags.
void add_synthetic_flags(CLI::App& app, PrepFlags& f) {
  app.add_option("--synthetic", f.synthetic,
                 "generate a synthetic dataset of a named shape: small, ml-1m, ml-20m, or custom "
                 "(then --users/--items/--interactions)");
  // Dense ids are int32 everywhere downstream; the interaction bound keeps
  // users x per-user counts within uint64.
  constexpr uint64_t kMaxId = INT32_MAX;
  ncf::SyntheticParams& sp = f.sp;
  f.synthetic_opts = {
      add_ranged(app, "--users", f.users, "synthetic: number of users (overrides the shape)",
                 FlagRange::ints(1, kMaxId)),
      add_ranged(app, "--items", f.items, "synthetic: number of items (overrides the shape)",
                 FlagRange::ints(2, kMaxId)),
      add_ranged(app, "--interactions", f.interactions,
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
}

// The dataset's shape and the run's: --output, eval negatives, records,
// shards, seed, threads, memory, --progress, --verify, --extend.
void add_output_flags(CLI::App& app, PrepFlags& f) {
  ncf::PrepOptions& opt = f.opt;
  app.add_option("--output,-o", f.output, "dataset directory to write");
  add_ranged(app, "--eval_negatives", f.eval_negatives,
             "eval negatives per user, E (default 999; 99 for the NCF paper's files and the "
             "small synthetic shape)",
             FlagRange::ints(1, 1 << 20));
  f.eval_sampling_opt =
      app.add_option("--eval_sampling", f.eval_sampling,
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
  add_ranged(app, "--shuffle_buffer_mb", f.shuffle_mb,
             "memory bound of the train-pair shuffle; larger sets spill to temporary buckets",
             FlagRange::ints(1, 1 << 20))
      ->capture_default_str();
  f.min_interactions_opt =
      add_ranged(app, "--min_interactions", opt.min_interactions,
                 "MovieLens and csv: users with fewer distinct items are dropped",
                 FlagRange::ints(2, 1 << 20))
          ->capture_default_str();
  app.add_option("--progress", f.progress,
                 "progress lines: auto (when stderr is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--verify", f.verify_dir, "walk and check every record of a dataset directory");
  f.extend_opt = app.add_option(
      "--extend", opt.extend.prev,
      "a dataset to extend (docs/preparing_data.md): its original ids keep their places, the "
      "input's new users and items follow, each user's history stays among its positives");
  f.max_users_opt = add_ranged(app, "--max_users", opt.extend.max_users,
                               "with --extend: keep the N most recently active users, drop the "
                               "rest (counted and listed); 0: keep all",
                               FlagRange::ints(0, INT32_MAX));
  f.max_items_opt = add_ranged(app, "--max_items", opt.extend.max_items,
                               "with --extend: keep the N most recently active items, drop the "
                               "rest (counted and listed); 0: keep all",
                               FlagRange::ints(0, INT32_MAX));
}

void refuse_given(const CLI::Option* o, const char* applies_to) {
  if (o->count() > 0) NCF_FAIL(o->get_name(), " applies to ", applies_to, " only");
}

// Where ncf_prep draws no eval negatives, --eval_sampling would be ignored.
void refuse_sampling(const PrepFlags& f, const char* why) {
  if (f.eval_sampling_opt->count() > 0)
    NCF_FAIL("--eval_sampling applies to MovieLens, csv and synthetic input only: ", why);
}

// Dense ids extend by identity: nothing can be renumbered or dropped.
void refuse_bounds(const PrepFlags& f, const char* input) {
  for (const CLI::Option* o : {f.max_users_opt, f.max_items_opt})
    if (o->count() > 0)
      NCF_FAIL(o->get_name(), " applies to input with its own ids (MovieLens, csv): ", input,
               " ids are dense and extend by identity");
}

// One mode, and no flag of another kind of input (for some, the kind is
// known once it is detected: run_input).
void check_flags(PrepFlags& f) {
  const int modes = !f.input.empty() + !f.synthetic.empty() + !f.verify_dir.empty();
  if (modes != 1)
    NCF_FAIL("give exactly one of --input, --synthetic or --verify (got ", modes, ")");
  if (f.format != "csv")
    for (const CLI::Option* o : f.csv_opts) refuse_given(o, "--format csv");
  if (f.synthetic.empty())
    for (const CLI::Option* o : f.synthetic_opts) refuse_given(o, "--synthetic");
  if (f.extend_opt->count() == 0)
    for (const CLI::Option* o : {f.max_users_opt, f.max_items_opt}) refuse_given(o, "--extend");
  if (!f.verify_dir.empty()) refuse_given(f.extend_opt, "--input and --synthetic");
  const std::string& prev = f.opt.extend.prev;
  if (!prev.empty()) {
    // The parent must load (its metadata checked) before anything is read.
    ncf::DatasetMeta::load(prev);
    if (f.output.empty()) NCF_FAIL("--output is required to write a dataset");
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::equivalent(prev, f.output, ec))
      NCF_FAIL("--extend ", prev, " and --output ", f.output,
               " are the same directory: an extension is written beside its parent");
  }
  if (!f.verify_dir.empty() || !f.synthetic.empty()) {
    refuse_given(f.min_interactions_opt, "MovieLens and csv input");
    refuse_given(f.tfmg_cycles_opt, "TF Model Garden input");
  }
  if (!f.verify_dir.empty())
    refuse_sampling(f,
                    "--verify checks a dataset as it is (its metadata.json records its sampling)");
  f.opt.eval_sampling = ncf::parse_eval_sampling(f.eval_sampling);
}

int run_verify(const PrepFlags& f) {
  ncf::VerifySummary s = ncf::verify_dataset(f.verify_dir, f.opt.progress);
  if (!s.warning.empty()) std::fprintf(stderr, "ncf_prep: warning: %s\n", s.warning.c_str());
  std::printf(
      "ncf_prep: %s OK: %llu shard files, %llu train records (%llu positives), %llu eval "
      "records, %s checked in %.2f s\n",
      f.verify_dir.c_str(), (unsigned long long)s.num_shards, (unsigned long long)s.train_records,
      (unsigned long long)s.train_rows, (unsigned long long)s.eval_records,
      human_bytes(double(s.bytes)).c_str(), s.seconds);
  if (!s.lineage.empty()) std::printf("ncf_prep: %s\n", s.lineage.c_str());
  return 0;
}

ncf::DatasetMeta run_synthetic(PrepFlags& f) {
  refuse_bounds(f, "synthetic");
  ncf::SyntheticParams& sp = f.sp;
  if (f.synthetic == "custom") {
    if (!f.users || !f.items || !f.interactions)
      NCF_FAIL("--synthetic custom needs --users, --items and --interactions");
    sp.shape = {"custom", f.users, f.items, f.interactions};
  } else {
    sp.shape = ncf::synthetic_shape(f.synthetic);
    if (f.users) sp.shape.num_users = f.users, sp.shape.name = "custom";
    if (f.items) sp.shape.num_items = f.items, sp.shape.name = "custom";
    if (f.interactions) sp.shape.num_interactions = f.interactions, sp.shape.name = "custom";
  }
  // The embedded "small" shape has 1,000 items: the paper's 99 negatives fit it.
  f.opt.eval_negatives = f.eval_negatives ? f.eval_negatives : (f.synthetic == "small" ? 99 : 999);
  return ncf::generate_synthetic(sp, f.output, f.opt);
}

ncf::DatasetMeta run_input(PrepFlags& f) {
  ncf::PrepOptions& opt = f.opt;
  // TF Model Garden shards: named, or a directory that holds their layout.
  if (f.format == "tfmg" || (f.format == "auto" && ncf::is_tfmg_dir(f.input))) {
    refuse_given(f.min_interactions_opt, "MovieLens and csv input");
    refuse_sampling(f, "TF Model Garden shards carry their own eval negatives and masks");
    refuse_bounds(f, "TF Model Garden");
    opt.eval_negatives = f.eval_negatives;  // 0: as many as the data has
    return ncf::prepare_tfmg(f.input, f.output, opt, ncf::parse_tfmg_cycles(f.tfmg_cycles));
  }
  std::string resolved;
  ncf::InputFormat want = ncf::parse_input_format(f.format);
  ncf::InputFormat fmt = ncf::detect_format(f.input, want, &resolved);
  refuse_given(f.tfmg_cycles_opt, "TF Model Garden input");
  if (fmt == ncf::InputFormat::kNcfPaper) {
    refuse_given(f.min_interactions_opt, "MovieLens and csv input");
    refuse_sampling(f, "the NCF paper's files carry their own eval negatives");
    refuse_bounds(f, "NCF-paper");
  }
  if (fmt == ncf::InputFormat::kCsv) {
    ncf::CsvOptions csv;
    csv.columns = f.csv_columns;
    csv.separator = ncf::parse_csv_separator(f.csv_separator);
    csv.header = ncf::parse_csv_header(f.csv_header);
    if (f.min_rating_opt->count() > 0) csv.min_rating = f.min_rating;
    csv.skip_bad_rows = f.skip_bad_rows;
    csv.max_row_bytes = f.csv_max_row_bytes;
    csv.block_bytes = f.csv_block_bytes;
    opt.eval_negatives = f.eval_negatives ? f.eval_negatives : 999;
    return ncf::prepare_csv(resolved, csv, f.output, opt);
  }
  if (fmt == ncf::InputFormat::kNcfPaper) {
    opt.eval_negatives = f.eval_negatives ? f.eval_negatives : 99;
    return ncf::prepare_ncf_paper(resolved, f.output, opt);
  }
  opt.eval_negatives = f.eval_negatives ? f.eval_negatives : 999;
  return ncf::prepare_movielens(resolved, fmt, f.output, opt);
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
  PrepFlags f;
  add_input_flags(app, f);
  add_synthetic_flags(app, f);
  add_output_flags(app, f);
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

  f.opt.progress = f.progress == "on" || (f.progress == "auto" && isatty(2));
  f.opt.shuffle_buffer_bytes = f.shuffle_mb << 20;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    check_flags(f);
    if (!f.verify_dir.empty()) return run_verify(f);
    if (f.output.empty()) NCF_FAIL("--output is required to write a dataset");
    const ncf::DatasetMeta m = f.synthetic.empty() ? run_input(f) : run_synthetic(f);
    print_meta_summary(
        m, f.output, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ncf_prep: error: %s\n", e.what());
    return 1;
  }
}
