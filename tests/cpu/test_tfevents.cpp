// TensorBoard event files written by hand (lab/io/tfevents.h): CRC-32C against published
// vectors, TFRecord's masked CRC, and whole records byte for byte against what TensorBoard's own
// writer (tensorboard.summary.writer.record_writer with event_pb2) produces for the same events.
#include <gtest/gtest.h>

#include <string>

#include "lab/io/tfevents.h"

using namespace mxlab::tfevents;

TEST(TfEvents, Crc32cKnownVectors) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  // RFC 3720 (iSCSI), appendix B.4.
  std::string zeros(32, '\0'), ones(32, '\xff'), inc, dec;
  for (int i = 0; i < 32; ++i) {
    inc.push_back(static_cast<char>(i));
    dec.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), dec.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("", 0), 0u);
  // TensorBoard's masked_crc32c(b"123456789").
  EXPECT_EQ(masked_crc32c(check.data(), check.size()), 0xc78ab0e5u);
}

TEST(TfEvents, RecordsEqualTensorBoardsWriter) {
  // RecordWriter.write(Event(wall_time=1.5, file_version="brain.Event:2")) then
  // Event(wall_time=1.5, step=7, summary=[("loss", 0.25), ("a/b", -3.0)]).
  const std::string expected(
      "\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7f\x4b\x22\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x1a\x0d\x62\x72\x61"
      "\x69\x6e\x2e\x45\x76\x65\x6e\x74\x3a\x32\x2a\x28\x64\x6c\x26\x00\x00\x00\x00\x00\x00\x00\x73\x4f\xe3\x00"
      "\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x10\x07\x2a\x19\x0a\x0b\x0a\x04\x6c\x6f\x73\x73\x15\x00\x00\x80\x3e"
      "\x0a\x0a\x0a\x03\x61\x2f\x62\x15\x00\x00\x40\xc0\x3e\xb8\x19\xf9",
      94);
  EventFile f(1.5);
  f.add_scalars(7, {{"loss", 0.25}, {"a/b", -3.0}});
  EXPECT_EQ(f.bytes(), expected);
  // A step with nothing to log writes no record.
  f.add_scalars(8, {});
  EXPECT_EQ(f.bytes().size(), 94u);
  // The framing alone: length, masked CRC of the length, data, masked CRC of the data.
  const std::string rec = frame_record("abc");
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(rec.substr(0, 8), std::string("\x03\x00\x00\x00\x00\x00\x00\x00", 8));
  EXPECT_EQ(rec.substr(12, 3), "abc");
}
