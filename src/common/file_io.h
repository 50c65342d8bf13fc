// Plain POSIX file I/O for files that several ranks write or read at offsets
// (checkpoints): positioned reads and writes that finish short transfers and
// retry EINTR, fsync of files and directories, and an owned descriptor. Every
// error is an ncf::Error naming the path, the offset and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ncf {

// An open file descriptor, closed on destruction.
class FileHandle {
 public:
  FileHandle() = default;
  // flags as for open(2), e.g. O_RDONLY or O_WRONLY | O_CREAT.
  FileHandle(const std::string& path, int flags);
  ~FileHandle();
  FileHandle(FileHandle&& o) noexcept;
  FileHandle& operator=(FileHandle&& o) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // n bytes at offset; a short file is an error naming both sizes.
  void read_at(int64_t offset, void* data, size_t n) const;
  void write_at(int64_t offset, const void* data, size_t n) const;
  void truncate(int64_t bytes) const;
  void sync() const;  // fsync: the bytes are on stable storage when it returns
  int64_t size() const;
  void close();  // reports a failing close (deferred write errors)

 private:
  int fd_ = -1;
  std::string path_;
};

// fsync of a directory, so that the names created, renamed or removed in it
// survive a crash.
void sync_directory(const std::string& dir);
// Writes `text` to path through path + ".tmp": write, fsync, rename, fsync of
// the directory. A reader sees the old file or the whole new one.
void write_file_atomic(const std::string& path, const std::string& text);
// The whole file as bytes; errors name the path.
std::string read_text_file(const std::string& path);

}  // namespace ncf
