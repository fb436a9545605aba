// Text of the tables that read a results directory back (summarize, index.csv, export):
// the cells of text and CSV tables, CSV quoting, the two number formats, atomic writes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

// The shortest decimal that reads back to the same double, spelled like Python's repr():
// fixed notation for exponents in [-4, 16), else d.ddde+XX; integral values keep ".0".
std::string shortest_repr(double v);

// One CSV field, quoted (RFC 4180) when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s);
// The fields joined by commas, with a newline.
std::string csv_line(const std::vector<std::string>& cells);

// The number format of `mxlab export`: a value that is a float32 number with %.9g, which reads
// back to the same float32; any other double with %.17g; nan, inf, -inf as such.
std::string csv_number(double v);

// A duration in seconds as m:ss or h:mm:ss (rounded to the second); "?" when it is negative,
// not a number, or above 1e8 s (an estimate that means nothing).
std::string format_duration(double seconds);

// Writes `text` to `path` through a temp file in the same directory and rename(2).
void write_text_atomically(const std::string& path, const std::string& text);

// Cells of the summary tables. Text: floats to kTextFloatDigits significant digits, "-" for
// none. CSV: floats as shortest_repr, empty for none, -1 for "no such step".
struct TableCell {
  static constexpr int kTextFloatDigits = 4;
  bool csv;
  std::string none() const { return csv ? "" : "-"; }
  std::string step(int64_t s) const;
  std::string num(double v) const;
  std::string text(const std::string& s) const { return s.empty() ? none() : s; }
};

}  // namespace mxlab
