// gen_interactions: a large synthetic interaction log in CSV, for timing
// ncf_prep --format csv (bench/prep_scale.sh). Header user_id,item_id,
// timestamp,rating; user ids are 16 hex characters (a hash of the user
// index), item ids SKU strings ("SKU-0012345", one in 50 quoted with a comma:
// "SKU-0012345, size XL"), timestamps ISO 8601 UTC or integer seconds over two
// years in no particular order, ratings 1 to 5 in half steps.
//
// Item popularity is Zipf-like (exponent 1: the item of popularity rank r is
// drawn with probability about 1/r), users half uniform and half heavy-tailed.
// Row k depends on (seed, k) only, so the file is the same whatever --threads.
//
//   gen_interactions --rows 100000000 --users 10000000 --items 1000000
//       --timestamps iso --output /var/tmp/interactions.csv
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// The j-th 64-bit draw of row k.
uint64_t draw(uint64_t seed, uint64_t k, uint64_t j) {
  return mix64(mix64(seed * 0x9E3779B97F4A7C15ull + k) + j * 0xD1B54A32D192ED03ull);
}

double unit(uint64_t r) { return double(r >> 11) * (1.0 / 9007199254740992.0); }

struct Params {
  uint64_t rows = 100000000, users = 10000000, items = 1000000, seed = 1;
  std::string timestamps = "iso";  // iso, int, mixed
  std::string output;
  int threads = 0;
};

void put_digits(std::string& s, uint64_t v, int width) {
  char buf[24];
  int n = 0;
  do {
    buf[n++] = char('0' + v % 10);
    v /= 10;
  } while (v > 0 || n < width);
  while (n > 0) s += buf[--n];
}

// The civil date of a day count from 1970-01-01 (a loop over years; the
// dates here span two years).
void civil(int64_t days, int* y, int* m, int* d) {
  int year = 1970;
  auto leap = [](int yy) { return (yy % 4 == 0 && yy % 100 != 0) || yy % 400 == 0; };
  while (days >= (leap(year) ? 366 : 365)) days -= leap(year++) ? 366 : 365;
  static const int kLen[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  int month = 0;
  for (;; ++month) {
    const int len = kLen[month] + (month == 1 && leap(year) ? 1 : 0);
    if (days < len) break;
    days -= len;
  }
  *y = year;
  *m = month + 1;
  *d = int(days) + 1;
}

void row(const Params& p, uint64_t k, std::string& out) {
  static const char kHex[] = "0123456789abcdef";
  // User: half uniform, half from a heavy tail over the low indices.
  const double a = unit(draw(p.seed, k, 0));
  uint64_t u = uint64_t(unit(draw(p.seed, k, 1)) * double(p.users));
  if (a < 0.5) u = uint64_t(std::pow(unit(draw(p.seed, k, 2)), 3.0) * double(p.users));
  u = std::min(u, p.users - 1);
  const uint64_t h = mix64(u ^ (p.seed << 40) ^ 0x5bd1e995ull);
  for (int s = 60; s >= 0; s -= 4) out += kHex[(h >> s) & 15];
  out += ',';
  // Item: popularity rank r with probability ~ 1/r (log-uniform), then a
  // fixed shuffle of ranks so popular items are spread over the id range.
  const double r = std::exp(unit(draw(p.seed, k, 3)) * std::log(double(p.items) + 1.0)) - 1.0;
  const uint64_t rank = std::min<uint64_t>(uint64_t(r), p.items - 1);
  const uint64_t item = (rank * 2654435761ull + 12345) % p.items;
  const bool quoted = item % 50 == 0;
  if (quoted) out += '"';
  out += "SKU-";
  put_digits(out, item, 7);
  if (quoted) out += ", size XL\"";
  out += ',';
  // Time: two years from 2019-01-01.
  const int64_t t = 1546300800 + int64_t(draw(p.seed, k, 4) % (2 * 365 * 86400ull));
  const bool iso = p.timestamps == "iso" || (p.timestamps == "mixed" && (draw(p.seed, k, 5) & 1));
  if (iso) {
    int y, m, d;
    civil(t / 86400, &y, &m, &d);
    const int64_t sec = t % 86400;
    put_digits(out, uint64_t(y), 4);
    out += '-';
    put_digits(out, uint64_t(m), 2);
    out += '-';
    put_digits(out, uint64_t(d), 2);
    out += 'T';
    put_digits(out, uint64_t(sec / 3600), 2);
    out += ':';
    put_digits(out, uint64_t(sec / 60 % 60), 2);
    out += ':';
    put_digits(out, uint64_t(sec % 60), 2);
    out += 'Z';
  } else {
    put_digits(out, uint64_t(t), 1);
  }
  out += ',';
  const uint64_t half_stars = 2 + draw(p.seed, k, 6) % 9;  // 1.0 .. 5.0
  put_digits(out, half_stars / 2, 1);
  if (half_stars % 2) out += ".5";
  out += '\n';
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "gen_interactions: %s\nusage: gen_interactions --output FILE [--rows N] [--users U] "
               "[--items I] [--seed S] [--timestamps iso|int|mixed] [--threads T]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Params p;
  for (int a = 1; a < argc; ++a) {
    const std::string k = argv[a];
    if (a + 1 >= argc) usage(("missing value of " + k).c_str());
    const std::string v = argv[++a];
    if (k == "--rows")
      p.rows = std::stoull(v);
    else if (k == "--users")
      p.users = std::stoull(v);
    else if (k == "--items")
      p.items = std::stoull(v);
    else if (k == "--seed")
      p.seed = std::stoull(v);
    else if (k == "--timestamps")
      p.timestamps = v;
    else if (k == "--output")
      p.output = v;
    else if (k == "--threads")
      p.threads = std::stoi(v);
    else
      usage(("unknown flag " + k).c_str());
  }
  if (p.output.empty()) usage("--output is required");
  if (p.users == 0 || p.items == 0 || p.items > 9999999)
    usage("--users >= 1, 1 <= --items <= 9999999");
  if (p.timestamps != "iso" && p.timestamps != "int" && p.timestamps != "mixed")
    usage("--timestamps is iso, int or mixed");
  const int T = p.threads > 0 ? p.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const std::string tmp = p.output + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) usage(("cannot create " + tmp).c_str());
  const auto t0 = std::chrono::steady_clock::now();
  const char* header = "user_id,item_id,timestamp,rating\n";
  std::fwrite(header, 1, std::strlen(header), f);
  constexpr uint64_t kBlock = 1 << 20;  // rows a thread formats at once
  std::vector<std::string> bufs(static_cast<size_t>(T));
  uint64_t bytes = std::strlen(header);
  for (uint64_t first = 0; first < p.rows; first += kBlock * uint64_t(T)) {
    std::vector<std::thread> pool;
    for (int t = 0; t < T; ++t)
      pool.emplace_back([&, t] {
        std::string& s = bufs[size_t(t)];
        s.clear();
        const uint64_t b = first + uint64_t(t) * kBlock, e = std::min(p.rows, b + kBlock);
        for (uint64_t k = b; k < e; ++k) row(p, k, s);
      });
    for (auto& th : pool) th.join();
    for (const auto& s : bufs) {
      if (std::fwrite(s.data(), 1, s.size(), f) != s.size()) usage("write failed (disk full?)");
      bytes += s.size();
    }
  }
  if (std::fclose(f) != 0 || std::rename(tmp.c_str(), p.output.c_str()) != 0)
    usage("cannot finish the output");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("gen_interactions: %llu rows, %.2f GB in %.1f s -> %s\n", (unsigned long long)p.rows,
              double(bytes) / 1e9, s, p.output.c_str());
  return 0;
}
