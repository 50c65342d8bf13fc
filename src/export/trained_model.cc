// load_trained_model and the table reads: see trained_model.h.
#include "export/trained_model.h"

#include <algorithm>

#include "comm/single_communicator.h"
#include "common/check.h"
#include "train/config.h"

namespace ncf {

void TrainedModel::read_rows(Table t, int64_t first, int64_t count, float* out) const {
  NCF_CHECK(first >= 0 && count >= 0 && first + count <= rows(t), path, "/", table_file(t),
            ": rows [", first, ", ", first + count, ") out of [0, ", rows(t), ")");
  reader->read(table_file(t), first * D * 4, out, size_t(count * D) * 4);
}

void TrainedModel::for_each_piece(
    Table t, int64_t piece_rows,
    const std::function<void(int64_t, int64_t, const float*)>& visit) const {
  NCF_CHECK(piece_rows >= 1, "for_each_piece: piece_rows ", piece_rows, " must be >= 1");
  const int64_t n = rows(t);
  std::vector<float> buf(size_t(std::min(piece_rows, std::max<int64_t>(n, 1)) * D));
  for (int64_t a = 0; a < n; a += piece_rows) {
    const int64_t m = std::min(piece_rows, n - a);
    read_rows(t, a, m, buf.data());
    visit(a, m, buf.data());
  }
}

int64_t export_piece_rows(int D) { return std::max<int64_t>(1, (int64_t{64} << 20) / (4 * D)); }

TrainedModel load_trained_model(const std::string& checkpoint) {
  SingleCommunicator comm;
  std::vector<std::string> log;
  TrainedModel m = trained_model_of(
      std::make_shared<const CheckpointReader>(open_checkpoint(comm, checkpoint, &log)));
  // A directory whose newer checkpoints did not load: say which were skipped
  // and which one was taken (nothing is skipped without a word).
  if (log.size() > 1 || (log.size() == 1 && log[0].rfind("resuming from ", 0) != 0)) {
    std::vector<std::string> lines;
    for (const std::string& line : log) {
      if (line.rfind("resuming from ", 0) == 0)
        lines.push_back("taking " + line.substr(14));
      else if (line.rfind("warning: ", 0) == 0)
        lines.push_back(line.substr(9));
      else
        lines.push_back(line);
    }
    for (const std::string& w : m.warnings)
      if (std::find(lines.begin(), lines.end(), w) == lines.end()) lines.push_back(w);
    m.warnings = lines;
  }
  return m;
}

TrainedModel trained_model_of(std::shared_ptr<const CheckpointReader> reader) {
  TrainedModel m;
  m.reader = std::move(reader);
  const CheckpointReader& ck = *m.reader;
  m.path = ck.path();
  m.manifest = ck.manifest();
  m.warnings = m.manifest.unsealed_warning.empty()
                   ? std::vector<std::string>{}
                   : std::vector<std::string>{m.manifest.unsealed_warning};
  const std::string where = ck.path() + "/" + kCheckpointManifestFile;
  // The recorded flags, each within the range ncf_dist's command line has,
  // before the model's shape is built from them (a width past the range would
  // otherwise be allocated first).
  TrainConfig recorded;
  apply_trajectory_flags(m.manifest.config, where, &recorded);
  m.config.mf_dim = recorded.num_factors;
  m.config.layers = recorded.layers;
  m.config.validate();
  m.D = m.config.embedding_width();
  // tower.f32 against the shape before the shape is built: widths within
  // ncf_dist's ranges (65536,65536) still make a tower of 17 GB, which the
  // model's buffers would otherwise allocate for a file of a few bytes.
  const int64_t n_params = NeuMF::param_count(m.config);
  NCF_REQUIRE(ck.bytes("tower.f32") == 3 * n_params * 4, ck.path(), ": tower.f32 has ",
              ck.bytes("tower.f32"), " bytes, a model of this shape needs ", 3 * n_params * 4);
  const NeuMF shape(m.config, Device::kCpu);
  m.tower = shape.tower();
  m.head_w_offset = shape.head_w_offset();
  m.head_c_offset = shape.head_c_offset();
  m.params.resize(size_t(n_params));
  ck.read("tower.f32", 0, m.params.data(), m.params.size() * 4);
  for (TrainedModel::Table t : {TrainedModel::kUsers, TrainedModel::kItems}) {
    const std::string name = TrainedModel::table_file(t);
    const int64_t bytes = ck.bytes(name);
    NCF_REQUIRE(bytes % (int64_t(m.D) * 4) == 0, ck.path(), ": ", name, " has ", bytes,
                " bytes, not whole rows of ", m.D, " floats (the width its flags give)");
    (t == TrainedModel::kUsers ? m.U : m.I) = bytes / (int64_t(m.D) * 4);
  }
  return m;
}

}  // namespace ncf
