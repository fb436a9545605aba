// Plain-text tables for the CLI (plan, run reports, summarize): left-aligned columns
// separated by two spaces, no trailing blanks.
#pragma once
#include <string>
#include <vector>

namespace mxlab {

std::string aligned_table(const std::vector<std::vector<std::string>>& rows);

}  // namespace mxlab
