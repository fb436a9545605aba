// A scratch directory for one test, removed at the end of it (shared by the CPU tests).
#pragma once
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>

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

}  // namespace mxlab::test
