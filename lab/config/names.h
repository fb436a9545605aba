// Names of trajectories: the FP32 trajectory, the MX arms and the intervention branches. A name
// becomes an HDF5 group (trajectories/<name>, branches/<name>, snapshots/<name>), an entry of a
// checkpoint and a part of the paths `mxlab export` writes (a directory of its own with --npy),
// so every name that enters mxlab - `arms[].name`, `interventions[].name` and `.from`, `mxlab
// branch --name` and `--from` - passes the one check here, and `mxlab export` checks the names
// it reads back from a file the same way before it builds a path from them.
#pragma once
#include <cstddef>
#include <string>

namespace mxlab {

constexpr const char* kFp32Name = "fp32";      // the FP32 trajectory, trajectories/fp32
constexpr const char* kDefaultArmName = "mx";  // the one arm of a run without `arms:`, trajectories/mx
constexpr size_t kMaxNameLength = 64;

// Why `name` is not a plain name, as the rest of a sentence that starts with the quoted name
// ("starts with '.': ..."); empty when it is one. Plain: 1 to kMaxNameLength letters, digits,
// '_', '-' and '.', not starting with '.' (so never '.' or '..': a name is a directory on export).
std::string plain_name_problem(const std::string& name);
// The reserved names stand for a kind of trajectory: kFp32Name for the FP32 trajectory,
// kDefaultArmName for an arm. What an arm may be called: a plain name other than kFp32Name
// (kDefaultArmName is allowed: an arm named so is an arm, like the default one).
std::string arm_name_problem(const std::string& name);
// What a branch may be called: a plain name other than kFp32Name and kDefaultArmName.
std::string branch_name_problem(const std::string& name);
// `name` in single quotes for a message: its first 40 characters ("..." when longer), bytes
// that are not printable as \xNN, so that the message stays one line.
std::string quoted_name(const std::string& name);

}  // namespace mxlab
