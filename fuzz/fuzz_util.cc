// The fuzz targets' shared helpers: see fuzz_util.h.
#include "fuzz_util.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/crc32c.h"
#include "data/dataset.h"
#include "data/format.h"
#include "train/checkpoint.h"

namespace ncf::fuzz {

namespace fs = std::filesystem;

std::vector<std::pair<std::string, std::string>> write_checkpoint(
    const std::string& path, const std::vector<std::string>& parts, bool reseal, bool fix) {
  fs::create_directories(path);
  std::string manifest = parts[0];
  std::vector<std::pair<std::string, std::string>> written;
  nlohmann::json j = nlohmann::json::parse(manifest, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (j.contains("files") && j["files"].is_array()) {
      size_t next = 1;
      for (nlohmann::json& f : j["files"]) {
        const std::string bytes = next < parts.size() ? parts[next] : std::string();
        ++next;
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
        const std::string name = f["name"].get<std::string>();
        if (!safe_name(name) || name == kCheckpointManifestFile) continue;
        write_file(path + "/" + name, bytes);
        written.emplace_back(name, bytes);
        if (fix) {
          f["bytes"] = bytes.size();
          f["crc32c"] = crc_of(bytes);
        }
      }
    }
    if (reseal) j["crc32c"] = checkpoint_manifest_crc32c(j);
    manifest = j.dump(1);
  }
  write_file(path + "/" + kCheckpointManifestFile, manifest);
  return written;
}

std::vector<std::string> split(std::string_view in, std::string_view sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (;;) {
    const size_t hit = in.find(sep, at);
    if (hit == std::string_view::npos) break;
    parts.emplace_back(in.substr(at, hit - at));
    at = hit + sep.size();
  }
  parts.emplace_back(in.substr(at));
  return parts;
}

const std::string& scratch() {
  // One directory per process: libFuzzer's -jobs/-workers and CI's parallel
  // runs each get their own. Never freed, so the exit handler below can still
  // read it after static destructors ran.
  static const std::string* const dir = [] {
    std::string base = "/dev/shm";
    if (::access(base.c_str(), W_OK) != 0) {
      const char* t = std::getenv("TMPDIR");
      base = t && *t ? t : "/tmp";
    }
    auto* d = new std::string(base + "/ncf-fuzz-" + std::to_string(::getpid()));
    fs::remove_all(*d);
    fs::create_directories(*d);
    // Removed at exit, so runs leave no tmpfs behind (a crash leaves it; the
    // next process with that pid clears it first).
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch(), ec);
    });
    return d;
  }();
  return *dir;
}

void reset_scratch() {
  const std::string& d = scratch();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(d, ec)) fs::remove_all(e.path(), ec);
}

std::string in_scratch(const std::string& name) { return scratch() + "/" + name; }

void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) property_failed("cannot create " + path);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
    property_failed("cannot write " + path);
  std::fclose(f);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool safe_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos && name.size() < 200;
}

std::string frame_records(const std::vector<std::string>& payloads) {
  std::string out;
  for (const std::string& p : payloads) {
    unsigned char head[12];
    const uint64_t n = p.size();
    for (int i = 0; i < 8; ++i) head[i] = static_cast<unsigned char>(n >> (8 * i));
    const uint32_t len_crc = masked_crc32c(head, 8);
    for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<unsigned char>(len_crc >> (8 * i));
    out.append(reinterpret_cast<const char*>(head), sizeof head);
    out += p;
    const uint32_t crc = masked_crc32c(p.data(), p.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(crc >> (8 * i)));
  }
  return out;
}

uint32_t crc_of(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

PrepOptions small_prep(uint8_t knobs) {
  PrepOptions opt;
  opt.eval_negatives = 1 + knobs % 3;
  opt.min_interactions = 2 + (knobs / 4) % 2;
  opt.record_rows = 3;
  opt.num_shards = 2;
  opt.threads = 1;
  opt.seed = 7;
  opt.shuffle_buffer_bytes = 1 << 20;
  return opt;
}

void check_prepared(const std::string& out_dir) {
  try {
    verify_dataset(out_dir);
  } catch (const Error& e) {
    property_failed(std::string("a dataset ncf_prep wrote fails its verify: ") + e.what());
  }
}

bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("NCF_FUZZ_VERBOSE");
    return e && *e && *e != '0';
  }();
  return v;
}

void property_failed(const std::string& what) {
  std::fprintf(stderr, "fuzz: property broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace ncf::fuzz
