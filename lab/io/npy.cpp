// .npy reader/writer (see npy.h). The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// parsed here by a small hand-written scanner: only the three keys NumPy always writes.
#include "lab/io/npy.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "lab/core/error.h"
#include "lab/io/out_file.h"

namespace mxlab {

namespace {

// Header text as it may appear in a one-line message: a damaged header can hold newlines and
// binary bytes (when its terminator is gone, the data runs into it), so trailing padding is
// dropped and the rest goes through excerpt() (lab/core/error.h), a header being longer than
// the usual quoted value.
std::string printable(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && (text[end - 1] == ' ' || text[end - 1] == '\n')) --end;
  return excerpt(text.substr(0, end), 160);
}

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// NumPy pads the header so the data starts at a multiple of this (it uses 64 since 1.16).
constexpr size_t kHeaderAlign = 64;
constexpr size_t kMaxV1HeaderLen = 65535;

// Why an array of this rank cannot be exchanged with NumPy, or "" (rank 1 to kNpyMaxDims).
std::string rank_problem(size_t rank) {
  if (rank <= kNpyMaxDims) return "";
  return msg("the array has ", rank, " dimensions, more than the ", kNpyMaxDims,
             " every NumPy can load (NumPy 1 stops at 32, NumPy 2 at 64): reshape it to ", kNpyMaxDims,
             " dimensions or fewer");
}

// A readable name for a NumPy dtype string, for error messages.
std::string dtype_name(const std::string& descr) {
  if (descr.size() < 2) return "'" + descr + "'";
  const std::string t = descr.substr(1);
  const char* name = nullptr;
  if (t == "f2") name = "float16";
  else if (t == "f4") name = "float32";
  else if (t == "f8") name = "float64";
  else if (t == "f16") name = "longdouble";
  else if (t == "i1") name = "int8";
  else if (t == "i2") name = "int16";
  else if (t == "i4") name = "int32";
  else if (t == "i8") name = "int64";
  else if (t == "u1") name = "uint8";
  else if (t == "u2") name = "uint16";
  else if (t == "u4") name = "uint32";
  else if (t == "u8") name = "uint64";
  else if (t == "b1") name = "bool";
  else if (t == "c8") name = "complex64";
  else if (t == "c16") name = "complex128";
  else if (t == "V2") name = "bfloat16 or raw 2-byte void";
  if (name == nullptr) return "'" + printable(descr) + "'";
  return std::string(name) + " ('" + descr + "')";
}

// Cursor over the header text.
struct Scanner {
  const std::string& s;
  size_t i;
  const std::string& what;

  void skip_ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(msg(what, ": malformed .npy header (", why, "): ", printable(s)));
  }
  bool eat(char c) {
    skip_ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(msg("expected '", c, "'"));
  }
  std::string quoted() {
    skip_ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) fail("expected a quoted string");
    const char q = s[i++];
    const size_t start = i;
    while (i < s.size() && s[i] != q) ++i;
    if (i >= s.size()) fail("unterminated string");
    return s.substr(start, i++ - start);
  }
  std::string word() {
    skip_ws();
    const size_t start = i;
    while (i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(start, i - start);
  }
  int64_t integer() {
    skip_ws();
    const size_t start = i;
    int64_t v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      const int d = s[i] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - d) / 10) fail("dimension too large");
      v = v * 10 + d;
      ++i;
    }
    if (i == start) fail("expected a non-negative integer dimension");
    if (i < s.size() && s[i] == 'L') ++i;  // Python 2 long suffix
    return v;
  }
  // Skip one value we do not interpret (e.g. a structured dtype list), balancing brackets.
  void skip_value() {
    skip_ws();
    int depth = 0;
    while (i < s.size()) {
      const char c = s[i];
      if (c == '\'' || c == '"') {
        quoted();
        continue;
      }
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) return;
        --depth;
      }
      if (c == ',' && depth == 0) return;
      ++i;
    }
  }
};

uint32_t read_le(const std::string& b, size_t at, int n) {
  uint32_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<size_t>(k)]);
  return v;
}

}  // namespace

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t NpyArray::rows() const {
  if (shape.empty()) return 0;
  int64_t r = 1;
  for (size_t k = 0; k + 1 < shape.size(); ++k) r *= shape[k];
  return r;
}

NpyArray parse_npy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    throw Error(msg(what, ": not a NumPy .npy file (missing the \\x93NUMPY magic); save the array with numpy.save"));
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, header_at = 0;
  if (major == 1) {
    header_len = read_le(bytes, 8, 2);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error(msg(what, ": truncated .npy file (header length cut off)"));
    header_len = read_le(bytes, 8, 4);
    header_at = 12;
  } else {
    throw Error(msg(what, ": unsupported .npy format version ", major, ".", static_cast<int>(bytes[7]),
                    " (mxlab reads versions 1.0, 2.0 and 3.0)"));
  }
  if (bytes.size() < header_at + header_len)
    throw Error(msg(what, ": truncated .npy file (header says ", header_len, " header bytes, file has ",
                    bytes.size() - header_at, ")"));
  const std::string header = bytes.substr(header_at, header_len);

  Scanner sc{header, 0, what};
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  std::vector<int64_t> shape;
  sc.expect('{');
  while (!sc.eat('}')) {
    const std::string key = sc.quoted();
    sc.expect(':');
    if (key == "descr") {
      sc.skip_ws();
      if (sc.i < header.size() && header[sc.i] == '[')
        throw Error(msg(what, ": holds a structured dtype; mxlab needs a plain float32 array"));
      descr = sc.quoted();
      have_descr = true;
    } else if (key == "fortran_order") {
      const std::string w = sc.word();
      if (w != "True" && w != "False") sc.fail("fortran_order is neither True nor False");
      fortran = w == "True";
      have_order = true;
    } else if (key == "shape") {
      sc.expect('(');
      while (!sc.eat(')')) {
        shape.push_back(sc.integer());
        if (!sc.eat(',')) {
          sc.expect(')');
          break;
        }
      }
      have_shape = true;
    } else {
      sc.skip_value();
    }
    if (!sc.eat(',')) {
      sc.expect('}');
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    sc.fail("missing one of 'descr', 'fortran_order', 'shape'");

  bool swap = false;
  if (descr == "<f4") {
    swap = false;
  } else if (descr == ">f4") {
    swap = true;
  } else {
    throw Error(msg(what, ": dtype is ", dtype_name(descr),
                    ", mxlab needs float32 ('<f4'): convert with x.astype(numpy.float32)"));
  }
  if (fortran)
    throw Error(msg(what, ": array is in Fortran (column-major) order; save numpy.ascontiguousarray(x) instead"));
  if (shape.empty())
    throw Error(msg(what, ": array has rank 0 (a scalar); mxlab needs rank >= 1"));
  if (const std::string problem = rank_problem(shape.size()); !problem.empty()) throw Error(msg(what, ": ", problem));

  NpyArray a;
  a.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d)
      throw Error(msg(what, ": shape too large"));
    n *= d;
  }
  const size_t data_at = header_at + header_len;
  const size_t need = static_cast<size_t>(n) * sizeof(float);
  const size_t have = bytes.size() - data_at;
  if (have < need)
    throw Error(msg(what, ": truncated .npy file (shape needs ", need, " data bytes, file has ", have, ")"));
  if (have > need)
    throw Error(msg(what, ": .npy file has ", have - need, " bytes after the data its header describes (corrupt?)"));
  a.data.resize(static_cast<size_t>(n));
  if (n > 0) std::memcpy(a.data.data(), bytes.data() + data_at, need);
  if (swap) {
    for (float& f : a.data) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      u = (u >> 24) | ((u >> 8) & 0xFF00u) | ((u << 8) & 0xFF0000u) | (u << 24);
      std::memcpy(&f, &u, 4);
    }
  }
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(msg("cannot open '", path, "' for reading: ", std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(msg("error reading '", path, "'"));
  return parse_npy(ss.str(), "'" + path + "'");
}

std::string encode_npy(const std::vector<int64_t>& shape, const float* data) {
  if (const std::string problem = rank_problem(shape.size()); !problem.empty())
    throw Error(msg("cannot write a .npy file: ", problem));
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0) throw Error(msg("encode_npy: negative dimension ", shape[k]));
    dict += std::to_string(shape[k]);
    if (k + 1 < shape.size() || shape.size() == 1) dict += ",";
    if (k + 1 < shape.size()) dict += " ";
    n *= shape[k];
  }
  dict += "), }";
  // Version 1.0 has a 2-byte header length; fall back to 2.0 (4 bytes) for huge headers.
  int major = 1;
  size_t prefix = kMagicLen + 2 + 2;
  size_t total = prefix + dict.size() + 1;  // + '\n'
  size_t padded = (total + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
  if (padded - prefix > kMaxV1HeaderLen) {
    major = 2;
    prefix = kMagicLen + 2 + 4;
    total = prefix + dict.size() + 1;
    padded = (total + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
  }
  const size_t header_len = padded - prefix;
  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(major);
  out += static_cast<char>(0);
  const int len_bytes = major == 1 ? 2 : 4;
  for (int k = 0; k < len_bytes; ++k) out += static_cast<char>((header_len >> (8 * k)) & 0xFFu);
  out += dict;
  out.append(padded - total, ' ');
  out += '\n';
  const size_t nbytes = static_cast<size_t>(n) * sizeof(float);
  const size_t at = out.size();
  out.resize(at + nbytes);
  if (nbytes) std::memcpy(&out[at], data, nbytes);
  return out;
}

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  const std::string bytes = encode_npy(shape, data);
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  {
    const int fd = create_fresh_file(tmp, path);  // never through a link (lab/io/out_file.h)
    size_t off = 0;
    int err = 0;
    while (off < bytes.size() && err == 0) {
      const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) err = w < 0 ? errno : EIO;
      else off += static_cast<size_t>(w);
    }
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) {
      std::remove(tmp.c_str());
      throw_io_error("write", path, err);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw_io_error("write", path, err);
  }
}

}  // namespace mxlab
