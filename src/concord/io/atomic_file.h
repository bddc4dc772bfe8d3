// Atomic file and folder writes: write to a temporary in the same folder, fsync, rename over the
// target. A reader sees the old file (folder) or the new one, never a torn one; a killed writer
// leaves at most a stray "<name>.tmp.<pid>" file or "<name>.tmp-<pid>" folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
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

// Writes the folder `target` as a whole: fill(tmp) writes into the sibling "<name>.tmp-<pid>",
// which is fsynced and renamed to `target` (exchanged atomically with an existing `target`, which
// is then deleted). A folder named `target` is therefore always complete: a kill leaves the old
// one or the new one, plus at most a temporary that the next call for `target` deletes. The
// parent folder must exist (it is never created silently). When fill throws, the temporary is
// deleted and `target` is as it was; a file-system error is an InputError naming `target`.
void write_directory_atomic(const std::filesystem::path& target,
                            const std::function<void(const std::filesystem::path&)>& fill);

// Deletes the entries of `dir` named "<prefix><pid>" (or "<prefix><pid>.old") whose writer is
// this process (left by an earlier, failed call) or no longer runs.
void remove_stale_temporaries(const std::filesystem::path& dir, std::string_view prefix);

// fsync of a folder, so that renames inside it are durable; InputError naming it on failure.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace concord::io
