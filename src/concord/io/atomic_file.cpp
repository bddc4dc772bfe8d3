// Atomic file writes (see atomic_file.h).
#include "concord/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "concord/numerics/check.h"

namespace concord::io {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw InputError("[write] " + path.string() + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

AtomicWriter::AtomicWriter(std::filesystem::path path) : path_(std::move(path)) {
  temp_ = path_;
  temp_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(temp_, "cannot create");
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicWriter::write(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(temp_, "write failed");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicWriter::commit() {
  if (::fsync(fd_) != 0) fail(temp_, "fsync failed");
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail(temp_, "close failed");
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail(path_, "rename failed");
  committed_ = true;
  // Make the rename itself durable.
  const std::filesystem::path dir = path_.has_parent_path() ? path_.parent_path() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  AtomicWriter w(path);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  AtomicWriter w(path);
  w.write(text.data(), text.size());
  w.commit();
}

}  // namespace concord::io
