// CUDA graph capture beside other threads of the same process (mxlab run --jobs N with two
// runs on one GPU, each in its own thread with its own backend).
//
// A capture in thread-local mode only forbids unsafe calls in the capturing thread, but calls
// that synchronise the whole device still invalidate a capture in progress on that device,
// whichever thread makes them: cudaFree (an implicit device synchronisation), and with it the
// other allocation and resource calls. The capture then fails later, at an unrelated launch, with
// "operation failed due to a previous error during capture" (GPU test
// ArmsGpu.RunsSharingOneGpuAtOnceWriteTheirBitsAlone saw it in about half of its runs).
//
// So: a capture holds the process-wide guard shared (several threads may capture at once), and
// every allocation, release, and stream / event / library-handle creation or destruction holds
// it exclusively (ResourceSection). Both nest within one thread: a ResourceSection inside another
// locks nothing more, and one inside this thread's own capture locks nothing (those calls are
// refused in a capture anyway: the guard must not deadlock on them).
#pragma once

#include <shared_mutex>

namespace mxlab::cuda {

inline std::shared_mutex& capture_guard_mutex() {
  static std::shared_mutex m;
  return m;
}
inline thread_local int t_captures_held = 0;   // CaptureHold acquired by this thread
inline thread_local int t_resource_depth = 0;  // nested ResourceSections of this thread

// Held from cudaStreamBeginCapture to cudaStreamEndCapture (or the capture's abandonment).
class CaptureHold {
 public:
  CaptureHold() = default;
  CaptureHold(const CaptureHold&) = delete;
  CaptureHold& operator=(const CaptureHold&) = delete;
  ~CaptureHold() { release(); }
  void acquire() {
    if (held_) return;
    capture_guard_mutex().lock_shared();
    held_ = true;
    ++t_captures_held;
  }
  void release() {
    if (!held_) return;
    held_ = false;
    --t_captures_held;
    capture_guard_mutex().unlock_shared();
  }
  bool held() const { return held_; }

 private:
  bool held_ = false;
};

// Around calls that may synchronise the device: no capture of another thread is in progress
// while it is held.
class ResourceSection {
 public:
  ResourceSection() {
    locks_ = t_resource_depth == 0 && t_captures_held == 0;
    ++t_resource_depth;
    if (locks_) capture_guard_mutex().lock();
  }
  ResourceSection(const ResourceSection&) = delete;
  ResourceSection& operator=(const ResourceSection&) = delete;
  ~ResourceSection() {
    --t_resource_depth;
    if (locks_) capture_guard_mutex().unlock();
  }

 private:
  bool locks_ = false;
};

}  // namespace mxlab::cuda
