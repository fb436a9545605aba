// Progress of `mxlab run` where nobody watches a terminal (nohup, Slurm, a pipe): plain lines
// every --progress-every seconds, one per active run, with the step, rate, ETA and the latest
// losses of FP32 and each arm; none with --quiet or --progress-every 0; and on a terminal the
// live line as before (carriage returns, no plain lines).
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "tests/cpu/test_util.h"

namespace {

using mxlab::test::TempDir;

// One run with two arms, long enough (about half a second on an idle core, seconds under load)
// for several lines at --progress-every 0.1 and refreshes of the live line (every 250 ms).
const char* const kYaml = R"(name: progress
steps: 800
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
data: {batch: 32}
log: {log_every: 10}
arms:
  - {name: mx}
  - {name: e5m2, set: {weight: mxfp8_e5m2}}
)";

// The plain progress lines of `out` (one per line, in order).
std::vector<std::string> plain_lines(const std::string& out) {
  static const std::regex line(R"(mxlab: \[0/1\] \S+ step \d+/800  [0-9.e+]+ steps/s  ETA \S.*  fp32 \S+  mx \S+  e5m2 \S+)");
  std::vector<std::string> found;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const std::string l = out.substr(start, end - start);
    if (std::regex_match(l, line)) found.push_back(l);
    start = end + 1;
  }
  return found;
}

std::string run_piped(const TempDir& dir, const std::string& args) {
  const std::string exp = dir.write("progress.yaml", kYaml);
  // stdout and stderr into a pipe (run_command): not a terminal.
  const auto [rc, out] = mxlab::test::run_command(std::string(MXLAB_BINARY) + " run " + exp + " --out " + dir.str() +
                                                  "/out " + args + " < /dev/null");
  EXPECT_EQ(rc, 0) << out;
  return out;
}

}  // namespace

TEST(PlainProgress, LinesEveryIntervalWhenStderrIsNotATerminal) {
  TempDir dir;
  const std::string out = run_piped(dir, "--progress-every 0.1");
  const std::vector<std::string> lines = plain_lines(out);
  ASSERT_GE(lines.size(), 2u) << out;
  // No live-line control sequences in a file.
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find("\033[K"), std::string::npos) << out;
  // The step moves on between lines.
  const std::regex step(R"(step (\d+)/)");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(lines.front(), a, step));
  ASSERT_TRUE(std::regex_search(lines.back(), b, step));
  EXPECT_LT(std::stoi(a[1]), std::stoi(b[1])) << out;
}

TEST(PlainProgress, NoneWithZeroIntervalOrQuiet) {
  for (const char* args : {"--progress-every 0", "--quiet --progress-every 0.1"}) {
    TempDir dir;
    const std::string out = run_piped(dir, args);
    EXPECT_TRUE(plain_lines(out).empty()) << args << "\n" << out;
    EXPECT_EQ(out.find(" starting\n"), std::string::npos) << args << "\n" << out;
  }
}

// On a terminal (a pseudo-terminal here), the live line as it was: redrawn in place with
// "\r\033[K", and no plain lines even with --progress-every.
TEST(PlainProgress, TerminalKeepsTheLiveLine) {
  TempDir dir;
  const std::string exp = dir.write("progress.yaml", kYaml);
  const std::string out_dir = dir.str() + "/out";
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0) << "forkpty failed";
  if (pid == 0) {
    std::string bin = MXLAB_BINARY;
    std::vector<std::string> args = {bin, "run", exp, "--out", out_dir, "--progress-every", "0.1"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      char buf[4096];
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) break;  // EIO once the child has exited and closed the terminal
      out.append(buf, static_cast<size_t>(n));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      break;
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("\r\033[K[0/1] "), std::string::npos) << out;
  EXPECT_TRUE(plain_lines(out).empty()) << out;
  EXPECT_EQ(out.find("mxlab: [0/1]"), std::string::npos) << out;
}
