// The commands shown in README.md and docs/*.md keep matching the programs:
// every command line in a shell code block that starts one of ours (ncf_prep,
// ncf_dist, ncf_recommend, ncf_export, launch/ncf_launch, or a script of the
// repository) names a program that exists, and every flag it gives is one that
// the program's --help lists (for a script: one its source text holds).
// Lines ending in a backslash are joined; values (DIR, <...>, …) are not flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;

// One logical command line of a code block: backslash continuations joined,
// line = where it starts in its file (1-based).
struct DocCommand {
  std::string file;
  int line = 0;
  std::string text;
};

bool is_shell_block(const std::string& info) {
  std::string lang = info.substr(0, info.find_first_of(" \t{"));
  static const std::set<std::string> kShell = {"", "sh", "bash", "shell", "console", "zsh"};
  return kShell.count(lang) > 0;
}

// The command lines of every shell code block of one Markdown text: fenced
// blocks whose info string is empty or names a shell (a `text` or `python`
// block is skipped), and indented blocks (four spaces after a blank line).
std::vector<DocCommand> extract_commands(const std::string& file, const std::string& markdown) {
  std::vector<std::string> lines;
  std::istringstream in(markdown);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(l);
  }
  static const std::regex kFence(R"(^ {0,3}(`{3,}|~{3,})\s*(.*)$)");
  std::vector<DocCommand> out;
  std::string fence;  // the open fence, empty outside a fenced block
  bool shell = false, indented = false, prev_blank = true;
  DocCommand pending;  // a command whose last line ended in a backslash
  auto flush = [&] {
    if (!pending.text.empty()) out.push_back(pending);
    pending = DocCommand{};
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    std::smatch m;
    bool code = false;
    std::string body;
    if (!fence.empty()) {
      if (std::regex_match(l, m, kFence) && m[1].str()[0] == fence[0] &&
          m[1].length() >= static_cast<long>(fence.size()) && m[2].length() == 0) {
        fence.clear();
        flush();
      } else if (shell) {
        code = true;
        body = l;
      }
    } else if (std::regex_match(l, m, kFence)) {
      flush();
      fence = m[1];
      shell = is_shell_block(m[2]);
      indented = false;
    } else if (l.rfind("    ", 0) == 0 && (prev_blank || indented)) {
      indented = true;
      code = true;
      body = l.substr(4);
    } else if (!l.empty() && l.find_first_not_of(" \t") != std::string::npos) {
      indented = false;
    }
    prev_blank = l.find_first_not_of(" \t") == std::string::npos;
    if (!code) {
      if (fence.empty()) flush();
      continue;
    }
    std::string t = body;
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
    bool continued = !t.empty() && t.back() == '\\';
    if (continued) t.pop_back();
    if (pending.text.empty()) {
      pending.file = file;
      pending.line = static_cast<int>(i) + 1;
    }
    if (!pending.text.empty()) t = " " + t.substr(std::min(t.find_first_not_of(" \t"), t.size()));
    pending.text += t;
    if (!continued) flush();
  }
  flush();
  return out;
}

// Marks a word that starts with a quote: a value, never a flag or a program.
constexpr char kQuoted = '\x01';

// Shell words of one command line, split into the simple commands that |, ||,
// &&, ; and & separate; quotes removed, a # that starts a word ends the line,
// redirections dropped.
std::vector<std::vector<std::string>> split_commands(const std::string& s) {
  std::vector<std::vector<std::string>> cmds(1);
  std::string word;
  bool in_word = false;
  auto end_word = [&] {
    if (in_word) cmds.back().push_back(word);
    word.clear();
    in_word = false;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\'' || c == '"') {
      size_t close = s.find(c, i + 1);
      if (close == std::string::npos) close = s.size();
      if (!in_word) word += kQuoted;
      word += s.substr(i + 1, close - i - 1);
      in_word = true;
      i = close;
    } else if (c == ' ' || c == '\t') {
      end_word();
    } else if (c == '#' && !in_word) {
      break;
    } else if (c == '|' || c == ';' || c == '&') {
      end_word();
      while (i + 1 < s.size() && (s[i + 1] == '|' || s[i + 1] == '&')) ++i;
      cmds.emplace_back();
    } else {
      word += c;
      in_word = true;
    }
  }
  end_word();
  for (auto& cmd : cmds) {  // redirections: `> f`, `2>&1`, `<f`
    std::vector<std::string> kept;
    for (size_t k = 0; k < cmd.size(); ++k) {
      static const std::regex kRedirect(R"(^[0-9]*[<>]+&?.*$)");
      if (std::regex_match(cmd[k], kRedirect)) {
        if (cmd[k].find_first_not_of("0123456789<>&") == std::string::npos) ++k;
        continue;
      }
      kept.push_back(cmd[k]);
    }
    cmd = kept;
  }
  return cmds;
}

// Flags a --help text lists: on each option line (two to four spaces, then a
// dash), every -x / --name in the part before the description.
std::set<std::string> flags_of_help(const std::string& help) {
  std::set<std::string> flags;
  std::istringstream in(help);
  static const std::regex kOptionLine(R"(^ {1,4}-.*$)");
  static const std::regex kFlag(R"((^|[\s,\[])(--?[A-Za-z][A-Za-z0-9_-]*))");
  for (std::string l; std::getline(in, l);) {
    if (!std::regex_match(l, kOptionLine)) continue;
    size_t start = l.find('-');
    size_t gap = l.find("  ", start);
    std::string spec = l.substr(0, gap);
    for (std::sregex_iterator it(spec.begin(), spec.end(), kFlag), end; it != end; ++it)
      flags.insert((*it)[2]);
  }
  return flags;
}

// A word that names an option: a dash, then a letter (-1 and - are values).
bool is_flag(const std::string& w) {
  return w.size() >= 2 && w[0] == '-' &&
         (std::isalpha(static_cast<unsigned char>(w[1])) ||
          (w[1] == '-' && w.size() > 2 && std::isalpha(static_cast<unsigned char>(w[2]))));
}

std::string flag_name(std::string w) {
  size_t eq = w.find('=');
  if (eq != std::string::npos) w.resize(eq);
  while (!w.empty() && (w.back() == ']' || w.back() == ',' || w.back() == ')')) w.pop_back();
  return w;
}

std::string basename_of(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// What the check knows about the programs: the flags of each built program and
// of launch/ncf_launch (from --help), and the repository to find scripts in.
struct Programs {
  std::string source_dir;
  std::map<std::string, std::set<std::string>> flags;  // ncf_dist -> {--data_dir, ...}
  std::map<std::string, std::string> missing;          // program -> why it has no flags
};

Programs load_programs(const std::string& source_dir) {
  Programs p;
  p.source_dir = source_dir;
  for (std::string name : {"ncf_prep", "ncf_dist", "ncf_recommend", "ncf_export", "ncf_launch"}) {
    std::string path = name == "ncf_launch" ? source_dir + "/launch/ncf_launch" : test::bin(name);
    if (!fs::exists(path)) {
      p.missing[name] = "there is no " + path;
      continue;
    }
    auto r = test::run(path + " --help");
    std::set<std::string> f = flags_of_help(r.output);
    if (r.exit_code != 0 || f.empty()) {
      p.missing[name] = path + " --help exited " + std::to_string(r.exit_code) +
                        " listing no flags:\n" + r.output;
      continue;
    }
    p.flags[name] = f;
  }
  return p;
}

// One finding per unknown program, missing script or flag a program does not
// list, as "FILE:LINE: message".
struct CheckResult {
  std::vector<std::string> findings;
  std::map<std::string, int> uses;  // program or script -> commands checked
};

void check_args(const DocCommand& c, const std::string& program, const std::set<std::string>& ok,
                const std::vector<std::string>& args, CheckResult* out) {
  for (const std::string& a : args) {
    if (a == "--") break;
    std::string w = a;
    if (!w.empty() && w[0] == '[') w.erase(0, 1);
    if (!is_flag(w)) continue;
    std::string f = flag_name(w);
    if (!ok.count(f))
      out->findings.push_back(c.file + ":" + std::to_string(c.line) + ": " + program + ": " + f +
                              " is not a flag `" + program + " --help` lists, in: " + c.text);
  }
}

bool is_program_word(const std::string& w) {
  static const std::regex kProgram(R"(^([A-Za-z0-9_./~$-]*/)?ncf_[A-Za-z0-9_]+$)");
  return std::regex_match(w, kProgram);
}

bool is_script_word(const std::string& w) {
  static const std::regex kScript(R"(^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\.(sh|py|sbatch)$)");
  return std::regex_match(w, kScript);
}

// Checks one program (at words[k]) and its arguments; for ncf_launch also the
// program after its `--`.
void check_program(const DocCommand& c, const Programs& p, const std::vector<std::string>& words,
                   size_t k, CheckResult* out) {
  const std::string where = c.file + ":" + std::to_string(c.line) + ": ";
  std::string name = basename_of(words[k]);
  std::vector<std::string> args(words.begin() + k + 1, words.end());
  if (name == "ncf_launch" && words[k].find('/') != std::string::npos &&
      !fs::exists(p.source_dir + "/" + words[k])) {
    out->findings.push_back(where + "there is no " + words[k] + " in the repository");
    return;
  }
  static const std::regex kBuildDir(R"(^(\$[A-Za-z_{}]+/)?build[A-Za-z0-9_-]*/src/$)");
  std::string dir = words[k].substr(0, words[k].size() - name.size());
  if (name != "ncf_launch" && !dir.empty() && !std::regex_match(dir, kBuildDir)) {
    out->findings.push_back(where + words[k] + ": the build puts " + name +
                            " in build/src/ (or build-*/src/), in: " + c.text);
    return;
  }
  auto f = p.flags.find(name);
  if (f == p.flags.end()) {
    auto m = p.missing.find(name);
    out->findings.push_back(where + words[k] + ": " +
                            (m != p.missing.end()
                                 ? m->second
                                 : std::string("no such program in the build "
                                               "(ncf_prep, ncf_dist, ncf_recommend, "
                                               "ncf_export, launch/ncf_launch)")) +
                            ", in: " + c.text);
    return;
  }
  ++out->uses[name];
  check_args(c, name, f->second, args, out);
  if (name != "ncf_launch") return;
  auto dd = std::find(args.begin(), args.end(), "--");
  if (dd == args.end() || dd + 1 == args.end()) {
    out->findings.push_back(where + "ncf_launch without `-- PROGRAM`, in: " + c.text);
    return;
  }
  size_t child = static_cast<size_t>(dd - args.begin()) + k + 2;
  if (is_program_word(words[child])) check_program(c, p, words, child, out);
}

// Checks a script of the repository: it exists, and each flag given to it
// appears in its text (scripts have no common --help).
void check_script(const DocCommand& c, const Programs& p, const std::vector<std::string>& words,
                  size_t k, CheckResult* out) {
  const std::string where = c.file + ":" + std::to_string(c.line) + ": ";
  std::string path = p.source_dir + "/" + words[k];
  if (!fs::exists(path)) {
    out->findings.push_back(where + "there is no " + words[k] +
                            " in the repository, in: " + c.text);
    return;
  }
  ++out->uses[words[k]];
  std::string text = test::read_file(path);
  for (size_t i = k + 1; i < words.size(); ++i) {
    if (words[i] == "--") break;
    if (!is_flag(words[i])) continue;
    std::string f = flag_name(words[i]);
    if (text.find(f) == std::string::npos)
      out->findings.push_back(where + words[k] + ": " + f + " appears nowhere in " + words[k] +
                              ", in: " + c.text);
  }
}

void check_command(const DocCommand& c, const Programs& p, CheckResult* out) {
  for (const auto& words : split_commands(c.text)) {
    for (size_t k = 0; k < words.size(); ++k) {
      if (is_script_word(words[k])) {
        check_script(c, p, words, k, out);
        break;
      }
      if (is_program_word(words[k])) {
        check_program(c, p, words, k, out);
        break;
      }
    }
  }
}

CheckResult check_markdown(const std::string& file, const std::string& markdown,
                           const Programs& p) {
  CheckResult r;
  for (const auto& c : extract_commands(file, markdown)) check_command(c, p, &r);
  return r;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

class DocCommands : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { programs_ = new Programs(load_programs(NCF_SOURCE_DIR)); }
  static void TearDownTestSuite() {
    delete programs_;
    programs_ = nullptr;
  }
  static Programs* programs_;
};
Programs* DocCommands::programs_ = nullptr;

TEST_F(DocCommands, ProgramsListTheirFlags) {
  for (const auto& [name, why] : programs_->missing) ADD_FAILURE() << name << ": " << why;
  EXPECT_TRUE(programs_->flags["ncf_dist"].count("--data_dir"));
  EXPECT_TRUE(programs_->flags["ncf_prep"].count("--output"));
  EXPECT_TRUE(programs_->flags["ncf_prep"].count("-o"));
  EXPECT_TRUE(programs_->flags["ncf_launch"].count("-np"));
  EXPECT_TRUE(programs_->flags["ncf_launch"].count("--hosts"));
  EXPECT_FALSE(programs_->flags["ncf_dist"].count("--learning"));
}

// The check itself: README.md and every page of docs/.
TEST_F(DocCommands, ReadmeAndDocsNameOnlyRealProgramsAndFlags) {
  const std::string root = NCF_SOURCE_DIR;
  std::vector<std::string> files = {"README.md"};
  std::vector<std::string> pages;
  for (const auto& e : fs::directory_iterator(root + "/docs"))
    if (e.path().extension() == ".md") pages.push_back("docs/" + e.path().filename().string());
  std::sort(pages.begin(), pages.end());
  files.insert(files.end(), pages.begin(), pages.end());
  CheckResult all;
  for (const auto& f : files) {
    CheckResult r = check_markdown(f, test::read_file(root + "/" + f), *programs_);
    all.findings.insert(all.findings.end(), r.findings.begin(), r.findings.end());
    for (const auto& [k, n] : r.uses) all.uses[k] += n;
  }
  EXPECT_TRUE(all.findings.empty()) << joined(all.findings);
  std::string summary;
  for (const auto& [k, n] : all.uses) summary += " " + k + " " + std::to_string(n);
  std::printf("checked in %zu files:%s\n", files.size(), summary.c_str());
  // The extraction found the commands at all (a broken parser passes nothing).
  for (std::string name : {"ncf_prep", "ncf_dist", "ncf_recommend", "ncf_export", "ncf_launch"})
    EXPECT_GT(all.uses[name], 0) << "no command of " << name << " found in README.md or docs/";
  EXPECT_GT(all.uses["scripts/run_main.sh"], 0);
  EXPECT_GT(all.uses["scripts/run_tests.sh"], 0);
}

// The check fails where it should: a misspelled flag (also on a continuation
// line, also after ncf_launch's --), a misspelled program, a missing script.
TEST_F(DocCommands, MisspelledFlagProgramOrScriptIsReported) {
  const std::string doc =
      "# A page\n"
      "\n"
      "```sh\n"
      "build/src/ncf_dist --data_dir data/small \\\n"
      "    --preset ncf-paper --train_epoch 10     # the flag is --train_epochs\n"
      "mpirun -np 2 build/src/ncf_prep --synthetic small --ouput data/small\n"
      "launch/ncf_launch --hots h1:8 -np 2 -- ncf_recommend --checkpoint ckpt --topk=5 --user 1\n"
      "build/src/ncf_dsit --data_dir data/small\n"
      "bash scripts/no_such_script.sh\n"
      "bash bench/fuzz.sh --tiem 600\n"
      "bulid/src/ncf_prep --verify data/small\n"
      "```\n";
  CheckResult r = check_markdown("bad.md", doc, *programs_);
  std::vector<std::string> want = {"bad.md:4: ncf_dist: --train_epoch is not",
                                   "bad.md:6: ncf_prep: --ouput is not",
                                   "bad.md:7: ncf_launch: --hots is not",
                                   "bad.md:7: ncf_recommend: --user is not",
                                   "bad.md:8: build/src/ncf_dsit: no such program",
                                   "bad.md:9: there is no scripts/no_such_script.sh",
                                   "bad.md:10: bench/fuzz.sh: --tiem appears nowhere",
                                   "bad.md:11: bulid/src/ncf_prep: the build puts"};
  ASSERT_EQ(r.findings.size(), want.size()) << joined(r.findings);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(r.findings[i].rfind(want[i], 0), 0u) << r.findings[i] << "\nwanted: " << want[i];
}

// What is a command and what is a value: joined continuations, comments,
// placeholders, quoted values, env prefixes, pipes, and blocks that are not
// shell are left alone.
TEST_F(DocCommands, ValuesPlaceholdersAndOtherBlocksAreNotFlags) {
  const std::string doc =
      "Text that mentions build/src/ncf_dist --not_checked in prose.\n"
      "\n"
      "```sh\n"
      "build/src/ncf_prep --input DIR --output <out> --eval_negatives 99   # --bogus in a comment\n"
      "NCF_X=1 build/src/ncf_recommend --checkpoint ckpt --data_dir … --users '-a,--b' \\\n"
      "    --output - | head -n 3 > top.csv 2>&1\n"
      "sudo tests/cluster/sim_cluster.sh --dir /var/tmp/c --hosts 2 start\n"
      "build/src/ncf_dist --data_dir=data/small --seed -1 ...\n"
      "```\n"
      "\n"
      "```text\n"
      "ncf_dist --whatever: output, not a command\n"
      "```\n"
      "\n"
      "    build/src/ncf_export --checkpoint ckpt --format npy --output out\n";
  auto cmds = extract_commands("ok.md", doc);
  ASSERT_EQ(cmds.size(), 5u);
  EXPECT_EQ(cmds[1].line, 5);
  EXPECT_NE(cmds[1].text.find("--output -"), std::string::npos) << cmds[1].text;
  EXPECT_EQ(cmds[4].line, 15);
  CheckResult r = check_markdown("ok.md", doc, *programs_);
  EXPECT_TRUE(r.findings.empty()) << joined(r.findings);
  EXPECT_EQ(r.uses["ncf_prep"], 1);
  EXPECT_EQ(r.uses["ncf_recommend"], 1);
  EXPECT_EQ(r.uses["ncf_dist"], 1);
  EXPECT_EQ(r.uses["ncf_export"], 1);
  EXPECT_EQ(r.uses["tests/cluster/sim_cluster.sh"], 1);
}

// docs/daily_retraining.md's example, its first shell block as written, run
// in a scratch directory where build/ and scripts/ are this checkout's: the
// page promises that CI runs it.
TEST(DailyRetraining, TheDocumentedCommandsRun) {
  const std::string doc =
      test::read_file(std::string(NCF_SOURCE_DIR) + "/docs/daily_retraining.md");
  const size_t begin = doc.find("```sh\n");
  ASSERT_NE(begin, std::string::npos) << "no sh block in docs/daily_retraining.md";
  const size_t end = doc.find("```\n", begin + 6);
  ASSERT_NE(end, std::string::npos);
  const std::string block = doc.substr(begin + 6, end - begin - 6);
  ASSERT_NE(block.find("--extend"), std::string::npos);
  ASSERT_NE(block.find("--init_from"), std::string::npos);
  ASSERT_NE(block.find("--since"), std::string::npos);
  test::TempDir dir;
  const fs::path build = fs::path(NCF_BIN_DIR).parent_path();
  fs::create_directory_symlink(build, dir.path() + "/build");
  fs::create_directory_symlink(fs::path(NCF_SOURCE_DIR) / "scripts", dir.path() + "/scripts");
  test::write_file(dir.path() + "/example.sh", "set -euo pipefail\n" + block);
  const test::RunResult r = test::run("cd " + dir.path() + " && bash example.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warm start from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(--max_users 2800)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lineage checked against the parent"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ncf
