// Timing the two routes of the embedding exchange on the machines at hand:
// --exchange auto measures a few steps' worth of exchanges with the flat and
// the two-hop route at start-up and keeps the faster one. Both routes deliver
// the same bytes to the same places, so the choice changes no result, only
// the time; the cost model (embedding/exchange_model.h) is printed beside it.
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace ncf {

struct ExchangeTiming {
  double flat_s = 0;     // seconds per step of exchanges on the flat route
  double two_hop_s = 0;  // and on the two-hop route
  int rounds = 0;        // timed rounds of each route
};

// Times `rounds` rounds of one step's exchanges per route, alternating flat
// and two-hop after one untimed round of each: the counts exchange, then
// all-to-alls of keys_per_rank int32 ids, of as many rows of D `payload`
// elements (the vectors) and of as many again (the gradients), the keys
// spread evenly over the W ranks. Each rank keeps its fastest round per route;
// the result is their mean over the ranks, the same on every rank. Buffers on
// `dev` (staged as the trainer's are). Collective; the communicator's node map
// must allow two-hop. Leaves the communicator on the route it was on.
ExchangeTiming time_exchanges(Communicator& comm, Device dev, int64_t keys_per_rank, int D,
                              DType payload, int rounds);

}  // namespace ncf
