// Which CPUs a process may run on and what that makes its default thread count: the
// affinity mask its launcher gave it (sched_getaffinity), the machine's CPUs (online,
// within the process's cgroup cpuset), and the rule that divides a CPU among the ranks
// of a node that may run on it. The thread pool (parallel.cc) pins its workers inside
// the mask when the process owns it.
#pragma once

#include <string>
#include <vector>

namespace ncf {

// The CPU ids the calling thread may run on (sched_getaffinity), ascending. Masks wider
// than CPU_SETSIZE are read through CPU_ALLOC. Throws if the mask cannot be read.
std::vector<int> allowed_cpus();

// The machine's CPUs as this process can be given them: the online CPUs, narrowed to
// its cgroup's cpuset when one is readable (a container started with --cpuset-cpus,
// a Slurm step), and never fewer than allowed_cpus().
int machine_cpus();

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format; a trailing
// newline is allowed, "" is empty). Throws on anything else.
std::vector<int> parse_cpu_list(const std::string& text);

// The default thread count of a process that may run on the CPUs `mine`: every CPU
// of the mask counts 1/k, k = node_ranks_on[cpu] = how many of the node's ranks (this
// one included) may run on it; the sum rounded down, at least 1. node_ranks_on empty
// means the process is alone (ncf_prep, a rank without MPI): the mask size. So a rank
// its launcher bound to cores of its own gets one thread per CPU of its mask, and L
// ranks that all may run anywhere get (machine CPUs) / L each.
int default_threads(const std::vector<int>& mine, const std::vector<int>& node_ranks_on);

// A process's CPUs as its start-up reports them.
struct CpuShare {
  std::vector<int> cpus;  // its affinity mask (allowed_cpus())
  int machine = 1;        // machine_cpus()
  int threads = 1;        // default_threads()
  bool owned = false;     // bound (fewer CPUs than the machine) and no other rank of the
                          // node may run on them: its pool pins its workers to them
  int allowed() const { return static_cast<int>(cpus.size()); }
};
// This process's share; node_ranks_on as for default_threads (RankInfo::node_ranks_on).
CpuShare cpu_share(const std::vector<int>& node_ranks_on = {});

// The order in which the pool hands out the mask's CPUs: the first hardware thread of
// every core (ascending), then the second ones, and so on (sysfs thread_siblings_list),
// so that the first picks land on distinct cores. A permutation of `cpus`.
std::vector<int> spread_order(const std::vector<int>& cpus);

// Pins the calling thread to one CPU (pthread_setaffinity_np); false when refused.
bool pin_current_thread(int cpu);

}  // namespace ncf
