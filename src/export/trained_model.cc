// load_trained_model: see trained_model.h.
#include "export/trained_model.h"

#include "comm/single_communicator.h"
#include "common/check.h"

namespace ncf {

TrainedModel load_trained_model(const std::string& checkpoint) {
  SingleCommunicator comm;
  std::vector<std::string> log;
  const CheckpointReader ck = open_checkpoint(comm, checkpoint, &log);
  TrainedModel m;
  m.path = ck.path();
  m.manifest = ck.manifest();
  const std::string where = ck.path() + "/" + kCheckpointManifestFile;
  try {
    m.config.mf_dim = m.manifest.config.at("num_factors").get<int>();
    m.config.layers = m.manifest.config.at("layers").get<std::vector<int>>();
  } catch (const nlohmann::json::exception&) {
    NCF_FAIL(where, ": config has no valid num_factors and layers");
  }
  m.config.validate();
  m.D = m.config.embedding_width();
  const NeuMF shape(m.config, Device::kCpu);
  m.tower = shape.tower();
  m.head_w_offset = shape.head_w_offset();
  m.head_c_offset = shape.head_c_offset();
  const int64_t P = shape.num_params();
  NCF_CHECK(ck.bytes("tower.f32") == 3 * P * 4, ck.path(), ": tower.f32 has ",
            ck.bytes("tower.f32"), " bytes, a model of this shape needs ", 3 * P * 4);
  m.params.resize(size_t(P));
  ck.read("tower.f32", 0, m.params.data(), m.params.size() * 4);
  for (const char* table : {"user", "item"}) {
    const std::string name = std::string(table) + ".rows.f32";
    const int64_t bytes = ck.bytes(name);
    NCF_CHECK(bytes % (int64_t(m.D) * 4) == 0, ck.path(), ": ", name, " has ", bytes,
              " bytes, not whole rows of ", m.D, " floats");
    std::vector<float>& rows = table[0] == 'u' ? m.users : m.items;
    rows.resize(size_t(bytes / 4));
    ck.read(name, 0, rows.data(), size_t(bytes));
    (table[0] == 'u' ? m.U : m.I) = bytes / (int64_t(m.D) * 4);
  }
  return m;
}

}  // namespace ncf
