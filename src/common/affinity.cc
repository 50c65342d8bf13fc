// Affinity masks, the machine's CPUs and the default thread count: see affinity.h.
#include "common/affinity.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "common/check.h"

namespace ncf {
namespace {

// The first line of a small sysfs/procfs file; false when it cannot be read.
bool read_first_line(const std::string& path, std::string* line) {
  std::ifstream f(path);
  return f && std::getline(f, *line);
}

// The cpuset of this process's cgroup: cgroup v2 "0::/path" -> cpuset.cpus.effective,
// v1 "N:...cpuset...:/path" -> cpuset.effective_cpus, each looked up from the
// process's own cgroup towards the root (a cgroup without the controller has no file
// and inherits its parent's set). Empty when there is none to read.
std::vector<int> cgroup_cpus() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    std::string dir, file;
    if (controllers == ",,") {
      dir = "/sys/fs/cgroup";
      file = "cpuset.cpus.effective";
    } else if (controllers.find(",cpuset,") != std::string::npos) {
      dir = "/sys/fs/cgroup/cpuset";
      file = "cpuset.effective_cpus";
    } else {
      continue;
    }
    std::string path = line.substr(b + 1);
    while (!path.empty() && path.back() == '/') path.pop_back();
    for (;;) {
      std::string text;
      if (read_first_line(dir + path + "/" + file, &text)) {
        try {
          std::vector<int> cpus = parse_cpu_list(text);
          if (!cpus.empty()) return cpus;
        } catch (const std::exception&) {
        }
      }
      const size_t up = path.rfind('/');
      if (up == std::string::npos) break;
      path.erase(up);
    }
  }
  return {};
}

int machine_cpus_given(int allowed) {
  std::vector<int> online;
  std::string text;
  if (read_first_line("/sys/devices/system/cpu/online", &text)) {
    try {
      online = parse_cpu_list(text);
    } catch (const std::exception&) {
      online.clear();
    }
  }
  if (online.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < n; ++c) online.push_back(static_cast<int>(c));
  }
  int count = static_cast<int>(online.size());
  const std::vector<int> cg = cgroup_cpus();
  if (!cg.empty()) {
    std::vector<int> both;
    std::set_intersection(online.begin(), online.end(), cg.begin(), cg.end(),
                          std::back_inserter(both));
    count = static_cast<int>(both.size());
  }
  return std::max({count, allowed, 1});
}

}  // namespace

std::vector<int> allowed_cpus() {
  // The kernel refuses (EINVAL) a buffer narrower than its own mask: widen until it fits.
  for (int n = CPU_SETSIZE; n <= (1 << 22); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    NCF_CHECK(set != nullptr, "CPU_ALLOC(", n, ") failed");
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) {
      std::vector<int> cpus;
      for (int c = 0; c < static_cast<int>(bytes * 8); ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
      CPU_FREE(set);
      NCF_CHECK(!cpus.empty(), "sched_getaffinity returned an empty mask");
      return cpus;
    }
    const int err = errno;
    CPU_FREE(set);
    NCF_CHECK(err == EINVAL, "sched_getaffinity: ", std::strerror(err));
  }
  NCF_FAIL("sched_getaffinity: the affinity mask is wider than 2^22 CPUs");
}

int machine_cpus() { return machine_cpus_given(static_cast<int>(allowed_cpus().size())); }

std::vector<int> parse_cpu_list(const std::string& text) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::vector<int> cpus;
  if (s.empty()) return cpus;
  size_t pos = 0;
  auto number = [&]() {
    const size_t start = pos;
    long v = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && v < (1L << 30))
      v = v * 10 + (s[pos++] - '0');
    NCF_REQUIRE(pos > start && v < (1L << 30), "CPU list '", text, "': no CPU number at offset ",
                start);
    return static_cast<int>(v);
  };
  for (;;) {
    const int lo = number();
    int hi = lo;
    if (pos < s.size() && s[pos] == '-') {
      ++pos;
      hi = number();
      NCF_REQUIRE(hi >= lo, "CPU list '", text, "': range ", lo, "-", hi, " runs backwards");
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    if (pos == s.size()) break;
    NCF_REQUIRE(s[pos] == ',', "CPU list '", text, "': expected ',' at offset ", pos);
    ++pos;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

int default_threads(const std::vector<int>& mine, const std::vector<int>& node_ranks_on) {
  if (node_ranks_on.empty()) return std::max(1, static_cast<int>(mine.size()));
  double share = 0;
  for (int c : mine) {
    const int k = c < static_cast<int>(node_ranks_on.size()) ? node_ranks_on[c] : 1;
    share += 1.0 / std::max(k, 1);
  }
  // The epsilon absorbs the rounding of sums like 3 x 1/3.
  return std::max(1, static_cast<int>(share + 1e-6));
}

CpuShare cpu_share(const std::vector<int>& node_ranks_on) {
  CpuShare s;
  s.cpus = allowed_cpus();
  s.machine = machine_cpus_given(s.allowed());
  s.threads = default_threads(s.cpus, node_ranks_on);
  bool shared = false;
  for (int c : s.cpus)
    shared = shared || (c < static_cast<int>(node_ranks_on.size()) && node_ranks_on[c] > 1);
  s.owned = s.allowed() < s.machine && !shared;
  return s;
}

std::vector<int> spread_order(const std::vector<int>& cpus) {
  std::vector<std::pair<int, int>> keyed;  // (position among its core's siblings, cpu)
  keyed.reserve(cpus.size());
  for (int c : cpus) {
    int level = 0;
    std::string text;
    if (read_first_line(
            "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list",
            &text)) {
      try {
        const std::vector<int> siblings = parse_cpu_list(text);
        const auto it = std::find(siblings.begin(), siblings.end(), c);
        if (it != siblings.end()) level = static_cast<int>(it - siblings.begin());
      } catch (const std::exception&) {
      }
    }
    keyed.emplace_back(level, c);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> order;
  order.reserve(keyed.size());
  for (const auto& k : keyed) order.push_back(k.second);
  return order;
}

bool pin_current_thread(int cpu) {
  if (cpu < 0) return false;
  cpu_set_t* set = CPU_ALLOC(cpu + 1);
  if (set == nullptr) return false;
  const size_t bytes = CPU_ALLOC_SIZE(cpu + 1);
  CPU_ZERO_S(bytes, set);
  CPU_SET_S(cpu, bytes, set);
  const bool ok = pthread_setaffinity_np(pthread_self(), bytes, set) == 0;
  CPU_FREE(set);
  return ok;
}

}  // namespace ncf
