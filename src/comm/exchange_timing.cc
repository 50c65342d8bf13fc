// See exchange_timing.h.
#include "comm/exchange_timing.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "common/check.h"

namespace ncf {

ExchangeTiming time_exchanges(Communicator& comm, Device dev, int64_t keys_per_rank, int D,
                              DType payload, int rounds) {
  NCF_CHECK(keys_per_rank >= 0 && D >= 1 && rounds >= 1, "time_exchanges: ", keys_per_rank,
            " keys per rank, width ", D, ", ", rounds, " rounds");
  const std::string why = comm.node_map().two_hop_unavailable();
  NCF_CHECK(why.empty(), "time_exchanges: two-hop impossible: ", why);
  const int W = comm.world();
  const int64_t per_peer = (keys_per_rank + W - 1) / W;
  const size_t esize = dtype_size(payload);
  // The same count to and from every peer, so every rank's receives match
  // what its peers send.
  const size_t n = static_cast<size_t>(W);
  std::vector<int64_t> kc(n, per_peer), kd(n, 0), vc(n, per_peer * D), vd(n, 0), rc(n, 0);
  for (int p = 0; p < W; ++p) {
    kd[size_t(p)] = p * per_peer;
    vd[size_t(p)] = p * per_peer * D;
  }
  const size_t ids = size_t(per_peer) * W, elems = ids * size_t(D);
  Buffer<int32_t> send_ids(dev, ids), recv_ids(dev, ids);
  Buffer<char> a(dev, elems * esize), b(dev, elems * esize);
  send_ids.zero();
  a.zero();
  auto step = [&] {
    comm.exchange_counts(kc.data(), rc.data());
    all_to_all_v_on(comm, dev, send_ids.data(), kc.data(), kd.data(), recv_ids.data(), kc.data(),
                    kd.data(), DType::kInt32);
    all_to_all_v_on(comm, dev, a.data(), vc.data(), vd.data(), b.data(), vc.data(), vd.data(),
                    payload);  // the vectors, from the owners
    all_to_all_v_on(comm, dev, b.data(), vc.data(), vd.data(), a.data(), vc.data(), vd.data(),
                    payload);  // the gradients, back to them
    comm.synchronize();
  };
  const ExchangeKind was = comm.exchange();
  const ExchangeKind kinds[2] = {ExchangeKind::kFlat, ExchangeKind::kTwoHop};
  double best[2] = {std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity()};
  for (int round = -1; round < rounds; ++round)
    for (int k = 0; k < 2; ++k) {
      comm.set_exchange(kinds[k]);
      comm.barrier();  // every rank starts the round together
      const auto t0 = std::chrono::steady_clock::now();
      step();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round >= 0) best[k] = std::min(best[k], s);
    }
  comm.set_exchange(was);
  all_reduce_sum_on(comm, Device::kCpu, best, 2, DType::kFloat64);
  ExchangeTiming t;
  t.flat_s = best[0] / W;
  t.two_hop_s = best[1] / W;
  t.rounds = rounds;
  return t;
}

}  // namespace ncf
