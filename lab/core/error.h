// Errors. User input problems throw mxlab::Error with a message that says what to do;
// `main` prints it on one line and exits non-zero. Internal invariants use MXLAB_ASSERT.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mxlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Build a message from stream-able parts: throw Error(msg("bad block size ", k)).
template <typename... Args>
std::string msg(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& what);

}  // namespace mxlab

#define MXLAB_ASSERT(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) ::mxlab::assert_fail(#cond, __FILE__, __LINE__, ::mxlab::msg("" __VA_ARGS__)); \
  } while (0)
