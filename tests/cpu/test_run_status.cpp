// RunStatus (lab/runs/run_status.h): its spellings are what run files, index.csv, summaries and
// sweep lines contain, so they are pinned here letter by letter; each value reads back from its
// spelling, and any other text is reported rather than taken for a status.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "lab/runs/run_status.h"

namespace mxlab {
namespace {

// Today's spellings. A rename changes what files and tables hold: it must fail here.
const std::vector<std::pair<RunStatus, std::string>> kSpellings = {
    {RunStatus::running, "running"},         {RunStatus::complete, "complete"},
    {RunStatus::diverged, "diverged"},       {RunStatus::failed, "failed"},
    {RunStatus::interrupted, "interrupted"}, {RunStatus::unreadable, "unreadable"},
    {RunStatus::skipped, "skipped"},         {RunStatus::busy, "busy"},
    {RunStatus::not_run, "not_run"},
};

TEST(RunStatus, SpellingsAreTodays) {
  ASSERT_EQ(std::size(kAllRunStatuses), kSpellings.size()) << "a status was added or removed: pin its spelling here";
  for (size_t i = 0; i < kSpellings.size(); ++i) {
    EXPECT_EQ(kAllRunStatuses[i], kSpellings[i].first) << i;
    EXPECT_EQ(std::string(to_string(kSpellings[i].first)), kSpellings[i].second);
  }
}

TEST(RunStatus, EveryValueRoundTripsThroughItsSpelling) {
  std::set<std::string> seen;
  for (RunStatus s : kAllRunStatuses) {
    const std::string text = to_string(s);
    EXPECT_TRUE(seen.insert(text).second) << "two statuses spell " << text;
    const std::optional<RunStatus> back = parse_run_status(text);
    ASSERT_TRUE(back.has_value()) << text;
    EXPECT_EQ(*back, s) << text;
    EXPECT_EQ(run_status_of(text), s) << text;
  }
}

TEST(RunStatus, UnknownTextIsReported) {
  for (const std::string& text : std::vector<std::string>{"", "Complete", "complete ", " complete", "done", "not run", "unknown", "RUNNING",
                                  std::string("complete\0", 9)}) {
    EXPECT_FALSE(parse_run_status(text).has_value()) << "'" << text << "'";
    EXPECT_THROW(run_status_of(text), std::logic_error) << "'" << text << "'";
  }
}

TEST(RunStatus, FinishedIsCompleteOrDiverged) {
  for (RunStatus s : kAllRunStatuses)
    EXPECT_EQ(is_finished(s), s == RunStatus::complete || s == RunStatus::diverged) << to_string(s);
}

}  // namespace
}  // namespace mxlab
