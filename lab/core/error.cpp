// Internal-invariant failures: a bug in mxlab, not bad input.
#include "lab/core/error.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mxlab {

void assert_fail(const char* expr, const char* file, int line, const std::string& what) {
  throw std::logic_error(msg("internal error (please report): ", expr, " failed at ", file, ":", line,
                             what.empty() ? "" : ": ", what));
}

std::string io_message(const std::string& verb, const std::string& path, int err) {
  const char* cause;
  const char* fix;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      cause = err == ENOSPC ? "no space left on device" : "disk quota exceeded";
      fix = "free space on that file system, or write somewhere else";
      break;
    case EROFS: cause = "read-only file system"; fix = "write to a writable directory"; break;
    case EACCES:
    case EPERM: cause = "permission denied"; fix = "write to a directory you may write to"; break;
    case ENOENT: cause = "no such file or directory"; fix = "check the path"; break;
    case ELOOP:
      cause = "it is a symbolic link";
      fix = "mxlab writes no file through a link inside its output directories: remove the link";
      break;
    default: cause = std::strerror(err); fix = "check the file system"; break;
  }
  return msg("cannot ", verb, " ", path, ": ", cause, " (", fix, ")");
}

std::string excerpt(const std::string& text, size_t max_chars) {
  // Cut at a character boundary: never in the middle of a UTF-8 sequence.
  size_t cut = text.size();
  if (cut > max_chars) {
    cut = max_chars;
    for (int back = 0; back < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80; ++back) --cut;
  }
  std::string out;
  out.reserve(cut + 8);
  for (size_t i = 0; i < cut; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {  // a whole UTF-8 character passes; any other byte is shown as \xHH
      const size_t len = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
      bool ok = len > 0 && i + len <= cut && !(c >= 0xF8);
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
      if (ok) {
        out.append(text, i, len);
        i += len - 1;
        continue;
      }
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut < text.size()) out += msg("... (", text.size(), " bytes)");
  return out;
}

std::string quoted_excerpt(const std::string& text, size_t max_chars) {
  const std::string e = excerpt(text, max_chars);
  if (text.size() <= max_chars) return "'" + e + "'";
  // 'abc...' (N bytes): the length outside the quotes.
  const size_t dots = e.rfind("... (");
  return "'" + e.substr(0, dots + 3) + "'" + e.substr(dots + 3);
}

std::string one_line_message(const std::string& message) { return excerpt(message, 2000); }

void throw_io_error(const std::string& verb, const std::string& path, int err) {
  throw IoError(io_message(verb, path, err), path, err);
}

}  // namespace mxlab
