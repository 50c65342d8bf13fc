// ncf_export: a checkpoint as one ONNX model or as NumPy arrays.
//   ncf_export --checkpoint ck --format onnx --output neumf.onnx
//   ncf_export --checkpoint ck/step-000000000800 --format npy --output emb/ --data_dir data
#include <CLI/CLI.hpp>
#include <cstdio>

#include "comm/bootstrap.h"
#include "common/check.h"
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
  std::string checkpoint, format, output, data_dir, external = "auto";
  CLI::App app{
      "ncf_export: a trained NeuMF checkpoint as an ONNX model or NumPy arrays.\n"
      "  ncf_export --checkpoint ck --format onnx --output neumf.onnx\n"
      "  ncf_export --checkpoint ck --format npy --output emb --data_dir data"};
  app.add_option("--checkpoint", checkpoint,
                 "a checkpoint (DIR/step-N) or a --checkpoint_dir (its newest whole checkpoint)")
      ->required();
  app.add_option("--format", format, "onnx or npy")
      ->check(CLI::IsMember({"onnx", "npy"}))
      ->required();
  app.add_option("--output", output, "the .onnx file, or the directory of .npy files")->required();
  auto* data_dir_opt =
      app.add_option("--data_dir", data_dir,
                     "npy: also write the dataset's original ids (user_ids.npy, item_ids.npy)");
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
  // (CLI11 names a hidden option "", so the names are written out.)
  for (const auto& [o, name] :
       {std::pair<const CLI::Option*, const char*>{external_opt, "--external_data"},
        {external_bytes_opt, "--external_data_bytes"}})
    if (format == "npy" && o->count() > 0)
      NCF_FAIL("flag ", name, " applies to --format onnx only");
  if (format == "onnx" && data_dir_opt->count() > 0)
    NCF_FAIL("flag --data_dir applies to --format npy only");
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
