// kernels/capture_guard.cuh (host logic only, no GPU): a capture in one thread keeps another
// thread's resource calls out until it ends; captures of several threads may overlap; sections
// nest within a thread, and a section inside the thread's own capture does not deadlock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kernels/capture_guard.cuh"

namespace {

using mxlab::cuda::CaptureHold;
using mxlab::cuda::ResourceSection;

// Another thread that takes a ResourceSection and then sets `entered`.
std::thread enter_section_in_another_thread(std::atomic<bool>& entered) {
  return std::thread([&entered] {
    ResourceSection rs;
    entered = true;
  });
}

TEST(CaptureGuard, AnotherThreadsResourceCallWaitsForTheCaptureToEnd) {
  CaptureHold capture;
  capture.acquire();
  std::atomic<bool> entered{false};
  std::thread other = enter_section_in_another_thread(entered);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(entered.load()) << "a resource section ran while another thread was capturing";
  capture.release();
  other.join();
  EXPECT_TRUE(entered.load());
}

TEST(CaptureGuard, ACaptureWaitsForAnotherThreadsResourceCall) {
  std::atomic<bool> in_section{false}, leave{false}, captured{false};
  std::thread other([&] {
    ResourceSection rs;
    in_section = true;
    while (!leave) std::this_thread::yield();
  });
  while (!in_section) std::this_thread::yield();
  std::thread capturer([&] {
    CaptureHold capture;
    capture.acquire();
    captured = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(captured.load()) << "a capture began inside another thread's resource section";
  leave = true;
  other.join();
  capturer.join();
  EXPECT_TRUE(captured.load());
}

TEST(CaptureGuard, CapturesOfTwoThreadsOverlap) {
  CaptureHold mine;
  mine.acquire();
  std::atomic<bool> theirs{false};
  std::thread other([&] {
    CaptureHold capture;
    capture.acquire();
    theirs = true;
  });
  other.join();  // would hang if captures excluded each other
  EXPECT_TRUE(theirs.load());
  mine.release();
}

TEST(CaptureGuard, SectionsNestAndReleaseTheGuard) {
  {
    ResourceSection outer;
    ResourceSection inner;  // would deadlock on a non-recursive lock taken twice
  }
  {
    CaptureHold capture;
    capture.acquire();
    capture.acquire();      // idempotent
    ResourceSection inside;  // this thread's own capture: no lock (the call is refused anyway)
    EXPECT_TRUE(capture.held());
  }  // the hold's destructor releases it
  std::atomic<bool> entered{false};
  std::thread other = enter_section_in_another_thread(entered);
  other.join();  // would hang if any of the above had left the guard taken
  EXPECT_TRUE(entered.load());
}

}  // namespace
