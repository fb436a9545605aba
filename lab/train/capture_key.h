// The capture key of a trainer step that logs nothing (Backend::replay / begin_capture /
// end_capture, CUDA graphs on the GPU): such a step runs the ops of exactly its live
// trajectories, plus the shadow pass or not, so a recording may be replayed only for the very
// same set. The set is kept whole (every trajectory, however many arms and branches a run has)
// and mapped to an int: equal sets get equal keys, different sets different keys.
#pragma once
#include <cstddef>
#include <map>
#include <vector>

namespace mxlab {

class StepCaptureKeys {
 public:
  // The first key handed out in a process; below it lie the keys of `mxlab bench`'s own
  // regions, and the curvature instrument's are negative (lab/model/curvature.h).
  static constexpr int kFirstKey = 1 << 16;

  // The key of an unlogged step with the shadow pass or not and live[i] telling whether
  // trajectory i trains. Equal for an equal (shadow, live) of this object; distinct from every
  // other set's, and from every key of any other StepCaptureKeys object of the process (two
  // trainers on one backend never share a recording, whose buffers are the other's).
  int key(bool shadow, const std::vector<bool>& live);
  size_t size() const { return keys_.size(); }  // distinct sets seen so far
  bool seen(bool shadow, const std::vector<bool>& live) const;  // has key() been asked for this set

 private:
  std::map<std::vector<bool>, int> keys_;  // [shadow, live...] -> key
};

}  // namespace mxlab
