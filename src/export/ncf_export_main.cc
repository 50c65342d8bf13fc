// ncf_export: a checkpoint as one ONNX model or as NumPy arrays, or the delta
// between the NumPy exports of two checkpoints (export/delta.h) and its apply.
//   ncf_export --checkpoint ck --format onnx --output neumf.onnx
//   ncf_export --checkpoint ck/step-000000000800 --format npy --output emb/ --data_dir data
//   ncf_export --checkpoint ck/step-000000000800 --format npy --output d/ --since ck/step-...400
//   ncf_export --apply d/ --base emb400/ --output emb800/
#include <CLI/CLI.hpp>
#include <cstdio>

#include "comm/bootstrap.h"
#include "common/check.h"
#include "export/delta.h"
#include "export/npy.h"
#ifdef NCF_WITH_ONNX
#include "export/onnx_export.h"
#endif
#include "export/trained_model.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/flag_range.h"

namespace ncf {
namespace {

int export_main(int& argc, char**& argv) {
  std::string checkpoint, format, output, data_dir, since, apply, base, external = "auto";
  CLI::App app{
      "ncf_export: a trained NeuMF checkpoint as an ONNX model or NumPy arrays, or the delta "
      "between two NumPy exports.\n"
      "  ncf_export --checkpoint ck --format onnx --output neumf.onnx\n"
      "  ncf_export --checkpoint ck --format npy --output emb\n"
      "  ncf_export --checkpoint ck --format npy --output delta --since older_ck\n"
      "  ncf_export --apply delta --base older_emb --output emb"};
  auto* checkpoint_opt = app.add_option(
      "--checkpoint", checkpoint,
      "a checkpoint (DIR/step-N) or a --checkpoint_dir (its newest whole checkpoint)");
  auto* format_opt =
      app.add_option("--format", format, "onnx or npy")->check(CLI::IsMember({"onnx", "npy"}));
  app.add_option("--output", output,
                 "the .onnx file, or the directory of .npy files (of the delta with --since, of "
                 "the new export with --apply)")
      ->required();
  auto* data_dir_opt = app.add_option(
      "--data_dir", data_dir,
      "npy: the dataset whose original ids become user_ids.npy and item_ids.npy when the "
      "checkpoint carries no copy of its id maps (one that does writes them without this flag)");
  auto* since_opt = app.add_option(
      "--since", since,
      "npy: write to --output only what turns the NumPy export of this older checkpoint "
      "into that of --checkpoint (rows matched by original id)");
  auto* apply_opt = app.add_option(
      "--apply", apply,
      "a delta directory (written with --since): write the newer checkpoint's NumPy export "
      "from it and --base to --output");
  auto* base_opt = app.add_option(
      "--base", base, "with --apply: the NumPy export of the checkpoint the delta was made since");
  auto* external_opt =
      app.add_option("--external_data", external,
                     "onnx: tables in external data: auto (when the model would pass 1.5 GiB), "
                     "always, never")
          ->check(CLI::IsMember({"auto", "always", "never"}))
          ->capture_default_str();
#ifdef NCF_WITH_ONNX
  int64_t inline_limit = kOnnxInlineBytes;
#else
  int64_t inline_limit = 0;
#endif
  // Hidden: the tests lower it to cover external data on a small model. A
  // protobuf message, the .onnx file, cannot pass 2 GiB.
  auto* external_bytes_opt =
      add_ranged(app, "--external_data_bytes", inline_limit,
                 "onnx, auto: most bytes of initializers kept inside the model",
                 FlagRange::ints(0, INT32_MAX))
          ->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw_if_range_refusal(e);
    return app.exit(e);
  }
  if (apply_opt->count() == 0) {
    if (checkpoint_opt->count() == 0)
      NCF_FAIL("flag --checkpoint is required (or --apply DELTA_DIR --base EXPORT_DIR)");
    if (format_opt->count() == 0) NCF_FAIL("flag --format is required (onnx or npy)");
  }
  // (CLI11 names a hidden option "", so the names are written out.)
  for (const auto& [o, name] :
       {std::pair<const CLI::Option*, const char*>{external_opt, "--external_data"},
        {external_bytes_opt, "--external_data_bytes"}})
    if (format != "onnx" && o->count() > 0)
      NCF_FAIL("flag ", name, " applies to --format onnx only");
  if (format == "onnx" && data_dir_opt->count() > 0)
    NCF_FAIL("flag --data_dir applies to --format npy only");
  if (format == "onnx" && since_opt->count() > 0)
    NCF_FAIL("flag --since applies to --format npy only (there are no ONNX deltas)");
  if (apply_opt->count() > 0) {
    for (const auto& [o, name] :
         {std::pair<const CLI::Option*, const char*>{checkpoint_opt, "--checkpoint"},
          {since_opt, "--since"},
          {data_dir_opt, "--data_dir"}})
      if (o->count() > 0)
        NCF_FAIL("flag ", name, " does not go with --apply (the delta ", apply,
                 " holds what the new export needs)");
    if (format == "onnx") NCF_FAIL("flag --apply writes a NumPy export, not --format onnx");
    if (base_opt->count() == 0) NCF_FAIL("flag --apply needs --base (the older NumPy export)");
    const ApplySummary s = apply_npy_delta(apply, base, output);
    std::printf(
        "ncf_export: %s (step %lld -> %lld) applied to %s -> %s: the NumPy export of %s; users "
        "%lld rows from the delta, %lld from the base; items %lld from the delta, %lld from the "
        "base\n",
        apply.c_str(), (long long)s.base_step, (long long)s.step, base.c_str(), output.c_str(),
        s.checkpoint.c_str(), (long long)(s.users.changed + s.users.added),
        (long long)(s.users.rows - s.users.changed - s.users.added),
        (long long)(s.items.changed + s.items.added),
        (long long)(s.items.rows - s.items.changed - s.items.added));
    return 0;
  }
  if (base_opt->count() > 0) NCF_FAIL("flag --base goes with --apply only");
  // The manifest's flags are held to ncf_dist's ranges inside, before the
  // model's shape is built from them.
  const TrainedModel m = load_trained_model(checkpoint);
  for (const std::string& w : m.warnings)
    std::fprintf(stderr, "ncf_export: warning: %s\n", w.c_str());
  if (format == "onnx") {
#ifndef NCF_WITH_ONNX
    NCF_FAIL("--format onnx: this build has no ONNX support (install libonnx-dev and rebuild)");
#else
    export_onnx(m, output,
                external == "always"  ? ExternalData::kAlways
                : external == "never" ? ExternalData::kNever
                                      : ExternalData::kAuto,
                inline_limit);
#endif
  } else if (since_opt->count() > 0) {
    const TrainedModel older = load_trained_model(since);
    for (const std::string& w : older.warnings)
      std::fprintf(stderr, "ncf_export: warning: %s\n", w.c_str());
    const DeltaSummary s = export_npy_delta(m, older, data_dir, output);
    auto rows = [](const char* name, const TableDeltaCounts& c) {
      return std::string(name) + " " + std::to_string(c.changed) + " changed + " +
             std::to_string(c.added) + " new of " + std::to_string(c.rows) + " (" +
             std::to_string(c.dropped) + " dropped)";
    };
    const int64_t full_rows = s.users.rows + s.items.rows;
    const int64_t delta_rows = s.users.changed + s.users.added + s.items.changed + s.items.added;
    std::printf(
        "ncf_export: delta %s (step %lld) since %s (step %lld) -> %s: %s, %s; %lld of %lld rows "
        "(%.2f%%), %lld of the full export's %lld bytes (%.2f%%)\n",
        m.path.c_str(), (long long)m.manifest.step, older.path.c_str(),
        (long long)older.manifest.step, output.c_str(), rows("users", s.users).c_str(),
        rows("items", s.items).c_str(), (long long)delta_rows, (long long)full_rows,
        full_rows > 0 ? 100.0 * double(delta_rows) / double(full_rows) : 0.0,
        (long long)s.delta_bytes, (long long)s.full_bytes,
        s.full_bytes > 0 ? 100.0 * double(s.delta_bytes) / double(s.full_bytes) : 0.0);
    return 0;
  } else {
    export_npy(m, output, data_dir);
  }
  std::printf("ncf_export: %s (step %lld: %lld users, %lld items, D %d) -> %s (%s)\n",
              m.path.c_str(), (long long)m.manifest.step, (long long)m.U, (long long)m.I, m.D,
              output.c_str(), format.c_str());
  return 0;
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  return ncf::run_main(argc, argv, ncf::export_main, "ncf_export");
}
