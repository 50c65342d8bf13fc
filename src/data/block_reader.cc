// The read-ahead block reader: see block_reader.h. One thread reads plain files
// with read(2) and gzip files with zlib's gzread (which also takes concatenated
// gzip members), into a small pool of block buffers handed to the caller in order.
#include "data/block_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "common/check.h"
#include "data/crc32c.h"

namespace ncf {

namespace {

struct Block {
  std::vector<char> data;
  size_t size = 0;
  uint32_t crc_after = 0;    // CRC-32C of the content up to the end of this block
  bool last = false;         // the end of the content (size may be 0)
  std::exception_ptr error;  // a read error instead of data, passed on as it was thrown
};

}  // namespace

struct BlockReader::Impl {
  std::string path;
  size_t block_bytes = 0;
  int fd = -1;
  gzFile gz = nullptr;
  uint64_t file_bytes = 0;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Block> filled;  // in file order
  std::vector<std::vector<char>> free_buffers;
  bool stop = false;
  bool done = false;  // the consumer saw the last block or an error
  std::thread thread;

  uint64_t handed = 0;
  uint32_t crc = 0;

  // Reads up to n bytes; fewer only at the end of the content.
  size_t fill(char* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      if (gz) {
        const size_t want = std::min<size_t>(n - got, size_t(1) << 30);
        const int k = gzread(gz, p + got, unsigned(want));
        if (k < 0) {
          int err = 0;
          const char* msg = gzerror(gz, &err);
          NCF_FAIL("cannot decompress ", path, " after ", handed + got,
                   " bytes of content: ", msg ? msg : "zlib error",
                   err == Z_BUF_ERROR ? " (truncated .gz file?)" : "");
        }
        if (k == 0) {
          int err = 0;
          const char* msg = gzerror(gz, &err);
          if (err != Z_OK && err != Z_STREAM_END)
            NCF_FAIL("cannot decompress ", path, " after ", handed + got,
                     " bytes of content: ", msg ? msg : "zlib error");
          break;
        }
        got += size_t(k);
      } else {
        const ssize_t k = ::read(fd, p + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) NCF_FAIL("cannot read ", path, ": ", std::strerror(errno));
        if (k == 0) break;
        got += size_t(k);
      }
    }
    return got;
  }

  void run() {
    uint32_t running = 0;
    for (;;) {
      std::vector<char> buf;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !free_buffers.empty(); });
        if (stop) return;
        buf = std::move(free_buffers.back());
        free_buffers.pop_back();
      }
      Block b;
      try {
        buf.resize(block_bytes);
        b.size = fill(buf.data(), block_bytes);
        running = crc32c_extend(running, buf.data(), b.size);
        b.crc_after = running;
        b.last = b.size < block_bytes;
      } catch (const Error&) {
        b.error = std::current_exception();
        b.last = true;
      } catch (const std::exception& e) {
        b.error = std::make_exception_ptr(Error(e.what()));
        b.last = true;
      }
      b.data = std::move(buf);
      const bool last = b.last;
      {
        std::lock_guard<std::mutex> lk(mu);
        filled.push_back(std::move(b));
      }
      cv.notify_all();
      if (last) return;
    }
  }
};

BlockReader::BlockReader(const std::string& path, size_t block_bytes)
    : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.path = path;
  r.block_bytes = std::max<size_t>(block_bytes, 1);
  r.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd < 0) {
    const int err = errno;
    NCF_FAIL("cannot open ", path, ": ", std::strerror(err));
  }
  struct stat st;
  if (::fstat(r.fd, &st) != 0) {
    const int err = errno;
    ::close(r.fd);
    NCF_FAIL("cannot stat ", path, ": ", std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(r.fd);
    NCF_FAIL("cannot read ", path, ": is a directory");
  }
  r.file_bytes = uint64_t(st.st_size);
  if (r.file_bytes == 0) {
    ::close(r.fd);
    NCF_FAIL(path, ": empty file");
  }
  unsigned char magic[2] = {0, 0};
  const bool gzip = ::pread(r.fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (gzip) {
    r.gz = gzdopen(r.fd, "rb");
    if (!r.gz) {
      ::close(r.fd);
      NCF_FAIL("cannot open ", path, " as gzip");
    }
    r.fd = -1;  // owned by gz now
    gzbuffer(r.gz, 1u << 20);
  } else {
    ::posix_fadvise(r.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  for (int k = 0; k <= kQueuedBlocks; ++k) r.free_buffers.emplace_back();
  r.thread = std::thread([&r] { r.run(); });
}

BlockReader::~BlockReader() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->gz) gzclose(impl_->gz);
  if (impl_->fd >= 0) ::close(impl_->fd);
}

size_t BlockReader::append_next(std::vector<char>* out) {
  Impl& r = *impl_;
  if (r.done) return 0;
  Block b;
  {
    std::unique_lock<std::mutex> lk(r.mu);
    r.cv.wait(lk, [&] { return !r.filled.empty(); });
    b = std::move(r.filled.front());
    r.filled.pop_front();
  }
  if (b.error) {
    r.done = true;
    std::rethrow_exception(b.error);
  }
  out->insert(out->end(), b.data.begin(), b.data.begin() + ptrdiff_t(b.size));
  r.handed += b.size;
  r.crc = b.crc_after;
  if (b.last) r.done = true;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    r.free_buffers.push_back(std::move(b.data));
  }
  r.cv.notify_all();
  return b.size;
}

bool BlockReader::gzip() const { return impl_->gz != nullptr; }
uint64_t BlockReader::file_bytes() const { return impl_->file_bytes; }
uint64_t BlockReader::content_bytes() const { return impl_->handed; }
uint32_t BlockReader::content_crc32c() const { return impl_->crc; }

}  // namespace ncf
