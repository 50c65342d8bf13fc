// TensorBoard event files: see tensorboard.h.
#include "train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "common/check.h"
#include "data/format.h"
#include "train/tensorboard_event.pb.h"

namespace ncf {

namespace {

namespace fs = std::filesystem;

// What TensorBoard expects in the first record of an event file.
constexpr const char* kFileVersion = "brain.Event:2";

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::string tb_eval_tag(const std::string& metric, int k) {
  return "eval/" + metric + "@" + std::to_string(k);
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) NCF_FAIL("cannot create directory ", dir, ": ", ec.message());
  if (!fs::is_directory(dir, ec)) NCF_FAIL(dir, " is not a directory");
  const double now = unix_seconds();
  const std::string base =
      (fs::path(dir) /
       ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host_name()))
          .string();
  path_ = base;
  for (int k = 1; fs::exists(path_, ec); ++k) path_ = base + "." + std::to_string(k);
  out_ = std::make_unique<RecordWriter>(path_);  // throws naming the file and the reason
  tensorboard::Event e;
  e.set_wall_time(now);
  e.set_file_version(kFileVersion);
  write(e.SerializeAsString());
  flush();
}

TensorBoardWriter::~TensorBoardWriter() = default;  // RecordWriter's closes the file

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  tensorboard::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write(e.SerializeAsString());
}

void TensorBoardWriter::session_start(int64_t step) {
  tensorboard::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write(e.SerializeAsString());
}

void TensorBoardWriter::write(const std::string& event) {
  NCF_CHECK(out_, "event file ", path_, " is closed");
  out_->write(event);
}

void TensorBoardWriter::flush() {
  NCF_CHECK(out_, "event file ", path_, " is closed");
  // tests/test_tensorboard.cc reads a file back after flush().
  out_->flush();
}

void TensorBoardWriter::close() {
  if (out_) out_->close();
  out_.reset();
}

std::unique_ptr<TensorBoardWriter> open_tensorboard(const TrainConfig& cfg, Communicator& comm) {
  if (cfg.tensorboard_dir.empty() || cfg.eval_only) return nullptr;
  std::unique_ptr<TensorBoardWriter> tb;
  std::string why;  // rank 0's reason for refusing the directory
  if (comm.rank() == 0) try {
      tb = std::make_unique<TensorBoardWriter>(cfg.tensorboard_dir);
    } catch (const std::exception& e) {
      // Without rank 0's rank: every rank says it again.
      why = "flag --tensorboard_dir " + cfg.tensorboard_dir + ": cannot write event files there (" +
            message_of(e) + ")";
    }
  // Rank 0's verdict and its message go to every rank (sums in which only
  // rank 0's part is non-zero), so that every rank stops with the same words.
  int64_t length[1] = {static_cast<int64_t>(why.size())};
  all_reduce_sum_on(comm, Device::kCpu, length, 1, DType::kInt64);
  if (length[0] == 0) return tb;
  std::vector<uint8_t> text(static_cast<size_t>(length[0]), 0);
  std::copy(why.begin(), why.end(), text.begin());
  all_reduce_sum_on(comm, Device::kCpu, text.data(), text.size(), DType::kUInt8);
  NCF_FAIL(std::string(text.begin(), text.end()));
}

}  // namespace ncf
