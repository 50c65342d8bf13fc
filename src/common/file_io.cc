// See file_io.h.
#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/check.h"

namespace ncf {

FileHandle::FileHandle(const std::string& path, int flags) : path_(path) {
  do fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) NCF_FAIL("cannot open ", path, ": ", std::strerror(errno));
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

FileHandle::FileHandle(FileHandle&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

void FileHandle::read_at(int64_t offset, void* data, size_t n) const {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::pread(fd_, p + done, n - done, off_t(offset + int64_t(done)));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0)
      NCF_FAIL("cannot read ", path_, " at offset ", offset + int64_t(done), ": ",
               std::strerror(errno));
    if (k == 0)
      NCF_FAIL(path_, " ends at ", offset + int64_t(done), " bytes, but ", n,
               " bytes were to be read from offset ", offset);
    done += size_t(k);
  }
}

void FileHandle::write_at(int64_t offset, const void* data, size_t n) const {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::pwrite(fd_, p + done, n - done, off_t(offset + int64_t(done)));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0)
      NCF_FAIL("cannot write ", path_, " at offset ", offset + int64_t(done), ": ",
               std::strerror(errno));
    done += size_t(k);
  }
}

void FileHandle::truncate(int64_t bytes) const {
  if (::ftruncate(fd_, off_t(bytes)) != 0)
    NCF_FAIL("cannot size ", path_, " to ", bytes, " bytes: ", std::strerror(errno));
}

void FileHandle::sync() const {
  if (::fsync(fd_) != 0) NCF_FAIL("cannot fsync ", path_, ": ", std::strerror(errno));
}

int64_t FileHandle::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) NCF_FAIL("cannot stat ", path_, ": ", std::strerror(errno));
  return int64_t(st.st_size);
}

void FileHandle::close() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) NCF_FAIL("cannot close ", path_, ": ", std::strerror(errno));
}

void sync_directory(const std::string& dir) {
  FileHandle d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    FileHandle f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    f.write_at(0, text.data(), text.size());
    f.sync();
    f.close();
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    NCF_FAIL("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  const std::string parent = std::filesystem::path(path).parent_path().string();
  sync_directory(parent.empty() ? "." : parent);
}

std::string read_text_file(const std::string& path) {
  FileHandle f(path, O_RDONLY);
  std::string text(size_t(f.size()), '\0');
  f.read_at(0, text.data(), text.size());
  return text;
}

}  // namespace ncf
