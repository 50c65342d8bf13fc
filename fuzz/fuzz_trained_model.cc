// Fuzz target: a checkpoint's tables and tower as ncf_export reads them,
// through load_trained_model (open_checkpoint, the manifest's model shape,
// tower.f32, the sizes of user.rows.f32 and item.rows.f32) and the table
// reads (read_rows, for_each_piece).
//
// Input: as fuzz_checkpoint's (a mode byte and manifest.json, then the files
// it lists, in its order), with the same mode bits 1 and 2.
// Properties: the tables hold whole rows of D floats, and streaming them in
// pieces reads every row once, in order.
#include "export/trained_model.h"
#include "fuzz_util.h"
#include "train/checkpoint.h"

using namespace ncf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::reset_scratch();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool reseal = !(mode & 1), fix = !(mode & 2);
  const std::vector<std::string> parts = fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), fuzz::kFileSep);
  const std::string path = fuzz::in_scratch(checkpoint_name(3));
  fuzz::write_checkpoint(path, parts, reseal, fix);

  fuzz::refused_or_ran(path, [&] {
    const TrainedModel m = load_trained_model(path);
    if (m.D < 1 || m.U < 0 || m.I < 0) fuzz::property_failed("a model of no width");
    if (int64_t(m.params.size()) * 4 * 3 != m.reader->bytes("tower.f32"))
      fuzz::property_failed("tower.f32 does not hold the tower and its Adam moments");
    for (TrainedModel::Table t : {TrainedModel::kUsers, TrainedModel::kItems}) {
      int64_t next = 0;
      m.for_each_piece(t, 3, [&](int64_t first, int64_t rows, const float*) {
        if (first != next || rows < 1 || rows > 3) fuzz::property_failed("pieces out of order");
        next += rows;
      });
      if (next != m.rows(t)) fuzz::property_failed("pieces do not cover the table");
      if (m.rows(t) > 0) {
        std::vector<float> row(size_t(m.D));
        m.read_rows(t, m.rows(t) - 1, 1, row.data());
      }
    }
  });
  return 0;
}
