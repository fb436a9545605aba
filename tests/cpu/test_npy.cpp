// .npy reading and writing: round trips of several ranks, headers as NumPy writes them
// (versions 1.0, 2.0 and 3.0, big-endian float32), and every refusal (not .npy, wrong dtype,
// Fortran order, truncated, rank 0, malformed header) with a message that names the problem.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/npy.h"

using namespace mxlab;

namespace {

// Build a file image by hand: magic, version, header length, header text padded with spaces to
// a multiple of 64 and ended by '\n', then the data bytes.
std::string npy_image(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = 6 + 2 + (major == 1 ? 2 : 4);
  size_t total = prefix + dict.size() + 1;
  const size_t padded = (total + 63) / 64 * 64;
  std::string h = dict + std::string(padded - total, ' ') + "\n";
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const size_t len = h.size();
  for (int k = 0; k < (major == 1 ? 2 : 4); ++k) out += static_cast<char>((len >> (8 * k)) & 0xFF);
  return out + h + data;
}

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string error_of(const std::string& image) {
  try {
    parse_npy(image, "'t.npy'");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Npy, EncodeParseRoundTripAnyRank) {
  const std::vector<std::vector<int64_t>> shapes = {{5}, {2, 3}, {2, 1, 4}, {1, 2, 2, 3}, {0}, {3, 0}};
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f - 1.0f;
    const std::string img = encode_npy(shape, v.data());
    EXPECT_EQ(std::memcmp(img.data(), "\x93NUMPY\x01\x00", 8), 0);
    EXPECT_EQ((img.size() - v.size() * 4) % 64, 0u) << "data starts 64-byte aligned, as NumPy writes it";
    const NpyArray a = parse_npy(img, "x");
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.data, v);
    EXPECT_EQ(a.cols(), shape.back());
  }
  // The header text NumPy itself would write for these shapes.
  const float one = 1.0f;
  EXPECT_TRUE(contains(encode_npy({1}, &one), "'shape': (1,)"));
  EXPECT_TRUE(contains(encode_npy({1, 1}, &one), "'shape': (1, 1)"));
}

TEST(Npy, ReadsHeadersAsNumpyWritesThem) {
  const std::vector<float> v = {1.0f, -2.5f, 3.0f, 0.0f, 1e-40f, -0.0f};
  const NpyArray a = parse_npy(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", floats(v)), "x");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.rows(), 2);
  EXPECT_EQ(std::memcmp(a.data.data(), v.data(), 24), 0);
  // Version 2.0 (4-byte header length), key order and spacing differ, Python-2 long suffix.
  const NpyArray b = parse_npy(
      npy_image("{\"shape\":(6L,),\"fortran_order\":False,\"descr\":\"<f4\"}", floats(v), 2), "x");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(std::memcmp(b.data.data(), v.data(), 24), 0);
  // Version 3.0 (utf-8 header) reads like 2.0.
  EXPECT_EQ(parse_npy(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", floats(v), 3), "x").shape,
            (std::vector<int64_t>{6}));
  // Big-endian float32 is byte-swapped.
  std::string be = floats({1.0f, -2.0f});
  for (size_t i = 0; i < be.size(); i += 4) std::swap(be[i], be[i + 3]), std::swap(be[i + 1], be[i + 2]);
  const NpyArray c = parse_npy(npy_image("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", be), "x");
  EXPECT_EQ(c.data, (std::vector<float>{1.0f, -2.0f}));
}

TEST(Npy, RefusesWithClearMessages) {
  const std::string four = floats({1, 2, 3, 4});
  // Not .npy at all.
  EXPECT_TRUE(contains(error_of("hello, world, this is text"), "not a NumPy .npy file"));
  EXPECT_TRUE(contains(error_of(""), "not a NumPy .npy file"));
  // Wrong dtype: named, with the fix.
  const std::string f8 = error_of(npy_image("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", four));
  EXPECT_TRUE(contains(f8, "float64")) << f8;
  EXPECT_TRUE(contains(f8, "astype(numpy.float32)")) << f8;
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", four)),
                       "int32"));
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<f2', 'fortran_order': False, 'shape': (8,), }", four)),
                       "float16"));
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", four)),
                       "structured"));
  // Fortran order.
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four)),
                       "Fortran"));
  // Truncated data, truncated header, trailing bytes.
  const std::string t = error_of(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", four));
  EXPECT_TRUE(contains(t, "truncated")) << t;
  EXPECT_TRUE(contains(t, "24")) << "says how many bytes it needs: " << t;
  const std::string whole = npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four);
  EXPECT_TRUE(contains(error_of(whole.substr(0, 40)), "truncated"));
  EXPECT_TRUE(contains(error_of(whole + "xx"), "after the data"));
  // Rank 0, malformed header, unknown version.
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", four.substr(0, 4))),
                       "rank 0"));
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<f4', 'shape': (4,), }", four)), "malformed"));
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,), }", four)),
                       "malformed"));
  EXPECT_TRUE(contains(error_of(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (4,-1), }", four)),
                       "malformed"));
  std::string v9 = whole;
  v9[6] = 9;
  EXPECT_TRUE(contains(error_of(v9), "version 9"));
}

TEST(Npy, FilesAreWrittenAtomicallyAndMissingFilesNamed) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/mxlab_npy_test_" + std::to_string(static_cast<long>(::getpid())) + ".npy";
  const std::vector<float> v = {1.5f, 2.5f, -3.5f, 4.0f};
  write_npy(path, {2, 2}, v.data());
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.data, v);
  // Overwrite in place (same path as input is fine: the new file replaces the old by rename).
  const std::vector<float> w = {9.0f};
  write_npy(path, {1}, w.data());
  EXPECT_EQ(read_npy(path).data, w);
  std::remove(path.c_str());
  try {
    read_npy(dir + "/does_not_exist.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "does_not_exist.npy"));
  }
  // An output folder that does not exist: error, and no file.
  EXPECT_THROW(write_npy(dir + "/no_such_dir/x.npy", {1}, w.data()), Error);
}
