// The trajectory events of lab/stats/loss_events.h - the excursion (known when it happens), spikes,
// the tail log-ratio - on hand-worked loss series, the excursion's truncation property over
// random series, and its rule checks. results/stats_util.py holds the Python twins (the same
// hand-worked series in analysis/tests/test_events.py; analysis/tests/test_events_binary.py
// checks both agree on runs made by the binary).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "lab/core/error.h"
#include "lab/stats/loss_events.h"

using namespace mxlab;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// len(mins) constant blocks of `block` steps, block b at mins[b].
std::vector<float> blocks(std::initializer_list<float> mins, int block = 100) {
  std::vector<float> v;
  for (float m : mins) v.insert(v.end(), static_cast<size_t>(block), m);
  return v;
}

Excursion ex(const std::vector<float>& loss, int64_t first = 0, ExcursionRule r = {}) { return excursion(loss, first, r); }

void expect(const Excursion& e, bool event, int64_t step) {
  EXPECT_EQ(e.event, event);
  EXPECT_EQ(e.step, step);
}

}  // namespace

TEST(Excursion, HandWorkedSeries) {
  // Blocks 1.0, 0.5 | 6 x5: 6 > 10 x 0.5 for five blocks: event at block 2.
  expect(ex(blocks({1.0f, 0.5f, 6, 6, 6, 6, 6})), true, 200);
  expect(ex(blocks({1.0f, 0.5f, 6, 6, 6, 6, 6}), 1000), true, 1200);  // absolute steps
  // Four blocks above, then a recovery: no event; censored at 800 - 500.
  expect(ex(blocks({1.0f, 0.5f, 6, 6, 6, 6, 0.4f, 0.4f})), false, 300);
  // Exactly 10 x is not above.
  expect(ex(blocks({1.0f, 0.5f, 5, 5, 5, 5, 5})), false, 200);
  // The reference is the minimum of the blocks before the first of the run: 4.0 is not above 5,
  // so the run starts at block 3.
  expect(ex(blocks({1.0f, 0.5f, 4.0f, 6, 6, 6, 6, 6})), true, 300);
  // One low step is its block's minimum.
  std::vector<float> dip = blocks({1.0f, 0.5f, 6, 6, 6, 6, 6});
  dip[450] = 4.0f;
  expect(ex(dip), false, 200);
  // Block 0 has nothing before it.
  expect(ex(blocks({1, 1, 1, 1, 1, 1})), false, 100);
}

TEST(Excursion, WindowBlockAndFactor) {
  const std::vector<float> s = blocks({1.0f, 0.5f, 6, 6, 0.4f}, 10);
  expect(ex(s, 0, {10.0, 20, 10}), true, 20);
  expect(ex(s, 0, {10.0, 30, 10}), false, 20);
  expect(ex(s, 0, {20.0, 20, 10}), false, 30);
  // The rule is checked: a window that is not a positive multiple of the block, a block < 1, a
  // factor that is not a finite positive number.
  EXPECT_NE(excursion_rule_problem({10.0, 25, 10}).find("multiple of the block 10 (e.g. 30)"), std::string::npos);
  EXPECT_FALSE(excursion_rule_problem({10.0, 0, 10}).empty());
  EXPECT_FALSE(excursion_rule_problem({10.0, 10, 0}).empty());
  EXPECT_FALSE(excursion_rule_problem({0.0, 20, 10}).empty());
  EXPECT_FALSE(excursion_rule_problem({std::nan(""), 20, 10}).empty());
  EXPECT_TRUE(excursion_rule_problem({}).empty());
  EXPECT_THROW(ex(s, 0, {10.0, 25, 10}), Error);
}

TEST(Excursion, PartialBlocksShortSeriesAndNonFinite) {
  // The trailing partial block is not read.
  std::vector<float> s = blocks({1.0f, 0.5f, 6, 6, 6, 6});
  s.insert(s.end(), 50, 6.0f);
  expect(ex(s), false, 150);
  s.insert(s.end(), 50, 6.0f);
  expect(ex(s), true, 200);
  // Shorter than the window: censored at the first step.
  expect(ex(std::vector<float>(50, 1.0f), 7), false, 7);
  expect(ex({}), false, 0);
  // Non-finite losses count as above; a finite one is its block's minimum.
  expect(ex(blocks({1.0f, 0.5f, 6, kNaN, kInf, 6, 6})), true, 200);
  std::vector<float> holes = blocks({1.0f, 0.5f, 6, 6, 6, 6, 6});
  holes[301] = kNaN;
  expect(ex(holes), true, 200);
  // A history that ends non-finite (a stopped run) stays so: the event is at the first block
  // without a finite loss, after the run's last step when that block starts there.
  std::vector<float> stopped(250, 1.0f);
  stopped.push_back(kNaN);
  expect(ex(stopped), true, 300);
  std::vector<float> stopped2(200, 1.0f);
  stopped2.push_back(kNaN);
  expect(ex(stopped2), true, 200);
  // ... but a NaN from the first step has no finite reference.
  expect(ex({kNaN}), false, 0);
}

TEST(Excursion, SummarizeLossesReportsItAndTheSpikes) {
  // Spikes: 150 > 100 x 1 (step 2); 100 is not above 100 x 1; the NaN after 1.0 (step 6); the
  // NaN after a NaN and the 1.0 after it are not (their previous loss is not finite).
  const std::vector<float> s = {1.0f, 1.0f, 150.0f, 1.0f, 100.0f, 1.0f, kNaN, kNaN, 1.0f};
  LossSummary r = summarize_losses(s, 10, 10.0, 100.0);
  EXPECT_EQ(r.spike_count, 2);
  EXPECT_EQ(r.first_spike_step, 12);
  r = summarize_losses(s, 0, 10.0, 50.0);
  EXPECT_EQ(r.spike_count, 3);
  EXPECT_EQ(r.first_spike_step, 2);
  EXPECT_EQ(summarize_losses({1.0f, 1.0f}, 0, 10.0, 100.0).first_spike_step, -1);
  // The excursion under the rule it is given (and the default one).
  const std::vector<float> b = blocks({1.0f, 0.5f, 6, 6, 0.4f}, 10);
  r = summarize_losses(b, 5, 10.0, 100.0, {10.0, 20, 10});
  EXPECT_TRUE(r.excursion.event);
  EXPECT_EQ(r.excursion.step, 25);
  r = summarize_losses(b, 5, 10.0, 100.0);
  EXPECT_FALSE(r.excursion.event);
  EXPECT_EQ(r.excursion.step, 5);
  // The old rule, unchanged beside it: 6 does not stay above 5 to the end.
  EXPECT_EQ(r.divergence_step, -1);
}

TEST(TailLogRatio, HandWorked) {
  const std::vector<float> ref(10, 1.0f);
  const std::vector<float> arm = {1, 1, 1, 1, 1, 1, 2, 4, 8, 8};
  // Last 4 steps: log 2, log 4, log 8, log 8: median (log 4 + log 8) / 2.
  EXPECT_DOUBLE_EQ(tail_log_ratio(arm, 0, ref, 0, 4), (std::log(4.0) + std::log(8.0)) / 2);
  EXPECT_DOUBLE_EQ(tail_log_ratio(arm, 0, ref, 0, 3), std::log(8.0));
  // Steps are matched by number (a branch from step 5), only shared steps count.
  EXPECT_DOUBLE_EQ(tail_log_ratio(std::vector<float>(5, 2.0f), 5, ref, 0, 100), std::log(2.0));
  EXPECT_DOUBLE_EQ(tail_log_ratio(std::vector<float>(20, 3.0f), 0, ref, 0, 100), std::log(3.0));
  // An arm that stopped at a NaN counts as +inf up to the reference's last step.
  std::vector<float> stopped(8, 1.0f);
  stopped.push_back(kNaN);
  EXPECT_EQ(tail_log_ratio(stopped, 0, ref, 0, 3), std::numeric_limits<double>::infinity());  // 0 inf inf
  EXPECT_EQ(tail_log_ratio(stopped, 0, ref, 0, 4), std::numeric_limits<double>::infinity());  // (0 + inf) / 2
  EXPECT_EQ(tail_log_ratio(stopped, 0, ref, 0, 5), 0.0);                                      // 0 0 0 inf inf
  // Only the reference non-finite: -inf; both: 0; nothing shared: NaN.
  std::vector<float> ref_nan(10, 1.0f);
  ref_nan[9] = kNaN;
  EXPECT_EQ(tail_log_ratio(std::vector<float>(10, 1.0f), 0, ref_nan, 0, 1), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(tail_log_ratio({kNaN, kNaN, kNaN}, 0, {kNaN, kNaN, kNaN}, 0, 3), 0.0);
  EXPECT_TRUE(std::isnan(tail_log_ratio({}, 0, ref, 0, 100)));
}

// Truncating a series at any horizon H >= t + W leaves its event at t unchanged; truncated
// earlier, it is censored at H - W, before t (or, when the cut ends on a non-finite loss, which
// then counts as lasting, it may have an event of its own).
TEST(Excursion, TruncationPropertyOverRandomSeries) {
  std::mt19937_64 rng(29);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(rng); };
  int events = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t block = std::vector<int64_t>{1, 5, 10}[static_cast<size_t>(pick(0, 2))];
    const ExcursionRule rule{10.0, block * std::vector<int64_t>{1, 2, 5}[static_cast<size_t>(pick(0, 2))], block};
    const int64_t n = pick(1, 60 * block), first = pick(0, 1) * 37;
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      s[static_cast<size_t>(i)] = static_cast<float>(std::exp(-3.0 * static_cast<double>(i) / static_cast<double>(n)) * uni(1, 1.3));
    for (int64_t k = pick(0, 3); k > 0; --k) {  // excursions of random length and height
      const int64_t start = pick(0, n - 1), len = std::vector<int64_t>{pick(1, 3 * block), pick(1, 12 * block), n}[static_cast<size_t>(pick(0, 2))];
      const double height = std::vector<double>{5, 15, 50, 1e4}[static_cast<size_t>(pick(0, 3))];
      for (int64_t i = start; i < std::min(n, start + len); ++i)
        s[static_cast<size_t>(i)] = uni(0, 1) < 0.02 ? kNaN : static_cast<float>(s[static_cast<size_t>(i)] * height);
    }
    if (uni(0, 1) < 0.2) {  // a run that stops at a NaN
      s.resize(static_cast<size_t>(pick(1, n)));
      s.push_back(kNaN);
    }
    const Excursion full = excursion(s, first, rule);
    events += full.event;
    for (size_t h = 0; h <= s.size(); ++h) {
      const std::vector<float> cut(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(h));
      const Excursion e = excursion(cut, first, rule);
      const int64_t horizon = first + static_cast<int64_t>(h);
      if (full.event && horizon >= full.step + rule.window) {
        ASSERT_TRUE(e.event && e.step == full.step) << "trial " << trial << " h " << h;
      } else if (!e.event) {
        ASSERT_EQ(e.step, first + std::max<int64_t>(static_cast<int64_t>(h) - rule.window, 0));
        if (full.event) ASSERT_GT(full.step, e.step) << "trial " << trial << " h " << h;
      } else if (std::isfinite(cut.back())) {
        // An event seen in a cut is the series' event (a cut that ends on a non-finite loss
        // takes it to last, which the full series may contradict).
        ASSERT_TRUE(full.event && e.step == full.step) << "trial " << trial << " h " << h;
      }
    }
  }
  EXPECT_GT(events, 50);  // the generator makes excursions
}

// The window [from, until) of excursion_between and the branch endpoint built on it (E2 of
// results/prereg/why_mx.md), on hand-worked series of 10-step blocks under K = 10, W = 20 (two
// blocks above 10 x the minimum before them). results/stats_util.py holds the Python twins (the
// same series in analysis/tests/test_events.py).
namespace {
const ExcursionRule kSmall{10.0, 20, 10};
void expect_endpoint(const BranchEndpoint& e, bool at_risk, int64_t window_end, bool branch_event,
                     int64_t branch_step, bool control_event, int64_t control_step) {
  EXPECT_EQ(e.at_risk, at_risk);
  EXPECT_EQ(e.window_end, window_end);
  expect(e.branch, branch_event, branch_step);
  expect(e.control, control_event, control_step);
}
}  // namespace

TEST(ExcursionBetween, OnlyOnsetsInTheWindowCount) {
  // Blocks 1, 0.2, 3, 3, 3, 1: onsets at 20 (3, 3 > 2) and 30 (3, 3 > 2), none at 40 (3, 1).
  const std::vector<float> s = blocks({1.0f, 0.2f, 3, 3, 3, 1}, 10);
  expect(excursion_between(s, 0, 0, 1000, kSmall), true, 20);
  expect(excursion_between(s, 0, 21, 1000, kSmall), true, 30);  // the onset at 20 is before the window
  expect(excursion_between(s, 0, 31, 1000, kSmall), false, 40);  // 60 - 20 steps shown
  expect(excursion_between(s, 0, 21, 30, kSmall), false, 30);    // the onset at 30 is the window's end
  expect(excursion_between(s, 0, 50, 1000, kSmall), false, 50);  // not below `from`
  expect(excursion_between(s, 100, 130, 140, kSmall), true, 130);  // absolute steps
  // A series that ends non-finite stays so: its window is `until` whole.
  std::vector<float> stopped = blocks({1.0f, 0.2f, 1, 1}, 10);
  stopped.push_back(kNaN);
  expect(excursion_between(stopped, 0, 10, 60, kSmall), true, 40);
  expect(excursion_between(stopped, 0, 10, 40, kSmall), false, 40);
  expect(excursion_between(stopped, 0, 10, 100, kSmall), true, 40);
  EXPECT_THROW(excursion_between(s, 0, 0, 10, {10.0, 25, 10}), Error);
}

TEST(BranchEndpoint, AnEventOnlyTheParentsMinimumShows) {
  // Parent blocks 1, 0.2, 1, 1, 1, 1, 1, 1 (no excursion: 1 is not above 10 x 0.2); the branch
  // from step 30 stays at 3 for 50 steps. On its own it has no excursion (3 is not above 10 x 3);
  // joined to the parent's blocks before 30, the minimum before it is 0.2 and 3 > 2: an event at
  // 30. The control (the parent) has none: censored at the window's end 30 + 50 - 20 = 60.
  const std::vector<float> parent = blocks({1.0f, 0.2f, 1, 1, 1, 1, 1, 1}, 10);
  const std::vector<float> branch = blocks({3, 3, 3, 3, 3}, 10);
  expect(excursion(branch, 30, kSmall), false, 60);
  expect_endpoint(branch_endpoint(parent, branch, 30, 80, kSmall), true, 60, true, 30, false, 60);
}

TEST(BranchEndpoint, AParentExcursionBeforeTheBranchPointTakesThePairOut) {
  // The parent's excursion at 20 (5, 5 > 2) comes before the branch's step 30: not at risk.
  const std::vector<float> parent = blocks({1.0f, 0.2f, 5, 5, 1, 1, 1, 1}, 10);
  const std::vector<float> flat = blocks({1, 1, 1, 1, 1}, 10);
  expect_endpoint(branch_endpoint(parent, flat, 30, 80, kSmall), false, 60, false, 60, false, 60);
  // An onset before the branch's step on the joined series (block 2 of 3, 3, 3, ...: 20) is in
  // neither window, and the parent alone has none there (3, 1): at risk, the branch's onset at 30.
  const std::vector<float> parent2 = blocks({1.0f, 0.2f, 3, 1, 1, 1, 1, 1}, 10);
  expect(excursion(parent2, 0, kSmall), false, 60);
  expect_endpoint(branch_endpoint(parent2, blocks({3, 3, 3, 3, 3}, 10), 30, 80, kSmall), true, 60, true, 30, false, 60);
  // The control's event in the window: the parent's own excursion at 40.
  const std::vector<float> parent3 = blocks({1.0f, 0.2f, 1, 1, 5, 5, 5, 1}, 10);
  expect_endpoint(branch_endpoint(parent3, flat, 30, 80, kSmall), true, 60, false, 60, true, 40);
}

TEST(BranchEndpoint, CensoredAtItsEndMinusTheWindow) {
  // A branch of 50 steps from 30 (to 80) is censored at 60 = 30 + 50 - 20, even when an onset at
  // 60 itself (3, 3 in its last two blocks) is visible: the window is [at, at + N - W).
  const std::vector<float> parent = blocks({1.0f, 0.2f, 1, 1, 1, 1, 1, 1}, 10);
  const std::vector<float> late = blocks({1, 1, 1, 3, 3}, 10);
  std::vector<float> joined(parent.begin(), parent.begin() + 30);
  joined.insert(joined.end(), late.begin(), late.end());
  expect(excursion(joined, 0, kSmall), true, 60);
  expect_endpoint(branch_endpoint(parent, late, 30, 80, kSmall), true, 60, false, 60, false, 60);
  // A branch cut short (a run interrupted at 70, its last loss finite) shows less: [30, 50).
  const std::vector<float> cut(late.begin(), late.begin() + 40);
  expect_endpoint(branch_endpoint(parent, cut, 30, 80, kSmall), true, 50, false, 50, false, 50);
  // One that stopped on a NaN at its 12th step stays non-finite: its window is [30, 60) whole,
  // and the first block without a finite loss (50; 40 still holds a 1) gives the event.
  std::vector<float> stopped(11, 1.0f);
  stopped.push_back(kNaN);
  expect_endpoint(branch_endpoint(parent, stopped, 30, 80, kSmall), true, 60, true, 50, false, 60);
  // A parent shorter than the branch's step (it stopped before): no endpoint.
  EXPECT_THROW(branch_endpoint(std::vector<float>(20, 1.0f), late, 30, 80, kSmall), Error);
}
