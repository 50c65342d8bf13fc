// ncf_recommend: the top-K items of users, or the scores of given pairs, from
// a checkpoint, as one or many MPI ranks with the tables sharded as in
// training. Ids in and out are the dataset's original ids when ncf_prep kept
// its id maps (MovieLens integer ids, CSV string ids), else its dense ids.
// Lists of ids are read as CSV (csv_reader.h), so a string id holding a comma,
// a quote or a line break is written, and may be given, quoted.
//
//   ncf_recommend --checkpoint ck --data_dir data --users all --topk 10 --output top.csv
//   mpirun -np 2 ncf_recommend --checkpoint ck/step-000000000800 --data_dir data
//       --pairs pairs.csv --output scores.csv
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "comm/bootstrap.h"
#include "common/blas_setup.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/file_io.h"
#include "common/partition.h"
#include "data/id_map.h"
#include "model/ops.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/flag_range.h"
#include "train/recommend_lists.h"
#include "train/scoring_model.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;

struct RecommendFlags {
  std::string checkpoint, data_dir, users, pairs, output = "-", format = "csv";
  int topk = 10;
  bool include_seen = false;
  std::string device = "auto", comm = "auto", shard_plan = "auto";
  int threads = 0;
  int64_t batch_size = int64_t{1} << 20;
};

bool parse_flags(int argc, char** argv, RecommendFlags* f, int* code) {
  CLI::App app{
      "ncf_recommend: top-K recommendations or pair scores from an ncf_dist checkpoint.\n"
      "  ncf_recommend --checkpoint ck --data_dir data --users all --topk 10 --output top.csv\n"
      "  ncf_recommend --checkpoint ck --data_dir data --pairs pairs.csv --output scores.csv"};
  app.get_formatter()->column_width(30);
  app.add_option("--checkpoint", f->checkpoint,
                 "a checkpoint (DIR/step-N) or a --checkpoint_dir (its newest whole checkpoint)")
      ->required();
  app.add_option("--data_dir", f->data_dir, "the dataset the checkpoint was trained on")
      ->required();
  auto* users = app.add_option("--users", f->users,
                               "all, a file of user ids (one per line), or a comma-separated "
                               "list of user ids");
  auto* pairs = app.add_option("--pairs", f->pairs,
                               "a CSV file of 'user,item' lines (header 'user,item' allowed) to "
                               "score");
  users->excludes(pairs);
  auto* topk =
      add_ranged(app, "--topk", f->topk, "items per user (--users)", FlagRange::ints(1, 1 << 20))
          ->capture_default_str();
  auto* include_seen = app.add_flag(
      "--include_seen", f->include_seen,
      "keep the user's known interactions (training items and the held-out test item)");
  app.add_option("--output", f->output, "output file, - for standard output")
      ->capture_default_str();
  app.add_option("--format", f->format, "csv or jsonl")
      ->check(CLI::IsMember({"csv", "jsonl"}))
      ->capture_default_str();
  app.add_option("--device", f->device,
                 "auto (a GPU per rank when this build has CUDA and every rank sees a GPU, "
                 "else the CPU), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  add_ranged(app, "--threads", f->threads,
             "CPU threads per rank (0: the cores its affinity mask allows, each shared among "
             "the node's ranks that may run on it)",
             FlagRange::ints(0, 1024))
      ->capture_default_str();
  app.add_option("--comm", f->comm, "auto, mpi, nccl or single")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "single"}))
      ->capture_default_str();
  app.add_option("--shard_plan", f->shard_plan, "table placement, as ncf_dist's --shard_plan")
      ->capture_default_str();
  add_ranged(app, "--batch_size", f->batch_size, "scores per round on each rank",
             FlagRange::ints(1, uint64_t{1} << 31))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw_if_range_refusal(e);
    *code = app.exit(e);
    return false;
  }
  // --pairs scores the pairs it lists: nothing to rank or leave out.
  if (!f->pairs.empty())
    for (const CLI::Option* o : {topk, include_seen})
      if (o->count() > 0) NCF_FAIL("flag ", o->get_name(), " applies to --users only");
  if (f->users.empty() && f->pairs.empty()) {
    std::fprintf(stderr, "ncf_recommend: error: give --users or --pairs\n");
    *code = 2;
    return false;
  }
  return true;
}

// An id for the output: the integer, or the string quoted as CSV needs
// (RFC 4180) or as a JSON string (invalid UTF-8 bytes become U+FFFD there).
std::string id_out(const IdMap& map, int32_t dense, bool csv) {
  if (!map.strings()) return std::to_string(map.raw(dense));
  const std::string_view s = map.string(dense);
  if (!csv)
    return nlohmann::json(std::string(s))
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Rank 0 writes every rank's text in rank order: its own, then each other
// rank's in pieces of at most 64 MiB (one all-to-all each, only to rank 0).
void write_in_rank_order(Communicator& comm, const std::string& mine, std::FILE* out,
                         const std::string& name) {
  const int W = comm.world(), r = comm.rank();
  std::vector<int64_t> sizes(size_t(W), 0);
  sizes[size_t(r)] = int64_t(mine.size());
  all_reduce_sum_on(comm, Device::kCpu, sizes.data(), sizes.size(), DType::kInt64);
  auto put = [&](const char* p, size_t n) {
    if (n && std::fwrite(p, 1, n, out) != n) NCF_FAIL(name, ": write failed");
  };
  if (r == 0) put(mine.data(), mine.size());
  constexpr int64_t kPiece = int64_t{64} << 20;
  std::vector<char> recv;
  for (int src = 1; src < W; ++src)
    for (int64_t at = 0; at < sizes[size_t(src)]; at += kPiece) {
      const int64_t n = std::min(kPiece, sizes[size_t(src)] - at);
      std::vector<int64_t> send_counts(size_t(W), 0), recv_counts(size_t(W), 0),
          displs(size_t(W), 0);
      if (r == src) send_counts[0] = n;
      if (r == 0) recv_counts[size_t(src)] = n;
      recv.resize(size_t(r == 0 ? n : 0));
      all_to_all_v_on(comm, Device::kCpu, r == src ? mine.data() + at : nullptr, send_counts.data(),
                      displs.data(), recv.data(), recv_counts.data(), displs.data(), DType::kUInt8);
      if (r == 0) put(recv.data(), recv.size());
    }
}

// --pairs: this rank's block of the pairs, scored, as lines of --format (rank 0's
// with the CSV header); *total counts the pairs of all ranks.
std::string pair_scores_text(const RecommendFlags& f, const IdMaps& maps, const RankInfo& info,
                             bool csv, ScoringModel& model, int64_t* total) {
  std::string text;
  char buf[160];
  const bool lead = info.rank == 0;
  std::vector<int32_t> users, items;
  read_pairs(f.pairs, f.data_dir, maps, &users, &items);
  *total = int64_t(users.size());
  int64_t first = 0, count = 0;
  block_range(*total, info.world, info.rank, &first, &count);
  const std::vector<int32_t> my_users(users.begin() + first, users.begin() + first + count),
      my_items(items.begin() + first, items.begin() + first + count);
  const std::vector<float> logits = model.score_pairs(my_users, my_items);
  if (lead && csv) text = "user,item,score\n";
  for (int64_t k = 0; k < count; ++k) {
    const std::string u = id_out(maps.user, my_users[size_t(k)], csv);
    const std::string i = id_out(maps.item, my_items[size_t(k)], csv);
    std::snprintf(buf, sizeof buf, "%.9g", double(sigmoid(logits[size_t(k)])));
    text += csv ? u + "," + i + "," + buf + "\n"
                : "{\"user\":" + u + ",\"item\":" + i + ",\"score\":" + buf + "}\n";
  }
  return text;
}

// --users: this rank's block of the users, each with its top --topk items, as lines
// of --format (rank 0's with the CSV header); *total counts the users of all ranks.
std::string top_k_text(const RecommendFlags& f, const IdMaps& maps, const RankInfo& info, bool csv,
                       ScoringModel& model, int64_t* total) {
  std::string text;
  char buf[160];
  const bool lead = info.rank == 0;
  const std::vector<int32_t> users = read_users(f.users, f.data_dir, maps.user);
  *total = int64_t(users.size());
  int64_t first = 0, count = 0;
  block_range(*total, info.world, info.rank, &first, &count);
  const std::vector<int32_t> mine(users.begin() + first, users.begin() + first + count);
  std::vector<int32_t> items;
  std::vector<float> logits;
  model.recommend(mine, f.topk, f.include_seen, &items, &logits);
  if (lead && csv) text = "user,rank,item,score\n";
  for (int64_t k = 0; k < count; ++k)
    for (int r = 0; r < f.topk; ++r) {
      const size_t x = size_t(k * f.topk + r);
      if (items[x] < 0) break;  // fewer items left than K
      const std::string u = id_out(maps.user, mine[size_t(k)], csv);
      const std::string i = id_out(maps.item, items[x], csv);
      std::snprintf(buf, sizeof buf, "%.9g", double(sigmoid(logits[x])));
      const std::string rank = std::to_string(r + 1);
      text += csv ? u + "," + rank + "," + i + "," + buf + "\n"
                  : "{\"user\":" + u + ",\"rank\":" + rank + ",\"item\":" + i +
                        ",\"score\":" + buf + "}\n";
    }
  return text;
}

// Rank 0 writes the output: a temporary file renamed into place, or stdout.
void write_output(Communicator& comm, const RecommendFlags& f, const std::string& text, bool lead) {
  const bool to_stdout = f.output == "-";
  const std::string tmp = f.output + ".tmp";
  std::FILE* out = nullptr;
  if (lead) {
    out = to_stdout ? stdout : std::fopen(tmp.c_str(), "w");
    if (!out) NCF_FAIL("--output ", f.output, ": cannot open ", tmp, " for writing");
  }
  write_in_rank_order(comm, text, out, f.output);
  if (lead && !to_stdout) {
    if (std::fflush(out) != 0 || fsync(fileno(out)) != 0 || std::fclose(out) != 0)
      NCF_FAIL("--output ", f.output, ": write failed");
    fs::rename(tmp, f.output);
  }
}

int recommend_main(int& argc, char**& argv) {
  RecommendFlags f;
  int code = 0;
  if (!parse_flags(argc, argv, &f, &code)) return code;
  const auto t0 = std::chrono::steady_clock::now();
  RankRuntime rt(&argc, &argv, f.device, f.comm, f.threads);
  const Device device = rt.ctx.device;
  const RankInfo& info = rt.info;
  ExecContext& ctx = rt.ctx;
  std::unique_ptr<Communicator>& comm = rt.comm;
  const bool lead = info.rank == 0;
  const CpuReport cpu = cpu_report(rt, "ncf_recommend");  // collective
  for (const std::string& w : cpu.warnings) std::fprintf(stderr, "%s\n", w.c_str());

  // The checkpoint: a step directory, or the newest whole one in a directory.
  std::vector<std::string> log;
  const CheckpointReader ck = open_checkpoint(*comm, f.checkpoint, &log);

  TrainConfig cfg;
  apply_trajectory_flags(ck.manifest().config, ck.path() + "/" + kCheckpointManifestFile, &cfg);
  cfg.data_dir = f.data_dir;
  cfg.device = device_name(device);
  cfg.comm = f.comm;
  cfg.threads = ctx.threads;
  cfg.shard_plan = f.shard_plan;
  cfg.eval_batch_size = f.batch_size;
  set_math_mode(parse_math_mode(cfg.precision));
  const std::unique_ptr<ScoringModel> model = load_scoring_model(cfg, *comm, ctx, ck);
  const DatasetMeta& meta = model->meta();
  const IdMaps maps = load_id_maps(f.data_dir, meta);
  if (lead) {
    for (std::string line : log) {
      if (line.rfind("resuming from ", 0) == 0) line = "loading " + line.substr(14);
      std::fprintf(stderr, "ncf_recommend: %s\n", line.c_str());
    }
    std::fprintf(stderr,
                 "ncf_recommend: %s (step %lld), %s: %llu users, %llu items; %d rank(s), %s, %s\n",
                 ck.path().c_str(), (long long)ck.manifest().step, f.data_dir.c_str(),
                 (unsigned long long)meta.num_users, (unsigned long long)meta.num_items, info.world,
                 (std::string(device_name(device)) +
                  (rt.device_note.empty() ? "" : " (" + rt.device_note + ")"))
                     .c_str(),
                 cpu.summary.c_str());
  }

  // More items than the catalogue holds cannot be listed: K is clamped, and said.
  if (uint64_t(f.topk) > meta.num_items) {
    if (lead)
      std::fprintf(stderr,
                   "ncf_recommend: --topk %d is more than the %llu items of %s: listing at most "
                   "%llu per user\n",
                   f.topk, (unsigned long long)meta.num_items, f.data_dir.c_str(),
                   (unsigned long long)meta.num_items);
    f.topk = int(meta.num_items);
  }

  const bool csv = f.format == "csv";
  int64_t total = 0;
  const auto t1 = std::chrono::steady_clock::now();
  const std::string text = !f.pairs.empty() ? pair_scores_text(f, maps, info, csv, *model, &total)
                                            : top_k_text(f, maps, info, csv, *model, &total);
  const double score_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  write_output(*comm, f, text, lead);
  if (lead) {
    std::fflush(stdout);
    const double all_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "ncf_recommend: %lld %s in %.2f s (%.0f/s), %.2f s in all\n",
                 (long long)total, f.pairs.empty() ? "users" : "pairs", score_s,
                 score_s > 0 ? double(total) / score_s : 0.0, all_s);
  }
  comm->barrier();
  return 0;
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  ncf::upgrade_blas_kernels(argv);
  return ncf::run_main(argc, argv, ncf::recommend_main, "ncf_recommend");
}
