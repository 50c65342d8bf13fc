// See checkpoint_lock.h.
#include "train/checkpoint_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "common/check.h"

namespace ncf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormatName = "ncf_dist checkpoint directory lock";
constexpr int kFormatVersion = 1;
// Helper files next to the lock: its content before the link, a stale lock
// moved aside, a probe of the file system's clock. Never a step-N name.
constexpr const char* kHelperPrefix = ".ncf_dist.lock.";
// Rounds of link / judge / take over before giving up: each round that does
// not end the attempt saw another job change the lock.
constexpr int kAttempts = 8;
constexpr size_t kMaxLockBytes = 64 * 1024;

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string this_host() {
  char name[256] = "";
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string this_pid_namespace() {
  char buf[128];
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

// Fields 3 on of /proc/PID/stat (after the command's closing parenthesis,
// which may itself hold spaces and parentheses); empty when there is none.
std::vector<std::string> proc_stat(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!f || !std::getline(f, text)) return {};
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(text.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string x; rest >> x;) fields.push_back(x);
  return fields;
}

// Field 22 (starttime) is the 20th after the parenthesis.
int64_t start_ticks(const std::vector<std::string>& fields) {
  return fields.size() > 19 ? std::strtoll(fields[19].c_str(), nullptr, 10) : -1;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string random_token() {
  std::random_device rd;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x%08x%08x", rd(), rd(), rd());
  return buf;
}

std::string errno_text() { return std::strerror(errno); }

double mtime_of(const struct stat& st) {
  return double(st.st_mtim.tv_sec) + 1e-9 * double(st.st_mtim.tv_nsec);
}

// Now on the clock of the file system that holds `dir`: the mtime of a file
// created and touched there (on NFS the server sets it, as it sets the lock's
// on each heartbeat), so a heartbeat's age does not depend on hosts' clocks.
double file_system_now(const std::string& dir, const std::string& token) {
  const std::string probe =
      (fs::path(dir) / (kHelperPrefix + std::string("clock.") + token)).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) NCF_FAIL("cannot create ", probe, ": ", errno_text());
  struct stat st {};
  const bool ok = ::futimens(fd, nullptr) == 0 && ::fstat(fd, &st) == 0;
  const std::string why = ok ? "" : errno_text();
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok) NCF_FAIL("cannot read the time of ", probe, ": ", why);
  return mtime_of(st);
}

// A lock file as found: its holder, or why it is none; or gone meanwhile.
struct Found {
  bool gone = false;
  std::string error;  // not a lock of this program
  LockHolder holder;
  double mtime = 0;
};

Found read_lock(const std::string& path) {
  Found out;
  // O_NOFOLLOW: a symbolic link in the lock's place is no lock of ours.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      out.gone = true;
    } else if (errno == ELOOP) {
      out.error = "it is a symbolic link";
    } else {
      out.error = "cannot open it: " + errno_text();
    }
    return out;
  }
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) != 0) {
    out.error = "cannot stat it: " + errno_text();
  } else if (!S_ISREG(st.st_mode)) {
    out.error = "it is not a regular file";
  } else if (size_t(st.st_size) > kMaxLockBytes) {
    out.error = "it has " + std::to_string(st.st_size) + " bytes";
  } else {
    text.resize(size_t(st.st_size));
    size_t at = 0;
    while (at < text.size()) {
      const ssize_t k = ::read(fd, &text[at], text.size() - at);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      at += size_t(k);
    }
    text.resize(at);
    out.mtime = mtime_of(st);
    LockHolder::from_json(text, &out.holder, &out.error);
  }
  ::close(fd);
  return out;
}

// The token in the lock file at `path`, "" when there is none or no lock.
std::string token_at(const std::string& path) {
  const Found f = read_lock(path);
  return f.gone || !f.error.empty() ? std::string() : f.holder.token;
}

// Why `h` counts as gone ("" while it may be alive), seen from `me`;
// `alive_why` gets what makes it count as alive. `age` gives the seconds since
// the lock's heartbeat (asked only for a holder on another host).
std::string holder_gone(const LockHolder& h, const LockHolder& me, double stale_seconds,
                        const std::function<double()>& age, std::string* alive_why) {
  const bool same_host = h.host == me.host && !me.boot_id.empty() && h.boot_id == me.boot_id &&
                         !me.pid_namespace.empty() && h.pid_namespace == me.pid_namespace;
  if (same_host) {
    *alive_why = "that process is running on this host";
    return process_gone(h.pid, h.pid_start);
  }
  const double limit = std::max(stale_seconds, h.stale_seconds);
  const double seconds = std::max(0.0, age());
  char buf[320];
  if (seconds > limit) {
    std::snprintf(buf, sizeof buf,
                  "its heartbeat is %.0f s old, more than the %.0f s after which a lock of "
                  "another host is stale (its host is down, or the process was killed)",
                  seconds, limit);
    return buf;
  }
  const std::string where =
      h.host != me.host ? "it runs on another host"
                        : "its pid cannot be checked from here (another boot or PID namespace of "
                          "a host of this name)";
  std::snprintf(buf, sizeof buf,
                "%s and its heartbeat is %.0f s old (a lock of another host is taken over once "
                "its heartbeat is more than %.0f s old: --checkpoint_lock_stale_seconds, or the "
                "holder's own if larger)",
                where.c_str(), seconds, limit);
  *alive_why = buf;
  return "";
}

// The refusal's text for a live holder.
std::string refusal(const std::string& dir, const std::string& path, const LockHolder& h,
                    const std::string& alive_why) {
  return "flag --checkpoint_dir " + dir + ": another job holds this directory: ncf_dist " +
         h.describe() + "; " + alive_why +
         ". Two jobs writing one checkpoint directory destroy each other's checkpoints: wait "
         "for that job to end, or give this one another --checkpoint_dir (the lock: " +
         path + ")";
}

// Sends rank 0's string to every rank (a sum with zeros elsewhere).
std::string broadcast_string(Communicator& comm, const std::string& s) {
  const bool root = comm.rank() == 0;
  int64_t n = root ? int64_t(s.size()) : 0;
  all_reduce_sum_on(comm, Device::kCpu, &n, 1, DType::kInt64);
  std::vector<int64_t> words(size_t(n + 7) / 8, 0);
  if (root && n > 0) std::memcpy(words.data(), s.data(), size_t(n));
  if (!words.empty())
    all_reduce_sum_on(comm, Device::kCpu, words.data(), words.size(), DType::kInt64);
  return std::string(reinterpret_cast<const char*>(words.data()), size_t(n));
}

}  // namespace

std::string process_gone(int64_t pid, int64_t start) {
  const std::string p = std::to_string(pid);
  // kill(pid, 0) sees processes that /proc may hide (hidepid) or that belong
  // to another user (EPERM): only ESRCH proves there is none.
  if (pid <= 0 || (::kill(pid_t(pid), 0) != 0 && errno == ESRCH))
    return "no process " + p + " runs on this host any more";
  const std::vector<std::string> f = proc_stat(pid);
  if (f.empty()) return "";  // it runs, and nothing tells whether it is the holder
  if (f[0] == "Z" || f[0] == "X") return "process " + p + " has exited (a zombie)";
  const int64_t now = start_ticks(f);
  if (now != start)
    return "pid " + p + " is now another process (started at tick " + std::to_string(now) +
           " after boot, the holder at " + std::to_string(start) + ")";
  return "";
}

// ------------------------------------------------------------- LockHolder ---

LockHolder LockHolder::self(double stale_seconds) {
  LockHolder h;
  h.host = this_host();
  h.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  h.pid_namespace = this_pid_namespace();
  h.pid = ::getpid();
  h.pid_start = start_ticks(proc_stat(h.pid));
  h.since = utc_now();
  h.stale_seconds = stale_seconds;
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  h.slurm_job = env("SLURM_JOB_ID");
  h.slurm_array_job = env("SLURM_ARRAY_JOB_ID");
  h.slurm_array_task = env("SLURM_ARRAY_TASK_ID");
  h.slurm_step = env("SLURM_STEP_ID");
  h.slurm_restart = env("SLURM_RESTART_COUNT");
  h.token = random_token();
  return h;
}

nlohmann::json LockHolder::to_json() const {
  return {{"format", kFormatName},
          {"version", kFormatVersion},
          {"host", host},
          {"boot_id", boot_id},
          {"pid_namespace", pid_namespace},
          {"pid", pid},
          {"pid_start", pid_start},
          {"since", since},
          {"stale_seconds", stale_seconds},
          {"slurm_job_id", slurm_job},
          {"slurm_array_job_id", slurm_array_job},
          {"slurm_array_task_id", slurm_array_task},
          {"slurm_step_id", slurm_step},
          {"slurm_restart_count", slurm_restart},
          {"token", token}};
}

bool LockHolder::from_json(const std::string& text, LockHolder* out, std::string* why) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *why = text.empty() ? "it is empty" : "it is no JSON object";
    return false;
  }
  if (!j.contains("format") || j["format"] != kFormatName) {
    *why = "its \"format\" is not \"" + std::string(kFormatName) + "\"";
    return false;
  }
  if (!j.contains("version") || j["version"] != kFormatVersion) {
    *why = "its \"version\" is not " + std::to_string(kFormatVersion);
    return false;
  }
  LockHolder h;
  auto str = [&](const char* key, std::string* v) {
    if (!j.contains(key) || !j[key].is_string()) return false;
    *v = j[key].get<std::string>();
    return true;
  };
  auto integer = [&](const char* key, int64_t* v) {
    if (!j.contains(key) || !j[key].is_number_integer()) return false;
    *v = j[key].get<int64_t>();
    return true;
  };
  const char* bad = nullptr;
  if (!str("host", &h.host) || h.host.empty())
    bad = "host";
  else if (!str("boot_id", &h.boot_id))
    bad = "boot_id";
  else if (!str("pid_namespace", &h.pid_namespace))
    bad = "pid_namespace";
  else if (!integer("pid", &h.pid) || h.pid <= 0)
    bad = "pid";
  else if (!integer("pid_start", &h.pid_start))
    bad = "pid_start";
  else if (!str("since", &h.since))
    bad = "since";
  else if (!j.contains("stale_seconds") || !j["stale_seconds"].is_number() ||
           !(j["stale_seconds"].get<double>() > 0))
    bad = "stale_seconds";
  else if (!str("slurm_job_id", &h.slurm_job))
    bad = "slurm_job_id";
  else if (!str("slurm_array_job_id", &h.slurm_array_job))
    bad = "slurm_array_job_id";
  else if (!str("slurm_array_task_id", &h.slurm_array_task))
    bad = "slurm_array_task_id";
  else if (!str("slurm_step_id", &h.slurm_step))
    bad = "slurm_step_id";
  else if (!str("slurm_restart_count", &h.slurm_restart))
    bad = "slurm_restart_count";
  else if (!str("token", &h.token) || h.token.empty())
    bad = "token";
  if (bad) {
    *why = std::string("field \"") + bad + "\" is missing or wrong";
    return false;
  }
  h.stale_seconds = j["stale_seconds"].get<double>();
  *out = h;
  return true;
}

std::string LockHolder::describe() const {
  std::string s = "pid " + std::to_string(pid) + " on host " + host;
  if (!slurm_job.empty()) {
    s += " (Slurm job " + slurm_job;
    if (!slurm_array_job.empty())
      s += ", array job " + slurm_array_job + " task " + slurm_array_task;
    if (!slurm_step.empty()) s += ", step " + slurm_step;
    if (!slurm_restart.empty() && slurm_restart != "0") s += ", restart " + slurm_restart;
    s += ")";
  }
  return s + ", since " + since;
}

// --------------------------------------------------------- CheckpointLock ---

CheckpointLock::CheckpointLock(std::string dir, LockHolder me, int rank)
    : dir_(std::move(dir)),
      path_((fs::path(dir_) / kCheckpointLockFile).string()),
      me_(std::move(me)),
      rank_(rank) {}

std::unique_ptr<CheckpointLock> CheckpointLock::acquire(Communicator& comm, const std::string& dir,
                                                        const CheckpointLockOptions& options,
                                                        std::vector<std::string>* notes) {
  LockHolder me = LockHolder::self(options.stale_seconds);
  std::unique_ptr<CheckpointLock> lock(new CheckpointLock(dir, me, comm.rank()));
  // Rank 0's verdict: "" (taken) or the refusal; its token goes to every rank.
  std::string refused;
  if (comm.rank() == 0) {
    const std::string& path = lock->path_;
    const std::string own =
        (fs::path(dir) / (kHelperPrefix + std::string("new.") + me.token)).string();
    int fd = -1;
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) NCF_FAIL("flag --checkpoint_dir: cannot create ", dir, ": ", ec.message());
      fd = ::open(own.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0)
        NCF_FAIL("flag --checkpoint_dir ", dir, ": cannot create ", own, ": ", errno_text());
      const std::string text = me.to_json().dump() + "\n";
      if (::write(fd, text.data(), text.size()) != ssize_t(text.size()) || ::fsync(fd) != 0)
        NCF_FAIL("cannot write ", own, ": ", errno_text());
      for (int attempt = 0;; ++attempt) {
        if (attempt == kAttempts) {
          refused = "flag --checkpoint_dir " + dir + ": its lock " + path + " changed hands " +
                    std::to_string(kAttempts) +
                    " times while this job tried to take it: other jobs are starting on this "
                    "directory";
          break;
        }
        const int rc = ::link(own.c_str(), path.c_str());
        const int err = errno;
        struct stat st {};
        // A link that NFS made but whose reply was lost fails with EEXIST;
        // the file's link count tells.
        if (rc == 0 || (::fstat(fd, &st) == 0 && st.st_nlink == 2)) break;
        if (err != EEXIST)
          NCF_FAIL("flag --checkpoint_dir ", dir, ": cannot create the lock ", path,
                   ": link: ", std::strerror(err), " (the file system must support hard links)");
        const Found found = read_lock(path);
        if (found.gone) continue;  // released meanwhile
        if (!found.error.empty()) {
          refused = "flag --checkpoint_dir " + dir + ": " + path +
                    " is not a lock that ncf_dist wrote (" + found.error +
                    "), so this job cannot tell whether another job uses the directory; if "
                    "none does, remove the file and start again";
          break;
        }
        std::string alive;
        const std::string gone = holder_gone(
            found.holder, me, options.stale_seconds,
            [&] { return file_system_now(dir, me.token) - found.mtime; }, &alive);
        if (gone.empty()) {
          refused = refusal(dir, path, found.holder, alive);
          break;
        }
        if (options.before_takeover) options.before_takeover();
        const std::string aside =
            (fs::path(dir) / (kHelperPrefix + std::string("stale.") + me.token)).string();
        if (::rename(path.c_str(), aside.c_str()) != 0) {
          if (errno == ENOENT) continue;  // another taker moved it first
          NCF_FAIL("cannot move the stale lock ", path, " aside to ", aside, ": ", errno_text());
        }
        if (token_at(aside) == found.holder.token) {
          ::unlink(aside.c_str());
          notes->push_back("flag --checkpoint_dir " + dir + ": took over the lock of ncf_dist " +
                           found.holder.describe() + ": " + gone);
          continue;  // now link this job's (another taker may still come first)
        }
        // What was moved is a lock another job made after taking over the
        // stale one: put it back, unless yet another one is there already.
        if (::link(aside.c_str(), path.c_str()) != 0 && errno != EEXIST)
          NCF_FAIL("cannot put back the lock ", aside, " as ", path, ": ", errno_text());
        ::unlink(aside.c_str());
      }
      ::unlink(own.c_str());
      if (refused.empty()) {
        ::futimens(fd, nullptr);  // the first heartbeat
        lock->fd_ = fd;
        fd = -1;
      }
    } catch (const std::exception& e) {
      refused = message_of(e);  // every rank says it again, with its own rank
      ::unlink(own.c_str());
    }
    if (fd >= 0) ::close(fd);
  }
  refused = broadcast_string(comm, refused);
  if (!refused.empty()) {
    lock->me_.token.clear();  // holds nothing: its destructor must not release
    NCF_FAIL(refused);
  }
  lock->me_.token = broadcast_string(comm, lock->me_.token);
  if (comm.rank() == 0) {
    // The heartbeat runs with the stop signals blocked: they are the main
    // thread's (ncf_dist's stop handler).
    sigset_t block, old;
    sigfillset(&block);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    CheckpointLock* self = lock.get();
    lock->heartbeat_ = std::thread([self] { self->heartbeat_loop(); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  return lock;
}

void CheckpointLock::heartbeat_loop() {
  const auto period = std::chrono::duration<double>(me_.stale_seconds / 5);
  bool warned = false;
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, period, [this] { return stop_; })) {
    if (::futimens(fd_, nullptr) != 0 && !warned) {
      warned = true;
      std::fprintf(stderr,
                   "ncf_dist: warning: cannot refresh the lock %s: %s; a job on another host "
                   "may take the directory over once the lock is %.0f s old\n",
                   path_.c_str(), std::strerror(errno), me_.stale_seconds);
    }
  }
}

void CheckpointLock::check_held(const std::string& what) const {
  const Found found = read_lock(path_);
  if (!found.gone && found.error.empty() && found.holder.token == me_.token) return;
  const std::string now = found.gone ? std::string("it was removed")
                          : !found.error.empty()
                              ? "it is now no lock of this program (" + found.error + ")"
                              : "it is now held by ncf_dist " + found.holder.describe();
  NCF_FAIL("not writing ", what, ": this job no longer holds the lock ", path_,
           " of --checkpoint_dir: ", now,
           " (this job was stopped, or could not refresh the lock, for longer than "
           "its stale age of ",
           me_.stale_seconds, " s, and another job took it over)");
}

void CheckpointLock::release_if_ours() const {
  if (!me_.token.empty() && token_at(path_) == me_.token) ::unlink(path_.c_str());
}

CheckpointLock::~CheckpointLock() {
  if (heartbeat_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    heartbeat_.join();
  }
  if (rank_ == 0 || std::uncaught_exceptions() > 0) release_if_ours();
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ncf
