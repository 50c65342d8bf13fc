// Checkpoint directories: how the ranks write one together, commit it
// atomically, and how a run finds the newest one that is whole.
//
//   DIR/step-000000000120/        a committed checkpoint (optimizer step 120)
//     manifest.json               written last: the state's counters, the
//                                 config and dataset it belongs to, every
//                                 file with its size and CRC-32C, and its own
//                                 CRC-32C (checkpoint_manifest_crc32c), checked
//                                 before any value in it is used
//     <files>                     raw little-endian arrays (what the trainer
//                                 puts there: trainer.h)
//   DIR/.tmp-step-000000000120/   the same while it is being written
//
// Writing: every rank writes its own part of each file at its offset (pwrite
// on a file system all ranks share) and checksums that part; the CRCs combine
// into the file's (crc32c_combine), so no rank reads or gathers a whole table.
// Then every rank fsyncs what it wrote, rank 0 writes the manifest, fsyncs,
// renames the directory into place and fsyncs DIR. Killed at any instant, the
// job leaves the previous checkpoint as it was; a directory without a
// manifest or with a file whose size or CRC differs is never loaded.
//
// Retention deletes only what this program wrote: a real directory (never a
// symbolic link, nor what one points to) named step-N whose manifest loads and
// which holds exactly the manifest and the files it lists, all regular files;
// and unfinished .tmp-step-N / .tmp-old-step-N directories holding only
// regular files. Anything else in DIR stays, and commit() says so.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/file_io.h"
#include "common/partition.h"  // block_range: the rows each rank writes and reads
#include "data/dataset.h"      // IdMapInfo
#include "data/id_map.h"

namespace ncf {

// 2: the manifest carries its own crc32c. Version 1 manifests (no checksum)
// still load, with a warning that an edit in them cannot be detected.
constexpr int kCheckpointFormatVersion = 2;
constexpr const char* kCheckpointManifestFile = "manifest.json";

struct CheckpointFile {
  std::string name;
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct CheckpointManifest {
  int64_t step = 0;        // optimizer steps taken
  int64_t epoch = 0;       // the epoch in progress, 0-based
  int64_t epoch_step = 0;  // steps of that epoch already taken
  int world = 1;           // W of the run that wrote it
  std::string dataset_id;  // the dataset's metadata.json dataset_id
  nlohmann::json config;   // the flags the trajectory depends on
  nlohmann::json tables;   // [{name, rows, width, arrays}] of the embedding tables
  // A copy of the dataset's id maps (user, item: data/dataset.h IdMapInfo),
  // among `files`, so that rows can be matched by original id without the
  // dataset (ncf_dist --init_from, ncf_export --since); empty when the
  // dataset's ids are dense already (and in checkpoints of older builds).
  std::vector<IdMapInfo> id_maps;
  // The checkpoint a warm start (--init_from) began from: {path, dataset_id,
  // step, optimizer_state}; null otherwise.
  nlohmann::json init_from;
  std::vector<CheckpointFile> files;
  // Set by load() for a version 1 manifest, which has no checksum of its own.
  std::string unsealed_warning;

  // The manifest's fields, without its crc32c (commit adds it).
  nlohmann::json to_json() const;
  // Checks types, ranges, the format version and that every file name is a
  // plain name inside the checkpoint (no '/', not "." or "..", not the
  // manifest's, no repeats); errors name `path` and the field. Does not look
  // at a crc32c field: load() checks that first.
  static CheckpointManifest from_json(const nlohmann::json& j, const std::string& path);
  // Reads the manifest file at `path`: valid JSON, an object, its crc32c equal
  // to checkpoint_manifest_crc32c of the rest (a changed value anywhere is
  // refused, naming the file), then from_json. A manifest without crc32c loads
  // only as format version 1, with unsealed_warning set.
  static CheckpointManifest load(const std::string& path);
  // The entry of file `name`; an error naming the checkpoint when it is absent.
  const CheckpointFile& file(const std::string& name, const std::string& path) const;
};

// CRC-32C of the compact dump (keys sorted, no whitespace) of a manifest
// without its top-level "crc32c" field: the value manifest.json carries in
// that field (the scheme of metadata.json's, data/dataset.h).
uint32_t checkpoint_manifest_crc32c(const nlohmann::json& j);

// "step-000000000120": the directory name of the checkpoint at step `step`.
std::string checkpoint_name(int64_t step);

// A sealed checkpoint that does not load, and why (the first fault found:
// the manifest, or a file with what the manifest expects and what was found).
struct DamagedCheckpoint {
  std::string path;
  std::string why;
};

// Writes one checkpoint. Every method is collective.
class CheckpointWriter {
 public:
  // Rank 0 removes what a killed writer left at DIR/.tmp-step-N and creates it
  // (and DIR if needed).
  CheckpointWriter(Communicator& comm, const std::string& dir, int64_t step);

  // File `name` of `bytes` bytes: this rank writes data[0, n) at `offset`. The
  // parts of ranks 0, 1, …, W−1 tile [0, bytes) in rank order (n may be 0).
  void write(const std::string& name, int64_t bytes, int64_t offset, const void* data, size_t n);
  // The same, with this rank's n bytes arriving in pieces: begin_part, then
  // append until n bytes are in (in order), then end_part. begin_part and
  // end_part are collective; one file at a time.
  void begin_part(const std::string& name, int64_t bytes, int64_t offset, int64_t n);
  void append(const void* data, size_t n);
  void end_part();

  // fsync, manifest, rename, fsync of DIR; then rank 0 removes all but the
  // newest `keep` committed checkpoints and any unfinished ones, as far as
  // they are this program's (see the top of this file). Returns the
  // committed directory. `manifest.files` is filled here.
  std::string commit(CheckpointManifest manifest, int keep);
  int64_t bytes_written() const { return bytes_; }  // by all ranks
  // Rank 0, after commit: what retention left in DIR and why, a line each.
  const std::vector<std::string>& retention_notes() const { return notes_; }
  // Sealed checkpoints known not to load (found so by find_checkpoint at the
  // start of this run): retention neither counts them among the `keep` nor
  // removes them, so damaged checkpoints never push out the last good one.
  void set_damaged(const std::vector<DamagedCheckpoint>& damaged);

 private:
  Communicator& comm_;
  std::string dir_, tmp_, final_;
  std::vector<CheckpointFile> files_;
  int64_t bytes_ = 0;
  // The open part.
  std::string part_name_;
  FileHandle part_file_;
  int64_t part_bytes_ = 0, part_offset_ = 0, part_n_ = 0, part_at_ = 0;
  off_t part_flushed_ = 0;  // the part's bytes before this are on disk and out of the cache
  uint32_t part_crc_ = 0;
  std::vector<std::string> notes_;
  std::vector<DamagedCheckpoint> damaged_;
};

// The rows of a table in a checkpoint (manifest "tables"); an error naming the
// checkpoint when it has no such table.
int64_t checkpoint_table_rows(const CheckpointManifest& m, const std::string& table,
                              const std::string& path);

// A committed checkpoint whose files were all checked.
class CheckpointReader {
 public:
  CheckpointReader(std::string path, CheckpointManifest manifest);
  const std::string& path() const { return path_; }
  const CheckpointManifest& manifest() const { return manifest_; }
  // Bytes [offset, offset + n) of file `name`; errors name the file and range.
  void read(const std::string& name, int64_t offset, void* data, size_t n) const;
  int64_t bytes(const std::string& name) const { return manifest_.file(name, path_).bytes; }
  // The id maps of the dataset it was trained on (its copy, checked against
  // the CRCs the manifest gives), or the identity of its tables' sizes.
  IdMaps id_maps() const;

 private:
  std::string path_;
  CheckpointManifest manifest_;
};

// A checkpoint directory's step-N directories, newest first: sealed ones
// (with a manifest.json: ncf_dist renamed them into place whole, so one that
// does not load was damaged afterwards) and unsealed ones (no manifest: not
// a checkpoint this program finished; never loaded, skipped quietly).
struct CheckpointDirListing {
  std::vector<std::pair<int64_t, std::string>> sealed, unsealed;  // (step, path)
};
CheckpointDirListing list_checkpoint_dir(const std::string& dir);

// The checkpoint --resume asks for, checked (collective: each rank checksums
// a part of every file; every decision is the same on every rank). `resume`:
//   "never"            nothing;
//   "auto"             the newest sealed checkpoint in `dir` that loads; nothing
//                      when `dir` holds no sealed checkpoint; an error on every
//                      rank, naming each damaged checkpoint and what is wrong
//                      with it, when it holds sealed ones and none loads;
//   "auto_or_restart"  the same, but nothing (start from step 0, naming what
//                      was skipped) where "auto" stops;
//   a path             that checkpoint, which must be whole.
// Lines for the log (rank 0 prints them) say which one was taken and name
// each newer sealed one that was skipped and why (an unsealed one gets a
// short line). `damaged` (optional) gets the sealed checkpoints that did not
// load, so that retention neither counts nor removes them.
std::optional<CheckpointReader> find_checkpoint(Communicator& comm, const std::string& resume,
                                                const std::string& dir,
                                                std::vector<std::string>* log,
                                                std::vector<DamagedCheckpoint>* damaged = nullptr);

// What a tool's --checkpoint (or `flag`: --init_from) names: a checkpoint
// (DIR/step-N, checked whole) or a directory of them (its newest sealed one
// that loads, naming in *log the newer ones skipped). Errors name the flag and
// path; a directory whose sealed checkpoints all fail is refused naming each
// and its fault. Collective.
CheckpointReader open_checkpoint(Communicator& comm, const std::string& path,
                                 std::vector<std::string>* log,
                                 const std::string& flag = "--checkpoint");

// Why the checkpoint at `path` cannot be loaded ("" when it can): its
// manifest, then every file's size and CRC-32C. Collective.
std::string check_checkpoint(Communicator& comm, const std::string& path,
                             CheckpointManifest* manifest);

}  // namespace ncf
