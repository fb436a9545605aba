// TensorBoard event files, written by hand (no protobuf library): records framed as TFRecord
// (little-endian uint64 length, masked CRC-32C of the length, the data, masked CRC-32C of the
// data) holding `Event` protocol buffers. Only what scalar plots need is encoded:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record of a file is the Event with file_version "brain.Event:2".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab::tfevents {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes; crc32c("123456789") is
// 0xE3069283.
uint32_t crc32c(const void* data, size_t size);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);
// One TFRecord: length, masked CRC of the length, `data`, masked CRC of `data`.
std::string frame_record(const std::string& data);

// The encoded Event that opens a file (file_version "brain.Event:2").
std::string file_version_event(double wall_time);
// The encoded Event of one step with scalar summaries (tag, value); values are stored as float,
// as TensorBoard's simple_value is.
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& values);

// Collects the records of one event file.
class EventFile {
 public:
  explicit EventFile(double wall_time);  // starts with the file_version event
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& bytes() const { return bytes_; }

 private:
  double wall_time_;
  std::string bytes_;
};

}  // namespace mxlab::tfevents
