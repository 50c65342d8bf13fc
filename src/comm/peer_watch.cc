// The peer watch: see peer_watch.h.
//
// Wire format on a watch connection: frames of [type: 1 byte][length: uint16 LE][payload].
//   'W' hello (connector -> acceptor): cookie (uint64) and the connector's rank (int32)
//   'H' heartbeat, 'B' goodbye
//   'E' the job is ending: origin rank (int32), then a line of text; passed on to the
//       next rank until it comes back to its origin
//   'L' a lost rank: lost rank (int32), origin rank (int32), then how it was noticed;
//       passed on away from where it came from
#include "comm/peer_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "comm/collective_watch.h"
#include "common/check.h"

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHello = 'W', kBeat = 'H', kBye = 'B', kEnding = 'E', kLost = 'L';
constexpr size_t kMaxPayload = 2048;
constexpr size_t kMaxQueued = size_t{1} << 16;  // unsent bytes per link before heartbeats drop
constexpr double kConnectSeconds = 10;          // to reach a neighbour, at start
constexpr double kEndingGrace = 10;  // a rank told "the job is ending" ends by itself after
// Silence that counts as a loss once a stop signal came: well above a healthy
// neighbour's heartbeat gap, well below any launcher's own node timeout (Slurm's
// SlurmdTimeout, Open MPI's keepalive), after which the launcher sends that signal.
constexpr double kQuietAtStop = 5;

// What every rank publishes at start (MPI_Allgather of bytes).
struct Published {
  char host[64];
  uint32_t addr[8];  // IPv4 addresses of its interfaces (network order)
  uint16_t port;     // its listening port (host order)
  uint8_t naddr;
  uint8_t pad[5];
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string errno_text(int e) { return std::strerror(e); }

void put_u16(std::string& s, uint16_t v) {
  s.push_back(char(v & 0xff));
  s.push_back(char(v >> 8));
}
void put_i32(std::string& s, int32_t v) {
  const uint32_t u = uint32_t(v);
  for (int k = 0; k < 4; ++k) s.push_back(char((u >> (8 * k)) & 0xff));
}
int32_t get_i32(const std::string& s, size_t at) {
  uint32_t u = 0;
  for (int k = 0; k < 4; ++k) u |= uint32_t(uint8_t(s[at + k])) << (8 * k);
  return int32_t(u);
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t u = 0;
  for (int k = 0; k < 8; ++k) u |= uint64_t(uint8_t(s[at + k])) << (8 * k);
  return u;
}

std::string frame(char type, const std::string& payload = {}) {
  std::string f;
  f.push_back(type);
  put_u16(f, uint16_t(std::min(payload.size(), kMaxPayload)));
  f.append(payload, 0, std::min(payload.size(), kMaxPayload));
  return f;
}

// One neighbour's connection, owned by the watch thread once it runs.
struct Link {
  int fd = -1;
  int peer = -1;
  std::string in, out;  // received bytes not yet parsed; bytes not yet sent
  Clock::time_point heard;
  bool departed = false;  // said goodbye, or closed after the job began to end
  bool closed = false;    // fd closed by us
};

struct Watch {
  int rank = 0, world = 1;
  double lost_after = 30, beat = 1;
  std::string program;
  std::vector<std::string> hosts;  // [W]
  std::vector<Link> links;         // 1 (W = 2) or 2: [0] = rank - 1, [1] = rank + 1
  int wake[2] = {-1, -1};          // self-pipe: commands for the thread
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;        // stop_peer_watch asked
  std::string ending_text;  // announce_job_ending asked (sent once)
  bool ending_asked = false, ending_sent = false, ending_back = false;
  std::string lost;  // for peer_watch_lost

  std::atomic<bool> job_ending{false};
  Clock::time_point ending_since;
  std::string ending_origin;  // "rank 2 on node2 ended with an error: ..."
};

std::atomic<Watch*> g_watch{nullptr};
std::atomic<bool> g_stop_signal{false};

std::string where(const Watch& w, int r) {
  std::string s = "rank " + std::to_string(r);
  if (r >= 0 && size_t(r) < w.hosts.size()) s += " on " + w.hosts[size_t(r)];
  return s;
}

// "while waiting 1.2 s in all_reduce_sum" / "between collectives".
std::string collective_phrase() {
  const char* what = nullptr;
  double waited = 0;
  char buf[160];
  if (collective_in_progress(&what, &waited))
    std::snprintf(buf, sizeof buf, "this rank was waiting in %s for %.1f s", what, waited);
  else
    std::snprintf(buf, sizeof buf, "this rank was between collectives");
  return buf;
}

void send_now(Link& l, const std::string& f) {
  if (l.fd < 0 || l.closed) return;
  if (l.out.size() + f.size() > kMaxQueued) return;
  l.out += f;
  while (!l.out.empty()) {
    const ssize_t n = ::send(l.fd, l.out.data(), l.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      l.out.erase(0, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: flushed when the socket drains; an error shows up on the read side
  }
}

// Prints the line and ends the process: MPI would wait for the lost peer.
[[noreturn]] void end_rank(const Watch& w, const std::string& line) {
  const std::string msg = w.program + ": error: [" + where(w, w.rank) + "] " + line + "\n";
  ssize_t n = ::write(2, msg.data(), msg.size());
  (void)n;
  _exit(1);
}

// A neighbour is lost: tell the other neighbour, print, end.
[[noreturn]] void report_lost(Watch& w, int lost, int from_link, const std::string& how) {
  std::string p;
  put_i32(p, lost);
  put_i32(p, w.rank);
  p += how;
  for (size_t k = 0; k < w.links.size(); ++k)
    if (int(k) != from_link && w.links[k].peer != lost) send_now(w.links[k], frame(kLost, p));
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.lost = where(w, lost) + " (" + how + ")";
  }
  end_rank(
      w, "lost " + where(w, lost) + ": " + how + "; " + collective_phrase() + "; ending this rank");
}

void close_link(Link& l) {
  if (l.fd >= 0 && !l.closed) ::close(l.fd);
  l.closed = true;
}

class Thread {
 public:
  explicit Thread(Watch& w) : w_(w) {}

  void run() {
    Clock::time_point last = Clock::now(), next_beat = last;
    for (;;) {
      const Clock::time_point now0 = Clock::now();
      double wait_s = std::min(0.25, std::max(0.0, seconds(next_beat - now0)));
      std::vector<pollfd> fds;
      std::vector<int> which;
      fds.push_back({w_.wake[0], POLLIN, 0});
      which.push_back(-1);
      for (size_t k = 0; k < w_.links.size(); ++k) {
        Link& l = w_.links[k];
        if (l.closed) continue;
        fds.push_back({l.fd, short(POLLIN | (l.out.empty() ? 0 : POLLOUT)), 0});
        which.push_back(int(k));
      }
      ::poll(fds.data(), fds.size(), int(wait_s * 1000));
      const Clock::time_point now = Clock::now();
      // Longer than asked: this process was stopped (or starved). Its neighbours'
      // silence during that time says nothing about them: it is not counted.
      const double unseen = seconds(now - last) - wait_s;
      if (unseen > std::max(0.5, w_.beat))
        for (Link& l : w_.links) l.heard += std::chrono::microseconds(int64_t(unseen * 1e6));
      last = now;

      if (fds[0].revents & POLLIN) {
        char buf[64];
        while (::read(w_.wake[0], buf, sizeof buf) > 0) {
        }
      }
      if (commands(now)) return;

      for (size_t i = 1; i < fds.size(); ++i) {
        Link& l = w_.links[size_t(which[i])];
        if (fds[i].revents & POLLOUT) send_now(l, {});
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) receive(which[i], now);
      }

      for (size_t k = 0; k < w_.links.size(); ++k) {
        Link& l = w_.links[k];
        if (l.departed || w_.job_ending.load()) continue;
        const double quiet = seconds(now - l.heard);
        if (quiet > w_.lost_after) {
          char how[200];
          std::snprintf(how, sizeof how,
                        "nothing heard from it for %.0f s (--peer_lost_after %g): its host is "
                        "down or cut off from %s",
                        quiet, w_.lost_after, w_.hosts[size_t(w_.rank)].c_str());
          report_lost(w_, l.peer, int(k), how);
        }
        if (g_stop_signal.load() && quiet > std::max(3 * w_.beat, kQuietAtStop)) {
          char how[200];
          std::snprintf(how, sizeof how,
                        "nothing heard from it for %.0f s when a stop signal came: its host is "
                        "down or cut off from %s",
                        quiet, w_.hosts[size_t(w_.rank)].c_str());
          report_lost(w_, l.peer, int(k), how);
        }
      }
      if (w_.job_ending.load() && seconds(now - w_.ending_since) > kEndingGrace)
        end_rank(w_, w_.ending_origin +
                         "; the job is ending, and no launcher ended this rank "
                         "within 10 s; ending it");

      if (now >= next_beat) {
        for (Link& l : w_.links)
          if (!l.departed) send_now(l, frame(kBeat));
        next_beat = now + std::chrono::microseconds(int64_t(w_.beat * 1e6));
      }
    }
  }

 private:
  // Returns true when the thread is to end (goodbye said).
  bool commands(Clock::time_point now) {
    std::string ending;
    bool send_ending = false, stop = false;
    {
      std::lock_guard<std::mutex> lock(w_.mu);
      if (w_.ending_asked && !w_.ending_sent) {
        w_.ending_sent = send_ending = true;
        put_i32(ending, w_.rank);
        ending += w_.ending_text;
      }
      stop = w_.stop;
    }
    if (send_ending) {
      if (!w_.job_ending.exchange(true)) {
        w_.ending_since = now;
        w_.ending_origin = "this rank failed";
      }
      // Around the ring: to rank + 1 (with W = 2 the one link, and back it comes).
      Link& next = w_.links.back();
      if (next.departed || next.closed) {
        std::lock_guard<std::mutex> lock(w_.mu);
        w_.ending_back = true;
        w_.cv.notify_all();
      } else {
        send_now(next, frame(kEnding, ending));
      }
    }
    if (!stop) return false;
    goodbye();
    return true;
  }

  void goodbye() {
    for (Link& l : w_.links) {
      if (l.closed) continue;
      send_now(l, frame(kBye));
      ::shutdown(l.fd, SHUT_WR);
    }
    // Read until each neighbour closes its side (it does on our goodbye), at most 1 s,
    // so that no unread byte turns our close into a reset.
    const Clock::time_point until = Clock::now() + std::chrono::seconds(1);
    for (Link& l : w_.links) {
      while (!l.closed && Clock::now() < until) {
        pollfd p{l.fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        char buf[512];
        const ssize_t n = ::recv(l.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      }
      close_link(l);
    }
  }

  void receive(int k, Clock::time_point now) {
    Link& l = w_.links[size_t(k)];
    bool eof = false;
    int err = 0;
    for (;;) {
      char buf[4096];
      const ssize_t n = ::recv(l.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        l.in.append(buf, size_t(n));
        l.heard = now;
        continue;
      }
      if (n == 0) eof = true;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        eof = true;
        err = errno;
      }
      break;
    }
    parse(k, now);
    if (!eof) return;
    close_link(l);
    if (l.departed || w_.job_ending.load()) {
      l.departed = true;
      return;
    }
    report_lost(w_, l.peer, k,
                err ? "its connection failed (" + errno_text(err) +
                          ") without a goodbye: its process was killed or its host went down"
                    : "its connection closed without a goodbye: its process was killed or its "
                      "host went down");
  }

  void parse(int k, Clock::time_point now) {
    Link& l = w_.links[size_t(k)];
    while (l.in.size() >= 3) {
      const size_t len = size_t(uint8_t(l.in[1])) | size_t(uint8_t(l.in[2])) << 8;
      if (l.in.size() < 3 + len) return;
      const char type = l.in[0];
      const std::string p = l.in.substr(3, len);
      l.in.erase(0, 3 + len);
      if (type == kBeat) continue;
      if (type == kBye) {
        l.departed = true;
        ::shutdown(l.fd, SHUT_WR);
        continue;
      }
      if (type == kEnding && p.size() >= 4) {
        const int origin = get_i32(p, 0);
        if (origin == w_.rank) {
          std::lock_guard<std::mutex> lock(w_.mu);
          w_.ending_back = true;
          w_.cv.notify_all();
          continue;
        }
        if (!w_.job_ending.exchange(true)) {
          w_.ending_since = now;
          w_.ending_origin = where(w_, origin) + " failed (" + p.substr(4) + ")";
        }
        // On to rank + 1, whichever side it came from: it travels one way round.
        send_now(w_.links.back(), frame(kEnding, p));
        continue;
      }
      if (type == kLost && p.size() >= 8) {
        const int lost = get_i32(p, 0), origin = get_i32(p, 4);
        const std::string how = p.substr(8);
        // Away from where it came from, never back to the lost rank.
        for (size_t j = 0; j < w_.links.size(); ++j)
          if (int(j) != k && w_.links[j].peer != lost) send_now(w_.links[j], frame(kLost, p));
        {
          std::lock_guard<std::mutex> lock(w_.mu);
          w_.lost = where(w_, lost) + " (" + how + ")";
        }
        if (lost == w_.rank)
          end_rank(w_, where(w_, origin) + " lost this rank (" + how + "); " + collective_phrase() +
                           "; ending this rank");
        end_rank(w_, "lost " + where(w_, lost) + " (noticed by " + where(w_, origin) + ": " + how +
                         "); " + collective_phrase() + "; ending this rank");
      }
      // Anything else: a newer peer's frame; skipped.
    }
  }

  Watch& w_;
};

// ------------------------------------------------------------------ start-up ---

std::vector<uint32_t> local_ipv4() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
    const uint32_t ip = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
    if (std::find(out.begin(), out.end(), ip) == out.end()) out.push_back(ip);
  }
  freeifaddrs(list);
  return out;
}

std::string ip_text(uint32_t ip) {
  char buf[INET_ADDRSTRLEN] = "?";
  in_addr a{};
  a.s_addr = ip;
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

// A connected socket to ip:port within `limit` seconds, or -1 with *why.
int connect_within(uint32_t ip, uint16_t port, double limit, std::string* why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *why = "socket: " + errno_text(errno);
    return -1;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = ip;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS) {
    *why = ip_text(ip) + ":" + std::to_string(port) + ": " + errno_text(errno);
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  const int n = ::poll(&p, 1, int(limit * 1000));
  int err = 0;
  socklen_t len = sizeof err;
  if (n <= 0) {
    *why = ip_text(ip) + ":" + std::to_string(port) + ": no answer in " +
           std::to_string(int(limit)) + " s";
    ::close(fd);
    return -1;
  }
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    *why = ip_text(ip) + ":" + std::to_string(port) + ": " + errno_text(err);
    ::close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Reads one whole frame from a blocking-by-poll socket before `until`.
bool read_frame(int fd, Clock::time_point until, char* type, std::string* payload) {
  std::string in;
  for (;;) {
    if (in.size() >= 3) {
      const size_t len = size_t(uint8_t(in[1])) | size_t(uint8_t(in[2])) << 8;
      if (in.size() >= 3 + len) {
        *type = in[0];
        *payload = in.substr(3, len);
        return true;
      }
    }
    const double left = seconds(until - Clock::now());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(left * 1000) + 1) <= 0) continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return false;
    }
    in.append(buf, size_t(n));
  }
}

// A socket listening on every interface, on a port the kernel picks (in
// me->port), or -1 or no port with *failure.
int listen_any(Published* me, std::string* failure) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) {
    *failure = "socket: " + errno_text(errno);
  } else {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof sa;
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(lfd, 8) != 0 ||
        getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
      *failure = "cannot listen: " + errno_text(errno);
    else
      me->port = ntohs(sa.sin_port);
  }
  return lfd;
}

// Rank r's connection to rank `next`, which published `p`: on the loopback
// first when both are on one node, then on each published address; greeted
// with the job's cookie and r. On failure, *failure says why (the socket
// stays open when only the greeting failed).
int connect_to_next(const Watch& w, const RankInfo& info, const Published& p, int next,
                    uint64_t cookie, std::string* failure) {
  const int r = w.rank;
  int fd = -1;
  std::vector<uint32_t> tries;
  const bool same_node = info.nodes.node_of.empty() ||
                         info.nodes.node_of[size_t(r)] == info.nodes.node_of[size_t(next)];
  if (same_node) tries.push_back(htonl(INADDR_LOOPBACK));
  tries.insert(tries.end(), p.addr, p.addr + p.naddr);
  std::string why = "no address published";
  for (uint32_t ip : tries) {
    fd = connect_within(ip, p.port, kConnectSeconds / double(tries.size()), &why);
    if (fd >= 0) break;
  }
  if (fd < 0) {
    *failure = "cannot reach " + where(w, next) + " (" + why + ")";
  } else {
    std::string hello;
    for (int k = 0; k < 8; ++k) hello.push_back(char((cookie >> (8 * k)) & 0xff));
    put_i32(hello, r);
    const std::string f = frame(kHello, hello);
    if (::send(fd, f.data(), f.size(), MSG_NOSIGNAL) != ssize_t(f.size()))
      *failure = "cannot greet " + where(w, next) + ": " + errno_text(errno);
  }
  return fd;
}

// The connection from rank `prev` on the listening socket: the first one
// that greets with the job's cookie and prev's rank within 1.5 x
// kConnectSeconds (others are closed), or -1 with *failure.
int accept_from_prev(const Watch& w, int lfd, int prev, uint64_t cookie, std::string* failure) {
  int from = -1;
  const Clock::time_point until =
      Clock::now() + std::chrono::milliseconds(int64_t(kConnectSeconds * 1500));
  while (from < 0 && Clock::now() < until) {
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    char type = 0;
    std::string hello;
    const bool ok =
        read_frame(fd, std::min(until, Clock::now() + std::chrono::seconds(5)), &type, &hello) &&
        type == kHello && hello.size() == 12 && get_u64(hello, 0) == cookie &&
        get_i32(hello, 8) == prev;
    if (!ok) {
      ::close(fd);  // not our neighbour: a stranger, or a stale connection
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    from = fd;
  }
  if (from < 0)
    *failure = where(w, prev) + " did not connect within " +
               std::to_string(int(kConnectSeconds * 1.5)) + " s";
  return from;
}

}  // namespace

PeerWatchStart start_peer_watch(const RankInfo& info, const PeerWatchOptions& options) {
  PeerWatchStart result;
  if (!info.mpi || info.world < 2) return result;
  NCF_CHECK(g_watch.load() == nullptr, "the peer watch runs already");
  NCF_CHECK(options.lost_after > 0, "peer watch: lost_after must be positive, got ",
            options.lost_after);
  const int W = info.world, r = info.rank;
  auto w = std::make_unique<Watch>();
  w->rank = r;
  w->world = W;
  w->lost_after = options.lost_after;
  w->beat = std::min(1.0, options.lost_after / 4);
  w->program = options.program;

  std::string failure;  // this rank's reason, if its part failed
  Published me{};
  gethostname(me.host, sizeof me.host - 1);
  const int lfd = listen_any(&me, &failure);
  const std::vector<uint32_t> ips = local_ipv4();
  me.naddr = uint8_t(std::min<size_t>(ips.size(), 8));
  std::copy(ips.begin(), ips.begin() + me.naddr, me.addr);

  // One cookie for the job, from rank 0: a connection that does not bring it is no peer.
  uint64_t cookie = 0;
  if (r == 0) {
    std::random_device rd;
    cookie = (uint64_t(rd()) << 32) ^ rd();
  }
  MPI_CHECK(MPI_Bcast(&cookie, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
  std::vector<Published> all(static_cast<size_t>(W));
  MPI_CHECK(MPI_Allgather(&me, int(sizeof me), MPI_BYTE, all.data(), int(sizeof me), MPI_BYTE,
                          MPI_COMM_WORLD));
  for (const Published& p : all) w->hosts.emplace_back(p.host, strnlen(p.host, sizeof p.host));

  const int prev = (r + W - 1) % W, next = (r + 1) % W;
  // Rank r connects to rank + 1 and accepts rank - 1; with W = 2 they are one rank, and
  // only rank 0 connects.
  const bool connects = W > 2 || r == 0, accepts = W > 2 || r == 1;
  Link to_next, from_prev;
  to_next.peer = next;
  from_prev.peer = prev;
  if (failure.empty() && connects)
    to_next.fd = connect_to_next(*w, info, all[size_t(next)], next, cookie, &failure);
  if (failure.empty() && accepts) from_prev.fd = accept_from_prev(*w, lfd, prev, cookie, &failure);
  if (lfd >= 0) ::close(lfd);
  int ok = failure.empty() ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!ok) {
    if (to_next.fd >= 0) ::close(to_next.fd);
    if (from_prev.fd >= 0) ::close(from_prev.fd);
    if (failure.empty() && r != 0) return result;
    const std::string why =
        failure.empty() ? std::string("a rank could not reach its neighbour") : failure;
    result.warning = "[" + where(*w, r) + "] peer watch off for this job: " + why +
                     " (a lost peer is then noticed only by MPI or --peer_timeout)";
    return result;
  }
  const Clock::time_point now = Clock::now();
  if (accepts) {
    from_prev.heard = now;
    w->links.push_back(std::move(from_prev));
  }
  if (connects) {
    to_next.heard = now;
    w->links.push_back(std::move(to_next));
  }
  NCF_CHECK(::pipe2(w->wake, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2: ", errno_text(errno));
  Watch* raw = w.release();
  g_watch.store(raw);
  raw->thread = std::thread([raw] { Thread(*raw).run(); });
  result.running = true;
  return result;
}

void stop_peer_watch() {
  Watch* w = g_watch.load();
  if (!w || !w->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->stop = true;
  }
  const char c = 's';
  ssize_t n = ::write(w->wake[1], &c, 1);
  (void)n;
  w->thread.join();
  // The Watch stays allocated: peer_host and peer_watch_lost may still be asked.
}

void announce_job_ending(const std::string& why, double wait_s) {
  Watch* w = g_watch.load();
  if (!w || !w->thread.joinable()) return;
  std::unique_lock<std::mutex> lock(w->mu);
  if (w->ending_asked || w->stop) return;
  w->ending_asked = true;
  w->ending_text = why.substr(0, 400);
  const char c = 'e';
  ssize_t n = ::write(w->wake[1], &c, 1);
  (void)n;
  w->cv.wait_for(lock, std::chrono::milliseconds(int64_t(wait_s * 1000)),
                 [w] { return w->ending_back; });
}

void peer_watch_stop_signal() { g_stop_signal.store(true); }

std::string peer_host(int r) {
  Watch* w = g_watch.load();
  if (!w || r < 0 || size_t(r) >= w->hosts.size()) return "";
  return w->hosts[size_t(r)];
}

std::string peer_watch_lost() {
  Watch* w = g_watch.load();
  if (!w) return "";
  std::lock_guard<std::mutex> lock(w->mu);
  return w->lost;
}

}  // namespace ncf
