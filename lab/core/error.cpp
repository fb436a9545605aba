// Internal-invariant failures: a bug in mxlab, not bad input.
#include "lab/core/error.h"

namespace mxlab {

void assert_fail(const char* expr, const char* file, int line, const std::string& what) {
  throw std::logic_error(msg("internal error (please report): ", expr, " failed at ", file, ":", line,
                             what.empty() ? "" : ": ", what));
}

}  // namespace mxlab
