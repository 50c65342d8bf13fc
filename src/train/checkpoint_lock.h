// One job per checkpoint directory. Two jobs writing one --checkpoint_dir (a
// requeued job while the old one still runs, or a mistake) destroy each other's
// checkpoints: each one's retention removes the other's unfinished .tmp-step-N
// while it is being written. A training run therefore takes DIR's lock before
// any rank writes anything, holds it to its end and releases it on every exit
// that runs its destructors (normal end, preemption's exit 75, an error on any
// rank that goes through run_main). A process that dies without them (SIGKILL,
// _exit, its host lost) leaves the lock, and the next job takes it over when
// the holder is provably gone:
//
//   DIR/ncf_dist.lock   JSON: host, boot id and PID namespace, pid and the
//                       process's start time (/proc/PID/stat, so a reused pid is
//                       not mistaken for the holder), Slurm job / array / step /
//                       restart count when under Slurm, since when, the holder's
//                       stale age, and a random token that names this holding.
//                       Its modification time is the heartbeat: the holder
//                       touches it every stale_seconds / 5.
//
// Taking it (rank 0; the decision, or the refusal's text, reaches every rank
// through the Communicator, so all ranks go on or all fail alike):
//   1. The lock's content is written to a file of its own, then link(2)ed to
//      DIR/ncf_dist.lock: atomic and exclusive also on NFS, and the lock never
//      exists half written. (A link whose reply NFS lost shows as the file's
//      link count of 2.)
//   2. When a lock exists, its holder is judged:
//      - on this host (same host name, boot id and PID namespace): alive when a
//        process with its pid and start time runs (not a zombie) -> refused;
//        otherwise gone;
//      - elsewhere: gone when its heartbeat is older than the larger of this
//        run's stale age and the holder's own (a holder's heartbeat period comes
//        from its own age); ages are measured on the file system's clock (the
//        mtime of a file touched just now), so hosts' clocks need not agree;
//      - not a lock this program wrote (no JSON, missing fields, not a regular
//        file): refused, saying to remove it if no job uses DIR. Nothing about
//        such a file proves its writer gone.
//   3. A gone holder's lock is renamed aside to a name of this job's own; only
//      one of two takers' renames finds it. The taker then checks the token of
//      what it moved: the stale lock's -> removed, and the taker goes back to 1
//      (where another taker may now win, and is then judged alive); another
//      lock (made by a job that took over in between) -> linked back and 1
//      again. No sleep, no timing.
//
// The holder checks, before each checkpoint, that DIR/ncf_dist.lock still holds
// its token (a job stopped, e.g. SIGSTOP or a suspended Slurm job, for longer
// than the stale age may have lost it to a job on another host): if not, the
// run fails instead of writing.
//
// Readers (ncf_recommend, ncf_export, ncf_dist --eval_only, which writes
// nothing there) take no lock: a checkpoint is written whole under a temporary
// name and renamed into place, and a reader checks every file's size and
// CRC-32C. The lock's name is no step-N, so neither resume's discovery nor
// retention (checkpoint.h) looks at it; the helper files of 1 and 3
// (.ncf_dist.lock.*) are removed at once.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace ncf {

constexpr const char* kCheckpointLockFile = "ncf_dist.lock";

// What a lock file says about the job that holds it.
struct LockHolder {
  std::string host;           // gethostname
  std::string boot_id;        // /proc/sys/kernel/random/boot_id
  std::string pid_namespace;  // readlink /proc/self/ns/pid, e.g. "pid:[4026531836]"
  int64_t pid = 0;
  int64_t pid_start = 0;       // field 22 of /proc/PID/stat: clock ticks after boot
  std::string since;           // "2026-11-27 10:00:03 UTC"
  double stale_seconds = 300;  // its heartbeat is touched every stale_seconds / 5
  // Under Slurm: SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID,
  // SLURM_STEP_ID, SLURM_RESTART_COUNT as given ("" when unset).
  std::string slurm_job, slurm_array_job, slurm_array_task, slurm_step, slurm_restart;
  std::string token;  // random: names one holding

  // This process, holding with `stale_seconds`, from now, with a new token.
  static LockHolder self(double stale_seconds);
  nlohmann::json to_json() const;
  // Errors (a message, not thrown) for text that is not such a lock.
  static bool from_json(const std::string& text, LockHolder* out, std::string* why);
  // "pid 1234 on host node1 (Slurm job 77, step 0), since 2026-11-27 10:00:03 UTC"
  std::string describe() const;
};

struct CheckpointLockOptions {
  double stale_seconds = 300;  // ncf_dist --checkpoint_lock_stale_seconds
  // Tests only: runs after a lock was judged gone and before it is moved aside,
  // where another job may take it over first.
  std::function<void()> before_takeover;
};

class CheckpointLock {
 public:
  // Collective. Rank 0 creates DIR when missing and takes DIR/ncf_dist.lock as
  // above; the refusal (naming DIR, the holder and why it counts as alive) is
  // thrown on every rank alike. *notes (rank 0) gets a line for each lock it
  // took over and why its holder counted as gone.
  static std::unique_ptr<CheckpointLock> acquire(Communicator& comm, const std::string& dir,
                                                 const CheckpointLockOptions& options,
                                                 std::vector<std::string>* notes);
  // Rank 0 releases the lock (if it is still this job's). Another rank
  // releases it only while an exception unwinds it: its job is ending through
  // run_main's MPI_Abort, which kills rank 0 before rank 0 could.
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  // Rank 0, before writing checkpoint `what`: throws unless DIR/ncf_dist.lock is
  // still this job's, naming who holds it now.
  void check_held(const std::string& what) const;
  const std::string& path() const { return path_; }
  const LockHolder& holder() const { return me_; }

 private:
  CheckpointLock(std::string dir, LockHolder me, int rank);
  void heartbeat_loop();
  // Removes the lock file if it holds this job's token.
  void release_if_ours() const;

  std::string dir_, path_;
  LockHolder me_;
  int rank_ = 0;
  int fd_ = -1;  // rank 0: the lock file, touched by the heartbeat
  std::thread heartbeat_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// Whether the process `pid` that started at `start` (clock ticks after boot)
// is gone from this host: why ("no process 1234 runs on this host any more",
// "process 1234 has exited (a zombie)", "pid 1234 is now another process
// (started at tick N after boot, the holder at M)"), or "" while it runs or
// cannot be told apart from one that does (its /proc entry hidden).
std::string process_gone(int64_t pid, int64_t start);

}  // namespace ncf
