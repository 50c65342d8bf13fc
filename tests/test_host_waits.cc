// Source check: every host wait on the GPU goes through the interruptible waits of
// common/cuda_context.h (wait_stream, wait_event, wait_device), so that a rank whose
// peer died ends with the NCCL communicator's error instead of waiting forever for a
// collective that will never finish (issue 22). The calls that block the host are
// the stream, event and device synchronizes, the synchronous cudaMemcpy family, and
// cudaFree / cudaFreeHost, which wait for the whole device (every stream, also the
// communicator's non-blocking one). Each may appear in src/ only in a function of the
// allow-list below, which says why that place may block. Runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Allowed {
  const char* file;      // under src/
  const char* function;  // qualified as the scanner names it (Class::member)
  const char* call;      // the blocking call
  const char* after;     // a call that must come first in the function, or nullptr
  const char* why;       // why this place may block
};

const Allowed kAllowed[] = {
    // The interruptible waits themselves.
    {"common/cuda_context.cu", "wait_event", "cudaEventSynchronize", nullptr,
     "its path without pollers: nothing could end the wait early"},
    {"common/cuda_context.cu", "wait_stream", "cudaStreamSynchronize", nullptr,
     "its path without pollers: nothing could end the wait early"},
    {"common/cuda_context.cu", "wait_device", "cudaDeviceSynchronize", nullptr,
     "without pollers nothing could end the wait early; with pollers it runs on a helper "
     "thread while the caller polls"},
    {"common/cuda_context.cu", "wait_device_nothrow", "cudaDeviceSynchronize", "wait_device",
     "for destructors, once a poller threw: a destructor cannot pass the error on, and the "
     "NCCL poller aborted its communicator before throwing, so the device drains"},
    // Frees: cudaFree and cudaFreeHost wait for the whole device, but the device was
    // drained just before through the waits above, so nothing is left to wait for.
    {"common/device.cc", "device_free", "cudaFree", "wait_device", "drained first"},
    {"common/device.cc", "device_release", "cudaFree", "wait_device_nothrow",
     "drained first (destructors)"},
    {"common/device.cc", "pinned_free", "cudaFreeHost", "wait_device", "drained first"},
    {"common/device.cc", "pinned_release", "cudaFreeHost", "wait_device_nothrow",
     "drained first (destructors)"},
    // Host <-> device copies.
    {"common/device.cc", "device_copy", "cudaMemcpy", "wait_stream",
     "with pollers, wait_stream(nullptr) drains the legacy stream and the blocking streams it "
     "waits for through the polling path first, so only the copy itself is left"},
    // Destructors, which cannot throw.
    {"comm/nccl_communicator.cc", "NcclCommunicator::~NcclCommunicator", "cudaStreamSynchronize",
     "ncclCommAbort", "while unwinding it aborts the communicator first, so its stream drains"},
};

// The calls that make the host wait. cudaMemcpy*Async and cudaFreeAsync do not.
const std::regex& blocking_call() {
  static const std::regex re(
      "\\b(cudaEventSynchronize|cudaStreamSynchronize|cudaDeviceSynchronize|cudaFree|"
      "cudaFreeHost|cudaFreeArray|cudaFreeMipmappedArray|cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|"
      "cudaMemcpyPeer|cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cudaMemcpy2DToArray|"
      "cudaMemcpy2DFromArray)\\s*\\(");
  return re;
}

struct Call {
  std::string file;
  int line = 0;
  std::string function;  // "" at file scope
  std::string call;
  std::string before;  // the function's code from its `{` up to the call
};

// The source with comments, string and character literals blanked to spaces
// (newlines kept, so offsets keep their line numbers).
std::string blank_comments_and_literals(const std::string& s) {
  std::string out = s;
  const size_t n = s.size();
  auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < n; ++k)
      if (out[k] != '\n') out[k] = ' ';
  };
  size_t i = 0;
  while (i < n) {
    const char c = s[i];
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      size_t e = s.find('\n', i);
      if (e == std::string::npos) e = n;
      blank(i, e);
      i = e;
    } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      size_t e = s.find("*/", i + 2);
      e = e == std::string::npos ? n : e + 2;
      blank(i, e);
      i = e;
    } else if (c == '"' && i > 0 && s[i - 1] == 'R') {  // raw string R"delim( ... )delim"
      const size_t open = s.find('(', i);
      const std::string close = ")" + s.substr(i + 1, open - i - 1) + "\"";
      size_t e = open == std::string::npos ? n : s.find(close, open);
      e = e == std::string::npos ? n : e + close.size();
      blank(i, e);
      i = e;
    } else if (c == '"' ||
               (c == '\'' &&
                (i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]))))) {  // not 1'000
      size_t e = i + 1;
      while (e < n && s[e] != c && s[e] != '\n') e += s[e] == '\\' ? 2 : 1;
      e = std::min(n, e + 1);
      blank(i, e);
      i = e;
    } else {
      ++i;
    }
  }
  return out;
}

// Preprocessor lines (with their continuations) blanked as well, for brace matching.
std::string blank_preprocessor(const std::string& s) {
  std::string out = s;
  size_t i = 0;
  while (i < s.size()) {
    size_t e = s.find('\n', i);
    if (e == std::string::npos) e = s.size();
    const size_t first = s.find_first_not_of(" \t", i);
    bool directive = first < e && s[first] == '#';
    while (directive) {
      for (size_t k = i; k < e; ++k) out[k] = ' ';
      const bool continued = e > i && s[e - 1] == '\\';
      i = e + 1;
      if (!continued || i >= s.size()) break;
      e = s.find('\n', i);
      if (e == std::string::npos) e = s.size();
    }
    if (!directive) i = e + 1;
  }
  return out;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// Every blocking call in `source` with the function it sits in. Functions are found
// from the braces: a `{` whose head (the text since the last ; { or }) has a parenthesis
// opens a function when it sits at namespace or class scope; inside a function only a
// local class opens a new scope, and every other brace (blocks, lambdas, initializers)
// belongs to the enclosing function.
std::vector<Call> scan(const std::string& file, const std::string& source) {
  const std::string code = blank_comments_and_literals(source);
  const std::string braces = blank_preprocessor(code);

  std::vector<std::pair<size_t, std::string>> hits;  // offset, call
  for (std::sregex_iterator it(code.begin(), code.end(), blocking_call()), end; it != end; ++it)
    hits.emplace_back(size_t(it->position(0)), (*it)[1].str());

  static const std::regex class_head("\\b(class|struct|union|enum)\\s+(?:class\\s+)?(\\w+)");
  static const std::regex namespace_head("^(inline\\s+)?namespace\\b");
  static const std::regex lambda_tail(
      "\\[[^\\[\\]]*\\]\\s*(\\([^()]*\\))?\\s*(mutable\\s*)?(noexcept\\s*)?(->[^{;]*)?$");
  static const std::regex name_tail("((?:[\\w:~]+::)?operator\\s*[^\\s\\w(]+|[\\w:~]+)\\s*$");

  enum Kind { kNamespace, kClass, kFunction, kBlock };
  struct Scope {
    Kind kind = kBlock;
    std::string name;       // a class's name, or a function's qualified name
    size_t head_start = 0;  // where the text before its `{` starts
    size_t body = 0;        // its `{`
  };
  std::vector<Scope> stack;
  auto function = [&]() -> const Scope* {
    for (auto it = stack.rbegin(); it != stack.rend(); ++it)
      if (it->kind == kFunction) return &*it;
    return nullptr;
  };
  // What a `{` opens, from its head and the scope it sits in.
  auto open = [&](const std::string& head) -> Scope {
    const Scope* cur = nullptr;
    for (auto it = stack.rbegin(); it != stack.rend() && !cur; ++it)
      if (it->kind != kBlock) cur = &*it;
    const bool has_paren = head.find('(') != std::string::npos;
    std::string cls;  // the last match: `template <class T> class Foo` is Foo
    for (std::sregex_iterator it(head.begin(), head.end(), class_head), end; it != end; ++it)
      cls = (*it)[2].str();
    Scope s;
    if (!has_paren && !cls.empty()) {
      s.kind = kClass;
      s.name = cls;
    } else if (cur && cur->kind == kFunction) {
      // A block, a lambda or an initializer of the enclosing function.
    } else if (std::regex_search(head, namespace_head)) {
      s.kind = kNamespace;
    } else if (has_paren && !std::regex_search(head, lambda_tail)) {
      std::smatch m;
      const std::string before = head.substr(0, head.find('('));
      if (std::regex_search(before, m, name_tail)) {
        // Qualified by the enclosing classes; a local class's members also by the
        // function that holds the class.
        std::string prefix;
        for (const Scope& sc : stack)
          if (sc.kind == kClass)
            prefix += sc.name + "::";
          else if (sc.kind == kFunction)
            prefix = sc.name + "::";
        s.kind = kFunction;
        s.name = prefix + m[1].str();
      }
    }
    return s;
  };

  std::vector<Call> calls;
  size_t next_hit = 0;
  size_t head_start = 0;
  int line = 1;
  for (size_t i = 0; i <= braces.size(); ++i) {
    while (next_hit < hits.size() && hits[next_hit].first == i) {
      const Scope* f = function();
      calls.push_back({file, line, f ? f->name : "", hits[next_hit].second,
                       f ? code.substr(f->body, i - f->body) : ""});
      ++next_hit;
    }
    if (i == braces.size()) break;
    const char c = braces[i];
    if (c == '\n') {
      ++line;
    } else if (c == ';') {
      head_start = i + 1;
    } else if (c == '}') {
      head_start = i + 1;
      if (!stack.empty()) {
        // A brace initializer in a constructor's member list (`b_{n}`) ends before the
        // body's `{`: the head of that body still starts where the constructor does.
        const size_t after = braces.find_first_not_of(" \t\r\n", i + 1);
        if (stack.back().kind == kFunction && after != std::string::npos &&
            (braces[after] == ',' || braces[after] == '{'))
          head_start = stack.back().head_start;
        stack.pop_back();
      }
    } else if (c == '{') {
      Scope s = open(trim(braces.substr(head_start, i - head_start)));
      s.head_start = head_start;
      s.body = i;
      stack.push_back(s);
      head_start = i + 1;
    }
  }
  return calls;
}

bool allowed(const Call& c, std::set<const Allowed*>* used) {
  for (const Allowed& a : kAllowed)
    if (c.file == a.file && c.function == a.function && c.call == a.call &&
        (!a.after ||
         std::regex_search(c.before, std::regex(std::string("\\b") + a.after + "\\s*\\(")))) {
      used->insert(&a);
      return true;
    }
  return false;
}

std::vector<Call> scan_src(std::string* listing) {
  const fs::path root = fs::path(NCF_SOURCE_DIR) / "src";
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".cc" || ext == ".cu" || ext == ".h" || ext == ".cuh"))
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<Call> all;
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    for (Call& c : scan(fs::relative(p, root).generic_string(), ss.str())) all.push_back(c);
  }
  if (listing)
    for (const Call& c : all)
      *listing += "  src/" + c.file + ":" + std::to_string(c.line) + ": " + c.call + " in " +
                  (c.function.empty() ? "<file scope>" : c.function) + "\n";
  return all;
}

TEST(HostWaits, ScannerFindsBlockingCallsAndTheirFunctions) {
  const std::string src = R"src(// cudaFree(p) in a comment
namespace ncf {
namespace {
const char* kText = "cudaStreamSynchronize(s)";
void helper(int x) {
  if (x) { cudaFree(p); }
  wait_until([&] { return cudaEventSynchronize(e) == 0; });
  int big = 1'000'000;
}
}  // namespace
struct Holder {
  ~Holder() { cudaFreeHost(p); }
  void grow(size_t n) {
    struct Local {
      ~Local() { cudaDeviceSynchronize(); }
    } l;
    cudaMemcpyAsync(a, b, n, k, s);
    cudaFreeAsync(p, s);
  }
  Buffer<int> dev{Device::kCuda, 0};
};
Holder::Holder(int n) : a_(n), b_{n} { cudaMemcpy(a, b, n, k); }
#define SYNC() cudaStreamSynchronize(0)
}  // namespace ncf
)src";
  const std::vector<Call> calls = scan("x.cc", src);
  std::vector<std::string> got;
  for (const Call& c : calls)
    got.push_back(std::to_string(c.line) + " " + c.call + " " + c.function);
  const std::vector<std::string> want = {"6 cudaFree helper",
                                         "7 cudaEventSynchronize helper",
                                         "12 cudaFreeHost Holder::~Holder",
                                         "15 cudaDeviceSynchronize Holder::grow::Local::~Local",
                                         "22 cudaMemcpy Holder::Holder",
                                         "23 cudaStreamSynchronize "};
  EXPECT_EQ(got, want);
}

TEST(HostWaits, EveryBlockingCudaCallInSrcIsAnAllowedPlace) {
  std::string listing;
  const std::vector<Call> calls = scan_src(&listing);
  // The scan must see the waits that are meant to be there, or it proves nothing.
  ASSERT_GE(calls.size(), std::size(kAllowed)) << listing;
  std::set<const Allowed*> used;
  std::string bad;
  for (const Call& c : calls)
    if (!allowed(c, &used))
      bad += "  src/" + c.file + ":" + std::to_string(c.line) + ": " + c.call + " in " +
             (c.function.empty() ? "<file scope>" : c.function) + "\n";
  EXPECT_TRUE(bad.empty())
      << "host waits that bypass the interruptible waits of common/cuda_context.h (use "
         "wait_stream, wait_event or wait_device before the call, or add the place to "
         "kAllowed with the reason it may block):\n"
      << bad;
  std::string stale;
  for (const Allowed& a : kAllowed)
    if (!used.count(&a))
      stale += std::string("  src/") + a.file + ": " + a.call + " in " + a.function +
               (a.after ? std::string(" after ") + a.after : std::string()) + "\n";
  EXPECT_TRUE(stale.empty())
      << "allow-list entries that match no call (remove them, or restore the call before):\n"
      << stale << "calls found:\n"
      << listing;
}

}  // namespace
