// export_onnx: see onnx_export.h.
#include "export/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/check.h"
#include "common/file_io.h"

namespace ncf {

namespace {

constexpr int kOpset = 17;
constexpr int kIrVersion = 8;

struct Tensor {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<float> data;  // the tower's tensors
  // A table part: columns [c0, c0 + w) of every row of `table`, read from the
  // checkpoint piece by piece as it is written.
  bool from_table = false;
  TrainedModel::Table table = TrainedModel::kUsers;
  int c0 = 0, w = 0;
  int64_t bytes() const {
    int64_t n = 4;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

Tensor columns(const std::string& name, const TrainedModel& m, TrainedModel::Table table, int c0,
               int w) {
  Tensor t{name, {m.rows(table), w}, {}};
  t.from_table = true;
  t.table = table;
  t.c0 = c0;
  t.w = w;
  return t;
}

// A table part's bytes in order, in pieces: emit(data, bytes).
void stream_columns(const TrainedModel& m, const Tensor& t,
                    const std::function<void(const float*, size_t)>& emit) {
  const int64_t piece = export_piece_rows(m.D);
  std::vector<float> cols;
  m.for_each_piece(t.table, piece, [&](int64_t, int64_t rows, const float* data) {
    cols.resize(size_t(rows * t.w));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(data + r * m.D + t.c0, t.w, cols.data() + r * t.w);
    emit(cols.data(), cols.size() * 4);
  });
}

onnx::NodeProto* node(onnx::GraphProto* g, const char* op, std::vector<std::string> in,
                      const std::string& out) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out);
  for (const std::string& x : in) n->add_input(x);
  n->add_output(out);
  return n;
}

void int_attribute(onnx::NodeProto* n, const char* name, int64_t v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void vector_value(onnx::ValueInfoProto* v, const std::string& name, int elem) {
  v->set_name(name);
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  t->mutable_shape()->add_dim()->set_dim_param("N");
}

// The initializers: the four table parts (streamed from the checkpoint),
// then the tower's and the head's tensors.
std::vector<Tensor> model_tensors(const TrainedModel& m) {
  const int mf = m.config.mf_dim, h = m.config.mlp_half();
  std::vector<Tensor> tensors;
  tensors.push_back(columns("user_gmf", m, TrainedModel::kUsers, 0, mf));
  tensors.push_back(columns("item_gmf", m, TrainedModel::kItems, 0, mf));
  tensors.push_back(columns("user_mlp", m, TrainedModel::kUsers, mf, h));
  tensors.push_back(columns("item_mlp", m, TrainedModel::kItems, mf, h));
  for (size_t l = 0; l < m.tower.size(); ++l) {
    const DenseLayerView& v = m.tower[l];
    const std::string p = "mlp_" + std::to_string(l);
    tensors.push_back({p + "_weight",
                       {v.out, v.in},
                       std::vector<float>(m.params.begin() + v.w_offset,
                                          m.params.begin() + v.w_offset + int64_t(v.out) * v.in)});
    tensors.push_back(
        {p + "_bias",
         {v.out},
         std::vector<float>(m.params.begin() + v.b_offset, m.params.begin() + v.b_offset + v.out)});
  }
  const int F = m.config.head_width();
  tensors.push_back({"head_weight",
                     {F},
                     std::vector<float>(m.params.begin() + m.head_w_offset,
                                        m.params.begin() + m.head_w_offset + F)});
  tensors.push_back({"head_bias", {1}, {m.params[size_t(m.head_c_offset)]}});
  return tensors;
}

// Which tensors go to external data: all four table parts (kAlways), none
// (kNever), or the largest ones until the rest fits inline (kAuto). The
// tower stays inside: it is small and runtimes read it at load either way.
std::vector<bool> place_tensors(const std::vector<Tensor>& tensors, ExternalData external,
                                int64_t inline_limit, const std::string& path) {
  std::vector<bool> outside(tensors.size(), false);
  if (external == ExternalData::kAlways) std::fill_n(outside.begin(), 4, true);
  int64_t inline_bytes = 0;
  for (size_t k = 0; k < tensors.size(); ++k)
    if (!outside[k]) inline_bytes += tensors[k].bytes();
  if (external == ExternalData::kAuto) {
    std::vector<size_t> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tensors[a].bytes() > tensors[b].bytes(); });
    for (size_t k : order) {
      if (inline_bytes <= inline_limit) break;
      outside[k] = true;
      inline_bytes -= tensors[k].bytes();
    }
  }
  if (inline_bytes > inline_limit)
    NCF_FAIL(path, ": ", inline_bytes, " bytes of initializers stay inside the model, more than ",
             inline_limit,
             external == ExternalData::kNever ? " (--external_data never)"
                                              : " (the tower alone; tables are already outside)");
  return outside;
}

// Each tensor as an initializer of `g`: its bytes inline, or in PATH.data
// (page-aligned) when `outside` says so; an earlier export's .data goes when
// none is.
void add_initializers(onnx::GraphProto* g, const TrainedModel& m,
                      const std::vector<Tensor>& tensors, const std::vector<bool>& outside,
                      const std::string& path) {
  const std::string data_name = std::filesystem::path(path).filename().string() + ".data";
  const std::string data_path = path + ".data";
  std::ofstream data_file;
  int64_t data_at = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    onnx::TensorProto* p = g->add_initializer();
    p->set_name(t.name);
    p->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : t.dims) p->add_dims(d);
    const size_t bytes = size_t(t.bytes());
    if (!outside[k]) {
      if (!t.from_table) {
        p->set_raw_data(t.data.data(), bytes);
        continue;
      }
      std::string raw;
      raw.reserve(bytes);
      stream_columns(
          m, t, [&](const float* d, size_t n) { raw.append(reinterpret_cast<const char*>(d), n); });
      p->set_raw_data(std::move(raw));
      continue;
    }
    if (!data_file.is_open()) {
      data_file.open(data_path, std::ios::binary | std::ios::trunc);
      if (!data_file) NCF_FAIL(data_path, ": cannot open for writing");
    }
    data_at = (data_at + 4095) / 4096 * 4096;  // page-aligned, so runtimes may map it
    data_file.seekp(data_at);
    stream_columns(m, t, [&](const float* d, size_t n) {
      data_file.write(reinterpret_cast<const char*>(d), std::streamsize(n));
    });
    p->set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"location", data_name},
                                     {"offset", std::to_string(data_at)},
                                     {"length", std::to_string(bytes)}}) {
      onnx::StringStringEntryProto* e = p->add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
    data_at += int64_t(bytes);
  }
  if (data_file.is_open()) {
    data_file.close();
    if (!data_file) NCF_FAIL(data_path, ": write failed");
  } else {
    // A .data file of an earlier export to the same path would otherwise look
    // like part of this model.
    std::error_code ec;
    std::filesystem::remove(data_path, ec);
  }
}

// NeuMF: GMF (the product of the embeddings' first columns), the MLP tower
// over the rest, the head over both.
void add_nodes(onnx::GraphProto* g, const TrainedModel& m) {
  node(g, "Gather", {"user_gmf", "user"}, "user_gmf_rows");
  node(g, "Gather", {"item_gmf", "item"}, "item_gmf_rows");
  node(g, "Mul", {"user_gmf_rows", "item_gmf_rows"}, "gmf");
  node(g, "Gather", {"user_mlp", "user"}, "user_mlp_rows");
  node(g, "Gather", {"item_mlp", "item"}, "item_mlp_rows");
  int_attribute(node(g, "Concat", {"user_mlp_rows", "item_mlp_rows"}, "mlp_0_in"), "axis", 1);
  std::string x = "mlp_0_in";
  for (size_t l = 0; l < m.tower.size(); ++l) {
    const std::string p = "mlp_" + std::to_string(l);
    int_attribute(node(g, "Gemm", {x, p + "_weight", p + "_bias"}, p + "_linear"), "transB", 1);
    x = "mlp_" + std::to_string(l + 1) + "_in";
    node(g, "Relu", {p + "_linear"}, x);
  }
  int_attribute(node(g, "Concat", {"gmf", x}, "head_in"), "axis", 1);
  node(g, "MatMul", {"head_in", "head_weight"}, "head_dot");
  node(g, "Add", {"head_dot", "head_bias"}, "logit");
  node(g, "Sigmoid", {"logit"}, "score");
}

}  // namespace

void export_onnx(const TrainedModel& m, const std::string& path, ExternalData external,
                 int64_t inline_limit) {
  NCF_CHECK(inline_limit >= 0, path, ": the inline limit must be >= 0, not ", inline_limit);
  const std::vector<Tensor> tensors = model_tensors(m);
  const std::vector<bool> outside = place_tensors(tensors, external, inline_limit, path);

  onnx::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name("ncf_dist");
  model.set_doc_string("NeuMF (GMF + MLP) from checkpoint " + m.path + " (step " +
                       std::to_string(m.manifest.step) + ", dataset " + m.manifest.dataset_id +
                       "); inputs are dense user and item ids");
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("neumf");
  vector_value(g->add_input(), "user", onnx::TensorProto::INT64);
  vector_value(g->add_input(), "item", onnx::TensorProto::INT64);
  vector_value(g->add_output(), "score", onnx::TensorProto::FLOAT);
  vector_value(g->add_output(), "logit", onnx::TensorProto::FLOAT);

  add_initializers(g, m, tensors, outside, path);
  add_nodes(g, m);

  std::string bytes;
  if (!model.SerializeToString(&bytes)) NCF_FAIL(path, ": the model does not serialize");
  write_file_atomic(path, bytes);
  try {
    onnx::checker::check_model(path);
  } catch (const std::exception& e) {
    NCF_FAIL(path, ": the ONNX checker refuses the model: ", e.what());
  }
}

}  // namespace ncf
