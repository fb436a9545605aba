// Capture keys of unlogged trainer steps (see capture_key.h).
#include "lab/train/capture_key.h"

#include <atomic>
#include <climits>

#include "lab/core/error.h"

namespace mxlab {

namespace {

std::atomic<int> g_next_key{StepCaptureKeys::kFirstKey};  // shared by every trainer of the process

std::vector<bool> whole_set(bool shadow, const std::vector<bool>& live) {
  std::vector<bool> set;
  set.reserve(live.size() + 1);
  set.push_back(shadow);
  set.insert(set.end(), live.begin(), live.end());
  return set;
}

}  // namespace

bool StepCaptureKeys::seen(bool shadow, const std::vector<bool>& live) const {
  return keys_.count(whole_set(shadow, live)) > 0;
}

int StepCaptureKeys::key(bool shadow, const std::vector<bool>& live) {
  std::vector<bool> set = whole_set(shadow, live);
  const auto it = keys_.find(set);
  if (it != keys_.end()) return it->second;
  const int k = g_next_key.fetch_add(1);
  MXLAB_ASSERT(k >= kFirstKey && k < INT_MAX, "capture keys exhausted");
  keys_.emplace(std::move(set), k);
  return k;
}

}  // namespace mxlab
