// Helpers shared by the tests: temporary directories, writing small files,
// running the built programs (also under mpirun) and capturing their output.
#pragma once

#include <string>

namespace ncf::test {

// A fresh directory under $TMPDIR, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, capturing its output.
RunResult run(const std::string& command);
// Path of a built program (ncf_prep, ncf_dist, …).
std::string bin(const std::string& name);
// "mpirun -np N --oversubscribe …" with the flags root needs.
std::string mpirun(int np);

}  // namespace ncf::test
