// The thread pool behind parallel_for. Workers are started on demand (the pool
// grows to the largest thread count ever asked for) and live until exit, so a
// training step with dozens of small kernels does not pay thread creation each
// time. Which worker runs which chunk is not fixed; the chunks themselves are.
//
// Pinning: workers are pinned one per CPU of the process's mask (set_pool_cpus), the
// calling thread is not. Its affinity is what every thread it creates later inherits
// (MPI's and NCCL's progress threads, the shard readers' prefetch threads, the input
// stager): narrowed to one CPU, all of them would queue on that CPU while the mask's
// others idle. Left with the whole mask it runs wherever the scheduler finds room,
// which, while the workers hold the other CPUs, is the CPU kept free for it (slot 0).
// A process that shares its mask (unbound ranks, several ranks bound to one socket)
// pins nothing: the pools of two ranks would otherwise pin onto the same CPUs.
#include "common/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "common/affinity.h"
#include "common/check.h"

namespace ncf {
namespace {

thread_local bool t_inside_pool_job = false;

class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void set_cpus(const std::vector<int>& cpus) {
    std::lock_guard<std::mutex> job_lock(job_mu_);
    order_ = spread_order(cpus);
    cpus_decided_ = true;
  }

  void run(int chunks, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> job_lock(job_mu_);  // one job at a time
    grow(chunks - 1);
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      chunks_ = chunks;
      next_ = 0;
      unfinished_ = chunks;
      error_ = nullptr;
    }
    cv_work_.notify_all();
    t_inside_pool_job = true;
    work_until_no_chunks_left();
    t_inside_pool_job = false;
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_done_.wait(lk, [&] { return unfinished_ == 0; });
      error = error_;
      fn_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  Pool() = default;

  // Called with job_mu_ held. The mask is read once, when the first worker starts.
  void grow(int want) {
    if (static_cast<int>(workers_.size()) >= want) return;
    if (!cpus_decided_) {
      try {
        const CpuShare share = cpu_share();
        if (share.owned) order_ = spread_order(share.cpus);
      } catch (const std::exception&) {
        order_.clear();  // an unreadable mask: leave the workers unpinned
      }
      cpus_decided_ = true;
    }
    while (static_cast<int>(workers_.size()) < want) {
      const size_t k = workers_.size() + 1;  // slot 0 is the calling thread
      const int cpu = order_.empty() ? -1 : order_[k % order_.size()];
      workers_.emplace_back([this, cpu] {
        if (cpu >= 0) pin_current_thread(cpu);  // refused: it runs unpinned
        worker_main();
      });
    }
  }

  void worker_main() {
    t_inside_pool_job = true;  // any parallel_for from a worker runs serially
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_work_.wait(lk, [&] { return stop_ || next_ < chunks_; });
        if (stop_) return;
      }
      work_until_no_chunks_left();
    }
  }

  // Takes chunks until none are left; chunk c is [n·c/k, n·(c+1)/k).
  void work_until_no_chunks_left() {
    for (;;) {
      int c;
      int64_t n;
      int k;
      const std::function<void(int64_t, int64_t)>* fn;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (next_ >= chunks_) return;
        c = next_++;
        n = n_;
        k = chunks_;
        fn = fn_;
      }
      int64_t begin = static_cast<int64_t>(static_cast<__int128>(n) * c / k);
      int64_t end = static_cast<int64_t>(static_cast<__int128>(n) * (c + 1) / k);
      std::exception_ptr error;
      try {
        (*fn)(begin, end);
      } catch (...) {
        error = std::current_exception();
      }
      bool last;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (error && !error_) error_ = error;
        last = --unfinished_ == 0;
      }
      if (last) cv_done_.notify_all();
    }
  }

  std::mutex job_mu_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::vector<std::thread> workers_;
  std::vector<int> order_;  // CPUs handed to workers (spread_order), empty: none pinned
  bool cpus_decided_ = false;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  int next_ = 0;
  int unfinished_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

void parallel_for(int threads, int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& fn) {
  NCF_CHECK(n >= 0, "negative range length ", n);
  if (n == 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = (n + grain - 1) / grain;
  int chunks = static_cast<int>(std::min<int64_t>(std::max(threads, 1), max_chunks));
  if (chunks <= 1 || t_inside_pool_job) {
    fn(0, n);
    return;
  }
  Pool::instance().run(chunks, n, fn);
}

void set_pool_cpus(const std::vector<int>& cpus) { Pool::instance().set_cpus(cpus); }

void block_sums(int threads, int64_t n, int k,
                const std::function<void(int64_t begin, int64_t end, double* acc)>& partial,
                double* totals) {
  NCF_CHECK(n >= 0 && k >= 0, "bad block_sums shape n=", n, " k=", k);
  std::fill(totals, totals + k, 0.0);
  if (n == 0 || k == 0) return;
  int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> acc(static_cast<size_t>(blocks) * k, 0.0);
  parallel_for(threads, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk)
      partial(blk * kReduceBlock, std::min(n, (blk + 1) * kReduceBlock), &acc[blk * k]);
  });
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int j = 0; j < k; ++j) totals[j] += acc[blk * k + j];
}

}  // namespace ncf
