// Helpers shared by the CPU tests: a scratch directory removed at the end of the test,
// reading a whole file, and running a shell command to capture its exit status and output.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

namespace mxlab::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "mxlab_test") {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
  // Write `text` to `name` (relative; parent folders are created) and return its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = path / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};

// The whole content of a file ("" if it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command; returns its exit status (-1 if it did not exit normally) and its
// combined stdout + stderr.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace mxlab::test
