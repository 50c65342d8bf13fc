// Trainer's parameters and checkpoints: gather_parameters, save, resume, load and
// the warm start (--init_from); see trainer.h and checkpoint.h.
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/file_io.h"
#include "data/crc32c.h"
#include "train/checkpoint.h"
#include "train/checkpoint_lock.h"
#include "train/trainer.h"
#include "train/trainer_clock.h"

namespace ncf {

namespace {

using trainer_detail::Clock;
using trainer_detail::seconds_since;

}  // namespace

std::vector<float> Trainer::gather_parameters() {
  std::vector<float> out(size_t(model_->num_params()));
  device_copy(Device::kCpu, out.data(), ctx_.device, model_->params().data(), out.size() * 4);
  for (int t = 0; t < tables_->num_tables(); ++t) {
    std::vector<float> rows = tables_->gather_table(t);
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

// ------------------------------------------------------------- checkpoints ---
//
// Files of a checkpoint (raw little-endian arrays, checkpoint.h):
//   tower.f32             [3 × params] the tower's parameters, Adam m, Adam v
//   loss.f64              [W × epoch_step] each rank's loss shares of the
//                         steps of the current epoch taken so far
//   <table>.<array>.f32   [N × D] in global row order, one per state array:
//                         rows, then the optimizer's (m and v, or accumulator;
//                         row-wise Adagrad's row_accumulator is [N × 1])

namespace {

std::vector<std::string> state_array_names(EmbeddingOptimizer o) {
  if (o == EmbeddingOptimizer::kRowwiseAdagrad) return {"rows", "row_accumulator"};
  switch (optimizer_state_arrays(o)) {
    case 0:
      return {"rows"};
    case 1:
      return {"rows", "accumulator"};
    default:
      return {"rows", "m", "v"};
  }
}

}  // namespace

std::string Trainer::save_checkpoint(int64_t epoch, int64_t epoch_step) {
  const auto t0 = Clock::now();
  const int W = comm_.world(), r = comm_.rank();
  // Rank 0 fails here, before anything is written, when another job took the
  // directory over; the ranks waiting in the writer's first barrier go down
  // with it (run_main).
  if (lock_ != nullptr && r == 0) lock_->check_held("checkpoint " + checkpoint_name(state_.t));
  CheckpointWriter w(comm_, cfg_.checkpoint_dir, state_.t);
  w.set_damaged(damaged_);
  // The tower and its Adam moments: rank 0 writes them (every rank holds them).
  const int64_t params = model_->num_params();
  {
    std::vector<float> tower(r == 0 ? size_t(3 * params) : 0);
    if (r == 0) {
      device_copy(Device::kCpu, tower.data(), ctx_.device, model_->params().data(), params * 4);
      device_copy(Device::kCpu, tower.data() + params, ctx_.device, state_.adam_m.data(),
                  params * 4);
      device_copy(Device::kCpu, tower.data() + 2 * params, ctx_.device, state_.adam_v.data(),
                  params * 4);
    }
    w.write("tower.f32", 3 * params * 4, 0, tower.data(), tower.size() * 4);
  }
  // Each rank's loss shares of this epoch so far.
  {
    std::vector<double> shares(static_cast<size_t>(epoch_step));
    device_copy(Device::kCpu, shares.data(), ctx_.device, step_loss_.data(), shares.size() * 8);
    w.write("loss.f64", int64_t(W) * epoch_step * 8, int64_t(r) * epoch_step * 8, shares.data(),
            shares.size() * 8);
  }
  // The tables, each rank writing its block of global rows, chunk by chunk.
  nlohmann::json tables = nlohmann::json::array();
  const std::vector<std::string> arrays = state_array_names(table_optimizer_);
  for (int t = 0; t < tables_->num_tables(); ++t) {
    const TableSpec& spec = plan_.tables[t];
    for (int a = 0; a < int(arrays.size()); ++a) {
      const int64_t row_bytes = int64_t(tables_->state_width(a)) * 4;
      int64_t first = 0, count = 0;
      block_range(spec.num_rows, W, r, &first, &count);
      w.begin_part(spec.name + "." + arrays[a] + ".f32", spec.num_rows * row_bytes,
                   first * row_bytes, count * row_bytes);
      for (int64_t c = 0; c < tables_->num_chunks(t); ++c) {
        int64_t rows = 0;
        const float* chunk = tables_->export_chunk(t, a, c, &rows);
        w.append(chunk, size_t(rows * row_bytes));
      }
      w.end_part();
    }
    tables.push_back(
        {{"name", spec.name}, {"rows", spec.num_rows}, {"width", plan_.D}, {"arrays", arrays}});
  }
  // A copy of the dataset's id maps, so that the checkpoint's rows can be
  // matched by original id without the dataset (--init_from, ncf_export
  // --since): rank 0 copies each file in 8 MiB pieces, checked against the
  // CRC metadata.json gives.
  for (const IdMapInfo& info : meta_.id_maps) {
    const int64_t bytes = int64_t(info.bytes);
    w.begin_part(info.name, bytes, r == 0 ? 0 : bytes, r == 0 ? bytes : 0);
    if (r == 0) {
      const std::string file = cfg_.data_dir + "/" + info.name;
      FileHandle f(file, O_RDONLY);
      std::vector<char> piece(size_t(std::min<int64_t>(bytes, int64_t(8) << 20)));
      uint32_t crc = 0;
      for (int64_t at = 0; at < bytes;) {
        const size_t n = size_t(std::min<int64_t>(bytes - at, int64_t(piece.size())));
        f.read_at(at, piece.data(), n);
        crc = crc32c_extend(crc, piece.data(), n);
        w.append(piece.data(), n);
        at += int64_t(n);
      }
      NCF_REQUIRE(crc == info.crc32c, file,
                  ": the id map changed while this run used it (its CRC-32C is no longer "
                  "metadata.json's); the checkpoint is not written");
    }
    w.end_part();
  }
  CheckpointManifest m;
  m.step = state_.t;
  m.epoch = epoch;
  m.epoch_step = epoch_step;
  m.world = W;
  m.dataset_id = meta_.dataset_id;
  m.config = trajectory_flags(cfg_);
  m.tables = tables;
  m.id_maps = meta_.id_maps;
  m.init_from = init_from_;
  const std::string path = w.commit(m, cfg_.keep_checkpoints);
  last_checkpoint_ = Clock::now();
  saved_step_ = state_.t;
  if (r == 0) {
    const double sec = seconds_since(t0);
    std::printf("ncf_dist: checkpoint %s: step %lld, %.1f MiB in %.2f s (%.0f MiB/s)\n",
                path.c_str(), (long long)state_.t, double(w.bytes_written()) / 1048576.0, sec,
                sec > 0 ? double(w.bytes_written()) / 1048576.0 / sec : 0.0);
    for (const std::string& note : w.retention_notes()) std::printf("ncf_dist: %s\n", note.c_str());
    std::fflush(stdout);
  }
  return path;
}

void Trainer::save_final_checkpoint() {
  if (checkpointing() && saved_step_ != state_.t)
    save_checkpoint(position_.epoch, position_.epoch_step);
}

Trainer::Position Trainer::resume() {
  std::vector<std::string> log;
  std::optional<CheckpointReader> ck =
      find_checkpoint(comm_, cfg_.resume, cfg_.checkpoint_dir, &log, &damaged_);
  if (comm_.rank() == 0) {
    if (checkpointing() && !cfg_.eval_only) {
      // What the directory holds, before anything is written or removed there.
      const CheckpointDirListing l = list_checkpoint_dir(cfg_.checkpoint_dir);
      std::string steps;
      for (const auto& [step, path] : l.sealed)
        steps += (steps.empty() ? " (steps " : ", ") + std::to_string(step);
      std::printf(
          "ncf_dist: checkpoint directory %s: %zu sealed checkpoint%s%s%s; retention keeps the "
          "newest %d that load (--keep_checkpoints)%s\n",
          cfg_.checkpoint_dir.c_str(), l.sealed.size(), l.sealed.size() == 1 ? "" : "s",
          steps.empty() ? "" : (steps + ")").c_str(),
          l.unsealed.empty() ? ""
                             : (", " + std::to_string(l.unsealed.size()) + " unsealed").c_str(),
          cfg_.keep_checkpoints,
          damaged_.empty() ? ""
          : damaged_.size() == 1
              ? " and leaves the one that does not load"
              : (" and leaves the " + std::to_string(damaged_.size()) + " that do not load")
                    .c_str());
    }
    for (const std::string& line : log) std::printf("ncf_dist: %s\n", line.c_str());
    std::fflush(stdout);
  }
  if (!ck) return {};
  load_checkpoint(*ck);
  position_ = {ck->manifest().epoch, ck->manifest().epoch_step};
  saved_step_ = ck->manifest().step;
  resumed_from_ = ck->path();
  return position_;
}

void Trainer::load_checkpoint(const CheckpointReader& ck) {
  const CheckpointManifest& m = ck.manifest();
  const std::string& path = ck.path();
  const int W = comm_.world(), r = comm_.rank();
  if (m.dataset_id != meta_.dataset_id)
    NCF_FAIL("checkpoint ", path, " belongs to dataset ", m.dataset_id, ", but --data_dir ",
             cfg_.data_dir, " holds dataset ", meta_.dataset_id);
  const nlohmann::json recorded = with_later_flags(m.config);
  // A run without --embedding_lr keeps the rate its checkpoint was written with:
  // the defaults may have changed since (one of sgd, adagrad or rowwise_adagrad
  // from before they had their own records -1, --learning_rate's).
  const bool lr_allowed = std::find(cfg_.allow_changed.begin(), cfg_.allow_changed.end(),
                                    "embedding_lr") != cfg_.allow_changed.end();
  if (!cfg_.embedding_lr_given && !lr_allowed && !cfg_.eval_only && recorded.is_object() &&
      recorded.contains("embedding_lr") &&
      recorded.at("embedding_lr") != nlohmann::json(cfg_.embedding_lr)) {
    const nlohmann::json& j = recorded.at("embedding_lr");
    if (!j.is_number() ||
        !(j.get<double>() < 0 || (j.get<double>() > 0 && j.get<double>() <= 1000)))
      NCF_FAIL("checkpoint ", path, " records --embedding_lr ", j.dump(),
               ", not negative or in (0, 1000]");
    const std::string instead = embedding_lr_description(cfg_);
    cfg_.embedding_lr = j.get<double>();
    cfg_.embedding_lr_from =
        (cfg_.embedding_lr < 0 ? "--learning_rate, as checkpoint " + path + " records"
                               : "checkpoint " + path + "'s");
    tables_->set_learning_rate(float(effective_embedding_lr(cfg_)));
    if (r == 0) {
      std::printf("ncf_dist: %s: kept, as no --embedding_lr was given (instead of %s)\n",
                  embedding_lr_description(cfg_).c_str(), instead.c_str());
      std::fflush(stdout);
    }
  }
  // Every flag the trajectory depends on must match, unless allowed to change.
  const nlohmann::json now = trajectory_flags(cfg_);
  for (auto it = now.begin(); it != now.end(); ++it) {
    // Evaluating needs only what fixes the shapes and the state arrays.
    const bool shape =
        it.key() == "num_factors" || it.key() == "layers" || it.key() == "embedding_optimizer";
    const bool allowed = (cfg_.eval_only && !shape) ||
                         std::find(cfg_.allow_changed.begin(), cfg_.allow_changed.end(),
                                   it.key()) != cfg_.allow_changed.end();
    if (!recorded.contains(it.key()))
      NCF_FAIL("checkpoint ", path, " does not record flag --", it.key());
    if (recorded.at(it.key()) != it.value() && !allowed)
      NCF_FAIL("checkpoint ", path, " was written with --", it.key(), " ",
               recorded.at(it.key()).dump(), ", this run has --", it.key(), " ", it.value().dump(),
               std::find(changeable_flags().begin(), changeable_flags().end(), it.key()) !=
                       changeable_flags().end()
                   ? " (pass --allow_changed_flags " + it.key() +
                         (it.key() == "table_dtype" ? " to convert the tables)" : " to change it)")
                   : " (a resumed run must keep it; start without --resume to change it)");
  }
  // The tower and its moments.
  const int64_t params = model_->num_params();
  NCF_REQUIRE(ck.bytes("tower.f32") == 3 * params * 4, "checkpoint ", path, ": tower.f32 has ",
              ck.bytes("tower.f32"), " bytes, this model (--num_factors, --layers) needs ",
              3 * params * 4);
  {
    std::vector<float> tower(static_cast<size_t>(3 * params));
    ck.read("tower.f32", 0, tower.data(), tower.size() * 4);
    device_copy(ctx_.device, model_->params().data(), Device::kCpu, tower.data(), params * 4);
    device_copy(ctx_.device, state_.adam_m.data(), Device::kCpu, tower.data() + params, params * 4);
    device_copy(ctx_.device, state_.adam_v.data(), Device::kCpu, tower.data() + 2 * params,
                params * 4);
  }
  if (recorded.at("table_dtype") != cfg_.table_dtype && comm_.rank() == 0) {
    std::printf("ncf_dist: checkpoint %s: table rows converted from %s to %s (%s)\n", path.c_str(),
                recorded.at("table_dtype").get<std::string>().c_str(), cfg_.table_dtype.c_str(),
                cfg_.table_dtype == "bf16" ? "rounded to nearest-even" : "widened, exact");
    std::fflush(stdout);
  }
  state_.t = m.step;
  // The tables: each rank reads its block of every array, chunk by chunk; the
  // collection sends the rows to the ranks this run's plan gives them.
  const std::vector<std::string> arrays = state_array_names(table_optimizer_);
  // As large as the largest chunk read, not --checkpoint_chunk_kib: a small table's resume
  // does not allocate and clear 64 MiB.
  std::vector<float> chunk(1);
  for (int t = 0; t < tables_->num_tables(); ++t) {
    const TableSpec& spec = plan_.tables[t];
    for (int a = 0; a < int(arrays.size()); ++a) {
      const std::string name = spec.name + "." + arrays[a] + ".f32";
      const int64_t width = tables_->state_width(a);
      NCF_REQUIRE(ck.bytes(name) == spec.num_rows * width * 4, "checkpoint ", path, ": ", name,
                  " has ", ck.bytes(name), " bytes, table ", spec.name, " needs ", spec.num_rows,
                  " rows x ", width, " floats");
      for (int64_t c = 0; c < tables_->num_chunks(t); ++c) {
        int64_t lo = 0, rows = 0;
        tables_->chunk_range(t, r, c, &lo, &rows);
        if (chunk.size() < size_t(rows * width)) chunk.resize(size_t(rows * width));
        ck.read(name, lo * width * 4, chunk.data(), size_t(rows * width) * 4);
        tables_->import_chunk(t, a, c, chunk.data());
      }
    }
  }
  // The loss shares of the resumed epoch: each rank its own when W is the
  // same; otherwise rank 0 takes each step's sum over the old ranks.
  const int64_t k = m.epoch_step;
  // Bounded before the product: a manifest's counters are only known to be
  // non-negative integers.
  NCF_REQUIRE(k <= std::numeric_limits<int64_t>::max() / 8 / m.world, "checkpoint ", path,
              ": epoch_step ", k, " of ", m.world, " ranks is beyond any loss.f64");
  NCF_REQUIRE(ck.bytes("loss.f64") == int64_t(m.world) * k * 8, "checkpoint ", path,
              ": loss.f64 has ", ck.bytes("loss.f64"), " bytes for ", m.world, " ranks x ", k,
              " steps");
  resumed_loss_.assign(size_t(k), 0.0);
  if (m.world == W) {
    ck.read("loss.f64", int64_t(r) * k * 8, resumed_loss_.data(), size_t(k) * 8);
  } else if (r == 0) {
    std::vector<double> all(static_cast<size_t>(m.world * k));
    ck.read("loss.f64", 0, all.data(), all.size() * 8);
    for (int p = 0; p < m.world; ++p)
      for (int64_t s = 0; s < k; ++s) resumed_loss_[size_t(s)] += all[size_t(p * k + s)];
  }
  last_checkpoint_ = Clock::now();
}

void Trainer::warm_start() {
  const int W = comm_.world(), r = comm_.rank();
  std::vector<std::string> log;
  const CheckpointReader ck = open_checkpoint(comm_, cfg_.init_from, &log, "--init_from");
  if (r == 0) {
    for (std::string line : log) {
      if (line.rfind("resuming from ", 0) == 0) line = "warm start from " + line.substr(14);
      std::printf("ncf_dist: --init_from: %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  const CheckpointManifest& m = ck.manifest();
  const std::string& path = ck.path();
  const std::vector<std::string> ancestors = meta_.ancestors();
  if (m.dataset_id != meta_.dataset_id &&
      std::find(ancestors.begin(), ancestors.end(), m.dataset_id) == ancestors.end()) {
    std::string line;
    for (const std::string& a : ancestors) line += (line.empty() ? "" : ", ") + a;
    NCF_FAIL("flag --init_from ", path, ": the checkpoint belongs to dataset ", m.dataset_id,
             ", which is neither --data_dir ", cfg_.data_dir, " (dataset ", meta_.dataset_id,
             ") nor one it extends (",
             line.empty() ? std::string("it was made from scratch") : "its ancestors: " + line,
             "); a warm start continues a model on a dataset made from its own with ncf_prep "
             "--extend");
  }
  const nlohmann::json recorded = with_later_flags(m.config);
  const bool keep = cfg_.init_optimizer_state == "keep" && !cfg_.eval_only;
  const nlohmann::json now = trajectory_flags(cfg_);
  for (const char* key : {"num_factors", "layers", "embedding_optimizer"}) {
    if (!recorded.contains(key))
      NCF_FAIL("flag --init_from ", path, ": the checkpoint does not record --", key);
    const bool state = std::string(key) == "embedding_optimizer";
    if (recorded.at(key) != now.at(key) && (!state || keep))
      NCF_FAIL("flag --init_from ", path, ": the checkpoint was trained with --", key, " ",
               recorded.at(key).dump(), ", this run has --", key, " ", now.at(key).dump(),
               state ? " (pass --init_optimizer_state reset to start the new optimizer's state "
                       "afresh)"
                     : " (a warm start keeps the model's shape)");
  }
  // The tower, and its Adam moments unless reset.
  const int64_t params = model_->num_params();
  NCF_REQUIRE(ck.bytes("tower.f32") == 3 * params * 4, "flag --init_from ", path,
              ": tower.f32 has ", ck.bytes("tower.f32"), " bytes, this model needs ",
              3 * params * 4);
  {
    std::vector<float> tower(static_cast<size_t>(3 * params));
    ck.read("tower.f32", 0, tower.data(), tower.size() * 4);
    if (!keep) std::fill(tower.begin() + params, tower.end(), 0.0f);
    device_copy(ctx_.device, model_->params().data(), Device::kCpu, tower.data(), params * 4);
    device_copy(ctx_.device, state_.adam_m.data(), Device::kCpu, tower.data() + params, params * 4);
    device_copy(ctx_.device, state_.adam_v.data(), Device::kCpu, tower.data() + 2 * params,
                params * 4);
  }
  state_.t = keep ? m.step : 0;
  // The tables: each rank maps the rows of its block to the checkpoint's by
  // original id, then the chunks go through the collection as in a resume,
  // the rows the checkpoint lacks keeping this run's initial values.
  const IdMaps old_maps = ck.id_maps();
  const IdMaps new_maps = load_id_maps(cfg_.data_dir, meta_);
  const std::vector<std::string> arrays = state_array_names(table_optimizer_);
  const size_t num_arrays = keep ? arrays.size() : 1;
  int64_t counts[4] = {0, 0, 0, 0};  // user rows found, new; item rows found, new
  for (int t = 0; t < tables_->num_tables(); ++t) {
    const TableSpec& spec = plan_.tables[t];
    const IdMap& now_map = spec.name == "user" ? new_maps.user : new_maps.item;
    const IdMap& old_map = spec.name == "user" ? old_maps.user : old_maps.item;
    const int64_t old_rows = checkpoint_table_rows(m, spec.name, path);
    int64_t first = 0, count = 0;
    block_range(spec.num_rows, W, r, &first, &count);
    std::vector<int64_t> source(static_cast<size_t>(count));
    try {
      for (int64_t k = 0; k < count; ++k) source[size_t(k)] = old_map.find_same(now_map, first + k);
    } catch (const Error& e) {
      NCF_RETHROW(e, "flag --init_from ", path, ": table ", spec.name, " of ", cfg_.data_dir);
    }
    for (int64_t s : source) ++counts[2 * (t == 0 ? 0 : 1) + (s < 0 ? 1 : 0)];
    for (size_t a = 0; a < num_arrays; ++a) {
      const std::string name = spec.name + "." + arrays[a] + ".f32";
      const int64_t width = tables_->state_width(int(a));
      NCF_REQUIRE(ck.bytes(name) == old_rows * width * 4, "flag --init_from ", path, ": ", name,
                  " has ", ck.bytes(name), " bytes for ", old_rows, " rows x ", width, " floats");
      std::vector<float> chunk;
      for (int64_t c = 0; c < tables_->num_chunks(t); ++c) {
        int64_t lo = 0, rows = 0;
        const float* now_rows = tables_->export_chunk(t, int(a), c, &rows);
        chunk.assign(now_rows, now_rows + rows * width);
        tables_->chunk_range(t, r, c, &lo, &rows);
        // Runs of rows whose sources are consecutive: one read each.
        for (int64_t k = 0; k < rows;) {
          const int64_t s = source[size_t(lo - first + k)];
          if (s < 0) {
            ++k;
            continue;
          }
          int64_t run = 1;
          while (k + run < rows && source[size_t(lo - first + k + run)] == s + run) ++run;
          ck.read(name, s * width * 4, chunk.data() + k * width, size_t(run * width) * 4);
          k += run;
        }
        tables_->import_chunk(t, int(a), c, chunk.data());
      }
    }
  }
  all_reduce_sum_on(comm_, Device::kCpu, counts, 4, DType::kInt64);
  init_from_ = {{"path", path},
                {"dataset_id", m.dataset_id},
                {"step", m.step},
                {"optimizer_state", keep ? "keep" : "reset"}};
  if (r == 0) {
    std::printf(
        "ncf_dist: warm start from %s (dataset %s, step %lld): users %lld from the checkpoint, "
        "%lld new; items %lld from the checkpoint, %lld new; tower carried over; optimizer "
        "state %s\n",
        path.c_str(), m.dataset_id.c_str(), (long long)m.step, (long long)counts[0],
        (long long)counts[1], (long long)counts[2], (long long)counts[3], keep ? "kept" : "reset");
    std::fflush(stdout);
  }
}

}  // namespace ncf
