// Checking up front that an output directory can be written, so that a command whose every
// output would fail the same way (a read-only or missing-permission directory) says so once,
// as an IoError naming the directory, before it starts any work.
#pragma once
#include <string>

namespace mxlab {

// Creates `dir` (and its parents) if missing and checks that a file can be created in it.
// Throws IoError (lab/core/error.h) naming the directory and the cause.
void ensure_writable_dir(const std::string& dir);

}  // namespace mxlab
