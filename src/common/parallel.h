// CPU data parallelism for kernels: parallel_for splits [0, n) into contiguous
// chunks run on a persistent process-wide thread pool. Chunk boundaries depend on
// the thread count, so a kernel stays deterministic only if what it computes for
// an index does not depend on which chunk holds it — no float reduction whose
// order follows the chunks (reduce over fixed-size blocks instead, see
// kReduceBlock, then combine the block results in block order).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ncf {

// Fixed block length for deterministic reductions: partial sums are taken over
// [k·kReduceBlock, (k+1)·kReduceBlock) whatever the thread count.
constexpr int64_t kReduceBlock = 1024;

// Calls fn(begin, end) on disjoint contiguous chunks covering [0, n), using up to
// `threads` threads (the calling thread runs chunks too). Chunks hold at least
// `grain` indices, so small loops stay on the caller. With k chunks, chunk c is
// [n·c/k, n·(c+1)/k). A call from inside a chunk runs serially on that thread
// (no nested pool use). Calls from different threads are served one at a time.
// The first exception thrown by fn is rethrown here after all chunks finished.
void parallel_for(int threads, int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& fn);

// The CPUs the pool's workers are pinned to. The thread that calls parallel_for runs
// chunks too and is not pinned; worker k (k = 1, 2, ...) is pinned to order[k % size],
// order = spread_order(cpus) (common/affinity.h), so that with threads <= cpus.size()
// no two threads of a job share a CPU and with more they take the CPUs round-robin.
// Empty: workers are not pinned (the OS places them within the process's mask).
// Without a call, the pool decides when it starts its first worker: the process's own
// mask when the process owns it (cpu_share().owned: narrower than the machine), else
// none. Workers already started keep their CPU, so call it before the first
// parallel_for (RankRuntime does).
void set_pool_cpus(const std::vector<int>& cpus);

// Deterministic sums of k quantities over [0, n): [0, n) is cut into fixed
// blocks of kReduceBlock indices; partial(begin, end, acc) adds the block's k
// sums into acc[0..k) (zeroed before the call), blocks run in parallel, and
// totals[j] = Σ over blocks, in block order, of acc[j]. The result does not
// depend on `threads`. totals[0..k) is overwritten (zeros when n == 0).
void block_sums(int threads, int64_t n, int k,
                const std::function<void(int64_t begin, int64_t end, double* acc)>& partial,
                double* totals);

}  // namespace ncf
