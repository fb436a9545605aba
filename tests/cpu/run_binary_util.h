// Helpers for tests that drive the built `mxlab` binary (MXLAB_BINARY) and compare the HDF5
// run files it writes: temporary directories, fork/exec with an optional signal after a delay,
// and bit-for-bit comparison of groups, datasets and attributes (NaN-aware).
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5file.h"

namespace mxlab::testutil {

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(msg("test: cannot write ", path));
}

inline bool file_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
inline int count_of(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

// A fresh directory under the test temp dir, unique per test and process (ctest runs tests in
// parallel). Left behind on purpose: a failing test's files are evidence.
inline std::string make_temp_dir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();  // null in SetUpTestSuite
  std::string test = info ? std::string(info->test_suite_name()) + "_" + info->name() : "suite";
  for (char& c : test)
    if (c == '/') c = '_';  // parametrized tests are named Prefix/Suite.Name/Param
  std::string tmpl = ::testing::TempDir() + "/mxlab_" + test + "_" + tag + "_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw Error(msg("test: mkdtemp failed for ", tmpl));
  return buf.data();
}

struct Proc {
  int exit_code = -1;  // -1 when killed by a signal
  int term_signal = 0;  // the signal that killed it, 0 if it exited
  std::string output;   // stdout and stderr together
  double wall_s = 0.0;
};

// The binary the tests drive: the build's (MXLAB_BINARY, compiled in), or $MXLAB_TEST_BINARY when
// set: test binaries carried to another machine (bench/pack_devbin.sh's .devbin sets it to the
// mxlab carried beside them) run where the build's path does not exist.
inline std::string mxlab_binary() {
  const char* e = std::getenv("MXLAB_TEST_BINARY");
  return e && *e ? std::string(e) : std::string(MXLAB_BINARY);
}

// Runs mxlab_binary() with `args` (and `env`, "NAME=value" entries added to its environment).
// `signal_when` (optional) is polled every millisecond from the start; when it returns true,
// `sig` is sent to the process (once). A process that finished before the signal is reported as
// finished.
inline Proc run_mxlab(const std::vector<std::string>& args, const std::function<bool(double elapsed_s)>& signal_when = {},
                      int sig = SIGKILL, const std::vector<std::string>& env = {}) {
  const std::string log = make_temp_dir("log") + "/out.txt";
  std::string bin = mxlab_binary();
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("test: fork failed");
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    for (const std::string& e : env) {
      const auto eq = e.find('=');
      ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
    }
    std::vector<char*> argv;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  int status = 0;
  bool signalled = false;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, signal_when ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0) throw Error("test: waitpid failed");
    if (!signalled && signal_when(elapsed())) {
      ::kill(pid, sig);
      signalled = true;
    }
    if (signalled) {
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Proc p;
  p.wall_s = elapsed();
  if (WIFEXITED(status)) p.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) p.term_signal = WTERMSIG(status);
  p.output = slurp(log);
  return p;
}

// Every attribute of an object as text (strings as is, numbers as their exact bits).
inline std::map<std::string, std::string> attrs_of(const h5::H5File& f, const std::string& path,
                                                   const std::set<std::string>& skip = {}) {
  std::map<std::string, std::string> out;
  const h5::H5Object o = f.object(path);
  for (const std::string& name : o.attr_names()) {
    if (skip.count(name)) continue;
    std::string v;
    try {
      for (const std::string& s : o.get_attr_strings(name)) v += s + "\x1f";
    } catch (const Error&) {
      for (double d : o.get_attr_doubles(name)) {
        uint64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        v += std::isnan(d) ? std::string("nan,") : std::to_string(bits) + ",";
      }
    }
    out[name] = v;
  }
  return out;
}

inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

// Datasets of group `ga` in file `a` against group `gb` in file `b`, bit for bit: the same
// dataset names, shapes, values and attributes. Rows whose step is below `from_step` are
// skipped on both sides (a branch compared with the baseline after `at`); `loss_all` (one
// value per step from the trajectory's start) is then compared over the common tail.
inline void expect_same_group(const h5::H5File& a, const std::string& ga, const h5::H5File& b, const std::string& gb,
                              int64_t from_step = -1, const std::set<std::string>& skip_group_attrs = {}) {
  SCOPED_TRACE(a.path() + ":" + ga + " vs " + b.path() + ":" + gb);
  ASSERT_EQ(a.list_datasets(ga), b.list_datasets(gb));
  EXPECT_EQ(attrs_of(a, ga, skip_group_attrs), attrs_of(b, gb, skip_group_attrs));
  const std::vector<int64_t> sa = a.read_int64s(ga + "/step"), sb = b.read_int64s(gb + "/step");
  size_t ra = 0, rb = 0;  // first row compared
  while (ra < sa.size() && sa[ra] < from_step) ++ra;
  while (rb < sb.size() && sb[rb] < from_step) ++rb;
  ASSERT_EQ(std::vector<int64_t>(sa.begin() + ra, sa.end()), std::vector<int64_t>(sb.begin() + rb, sb.end()));
  for (const std::string& d : a.list_datasets(ga)) {
    const std::string pa = ga + "/" + d, pb = gb + "/" + d;
    EXPECT_EQ(attrs_of(a, pa), attrs_of(b, pb)) << d;
    const std::vector<uint64_t> shape_a = a.dataset_shape(pa), shape_b = b.dataset_shape(pb);
    ASSERT_EQ(shape_a.size(), shape_b.size()) << d;
    const size_t width = shape_a.size() > 1 ? shape_a[1] : 1;
    if (shape_a.size() > 1) {
      ASSERT_EQ(shape_a[1], shape_b[1]) << d;
    }
    const std::vector<double> va = a.read_doubles(pa), vb = b.read_doubles(pb);
    size_t skip_a = ra * width, skip_b = rb * width;
    if (d == "loss_all") {  // per step: align the tails
      const size_t n = std::min(va.size(), vb.size());
      if (from_step < 0) {
        ASSERT_EQ(va.size(), vb.size()) << d;
      }
      skip_a = va.size() - n;
      skip_b = vb.size() - n;
    }
    ASSERT_EQ(va.size() - skip_a, vb.size() - skip_b) << d;
    for (size_t i = 0; i + skip_a < va.size(); ++i)
      ASSERT_TRUE(same_bits(va[skip_a + i], vb[skip_b + i]))
          << d << "[" << i << "]: " << va[skip_a + i] << " vs " << vb[skip_b + i];
  }
}

// Whole run files: the same groups under trajectories/ and branches/, each identical
// (expect_same_group), and the same root attributes apart from wall-clock times.
inline void expect_same_run_files(const std::string& path_a, const std::string& path_b) {
  const h5::H5File a(path_a, h5::H5File::Mode::read), b(path_b, h5::H5File::Mode::read);
  // A resumed run clears `error` (the message of a failed attempt) to "": absent and empty agree.
  // `restart_reason` says why a file that was there was replaced (not part of the result).
  const std::set<std::string> skip = {"start_time", "end_time", "error", "restart_reason"};
  EXPECT_EQ(attrs_of(a, "/", skip), attrs_of(b, "/", skip));
  for (const h5::H5File* f : {&a, &b})
    if (f->has_attr("/", "error")) {
      EXPECT_EQ(f->get_attr_string("/", "error"), "") << f->path();
    }
  for (const char* top : {"trajectories", "branches"}) {
    ASSERT_EQ(a.is_group(top), b.is_group(top)) << top;
    if (!a.is_group(top)) continue;
    ASSERT_EQ(a.list_groups(top), b.list_groups(top)) << top;
    for (const std::string& g : a.list_groups(top)) expect_same_group(a, std::string(top) + "/" + g, b, std::string(top) + "/" + g);
  }
}

// The one run file (<run_id>.h5) in `dir` ("" if there is none or several).
inline std::string run_file_in(const std::string& dir) {
  std::string found;
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".h5") == 0) {
        found = dir + "/" + name;
        ++n;
      }
    }
    ::closedir(d);
  }
  return n == 1 ? found : "";
}

// `mxlab run EXP --out OUT_DIR --device cpu --quiet`, and in *file the one run file it wrote;
// a fatal test failure when the run fails or leaves no single run file (call it under
// ASSERT_NO_FATAL_FAILURE). `extra`: more options of `mxlab run` (e.g. --keep-checkpoints all).
inline void train_cpu(const std::string& exp, const std::string& out_dir, std::string* file,
                      const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"run", exp, "--out", out_dir, "--device", "cpu", "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  const Proc p = run_mxlab(args);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  *file = run_file_in(out_dir);
  ASSERT_FALSE(file->empty()) << "no single run file in " << out_dir;
}

inline std::string root_str(const std::string& path, const std::string& name) {
  const h5::H5File f(path, h5::H5File::Mode::read);
  return f.get_attr_string("/", name);
}

}  // namespace mxlab::testutil
