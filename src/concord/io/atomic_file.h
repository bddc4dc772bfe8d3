// Atomic file writes: write to a temporary file in the same folder, fsync, rename over the
// target. A reader sees the old file or the new one, never a torn one; a killed writer leaves
// at most a stray "<name>.tmp.<pid>" file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace concord::io {

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// An open temporary file that becomes `path` on commit(); removed if never committed.
class AtomicWriter {
 public:
  explicit AtomicWriter(std::filesystem::path path);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t size);
  void commit();  // flush, fsync, rename; throws InputError on failure naming the file

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace concord::io
