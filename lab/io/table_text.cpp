// Text of the tables that read a results directory back: number formats, CSV quoting, cells,
// atomic writes.
#include "lab/io/table_text.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "lab/core/error.h"
#include "lab/io/out_file.h"
#include "lab/io/locks.h"

namespace mxlab {

std::string shortest_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  int p = 1;
  for (; p < 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", p - 1, v);
  // buf: [-]d[.ddd]e[+-]XX
  std::string s = buf;
  const bool neg = s[0] == '-';
  if (neg) s = s.substr(1);
  const auto e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_line(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + csv_field(cells[i]);
  return line + "\n";
}

std::string TableCell::step(int64_t s) const { return s < 0 ? (csv ? "-1" : "-") : std::to_string(s); }

std::string TableCell::num(double v) const {
  if (std::isnan(v)) return none();
  if (csv) return shortest_repr(v);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", kTextFloatDigits, v);
  return buf;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  // A temp name of our own (host, pid, thread): processes sharing the directory never write
  // into each other's temp file; the last rename wins with a complete file.
  const std::string tmp = msg(path, ".tmp.", host_name(), ".", ::getpid(), ".",
                              std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const int fd = create_fresh_file(tmp, path);  // never through a link (lab/io/out_file.h)
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    std::remove(tmp.c_str());
    throw_io_error("write", path, e);
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    throw_io_error("write", path, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw_io_error("write", path, e);
  }
}

std::string csv_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  const float f = static_cast<float>(v);
  if (static_cast<double>(f) == v) std::snprintf(buf, sizeof buf, "%.9g", v);
  else std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const long v = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (v >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", v / 3600, (v / 60) % 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", v / 60, v % 60);
  return buf;
}

}  // namespace mxlab
