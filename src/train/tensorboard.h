// TensorBoard event files (ncf_dist --tensorboard_dir): Event records of
// tensorboard_event.proto in TFRecord frames, written with the shards' frame
// writer (data/format.h). Rank 0 writes; the trainer and ncf_dist's epoch loop
// give it the scalars, all on the global optimizer step. The tags are below,
// in one place; docs/tensorboard.md lists them with their meaning.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "train/config.h"

namespace ncf {

class RecordWriter;  // data/format.h

// Every N steps (--tensorboard_every_steps), over the steps since the last of
// them: the mean loss, samples per second, and rank 0's mean time per step in
// each phase of the --step_log split.
constexpr const char* kTbTrainLoss = "train/loss";
constexpr const char* kTbTrainSamplesPerSecond = "train/samples_per_second";
constexpr const char* kTbTrainExchangeMs = "train/step_exchange_ms";
constexpr const char* kTbTrainComputeMs = "train/step_compute_ms";
constexpr const char* kTbTrainAllreduceMs = "train/step_allreduce_ms";
// After every epoch, at the step the epoch ended: --metrics_json's numbers.
constexpr const char* kTbEpoch = "epoch/epoch";
constexpr const char* kTbEpochLoss = "epoch/loss";
constexpr const char* kTbEpochSamplesPerSecond = "epoch/samples_per_second";
constexpr const char* kTbEpochTrainSeconds = "epoch/train_seconds";
constexpr const char* kTbEpochExchangeSeconds = "epoch/exchange_seconds";
constexpr const char* kTbEpochComputeSeconds = "epoch/compute_seconds";
constexpr const char* kTbEpochAllreduceSeconds = "epoch/allreduce_seconds";
constexpr const char* kTbEvalSeconds = "eval/seconds";
// "eval/HR@10", "eval/NDCG@10", "eval/full_HR@10", "eval/full_NDCG@10".
std::string tb_eval_tag(const std::string& metric, int k);

// One event file, dir/events.out.tfevents.<unix seconds>.<hostname> (".1",
// ".2", ... appended when a file of that name exists: two runs started within
// one second). The first record is the file_version event.
class TensorBoardWriter {
 public:
  // Creates dir when missing; errors (ncf::Error) name the path and the reason.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // A Summary event with one simple_value.
  void scalar(const std::string& tag, int64_t step, double value);
  // A SessionLog START event: this run takes `step` next. TensorBoard drops
  // what earlier files of the directory logged at that step and after.
  void session_start(int64_t step);
  // Hands the records written so far to the operating system, so that a run
  // killed afterwards leaves them readable.
  void flush();
  // Flushes and closes; a write error that happened since opening throws here.
  void close();
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  std::string path_;
  std::unique_ptr<RecordWriter> out_;
};

// --tensorboard_dir of a training run (none with --eval_only): rank 0 opens the
// event file, and every rank learns whether it could before training starts
// (collective). A refusal names the flag and the path on rank 0 and ends every
// rank with an error. Returns the writer on rank 0, nullptr on other ranks and
// without the flag.
std::unique_ptr<TensorBoardWriter> open_tensorboard(const TrainConfig& cfg, Communicator& comm);

}  // namespace ncf
