// Text cells shared by the run driver, the sweep runner and the readers of a results directory
// (lab/io/table_text.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lab/io/table_text.h"

namespace mxlab {
namespace {

TEST(TableText, DurationsReadAsMinutesOrHours) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(59.4), "0:59");
  EXPECT_EQ(format_duration(59.5), "1:00");
  EXPECT_EQ(format_duration(3599), "59:59");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(90061), "25:01:01");
  EXPECT_EQ(format_duration(1e8), "27777:46:40");
}

TEST(TableText, DurationsThatMeanNothingAreAQuestionMark) {
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(format_duration(1.0000001e8), "?");
}

}  // namespace
}  // namespace mxlab
