// Atomic file writes (see atomic_file.h).
#include "concord/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

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

namespace {

namespace fs = std::filesystem;

// The pid of an entry named "<prefix><pid>" or "<prefix><pid>.old", or -1 for other names.
long temporary_writer_pid(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return -1;
  std::string_view rest = name.substr(prefix.size());
  long pid = 0;
  size_t digits = 0;
  for (; digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9'; ++digits) {
    pid = pid * 10 + (rest[digits] - '0');
    if (pid > 1'000'000'000) return -1;
  }
  rest.remove_prefix(digits);
  return digits > 0 && (rest.empty() || rest == ".old") ? pid : -1;
}

bool writer_runs(long pid) {
  return pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// Replaces `target` by `fresh` atomically where the file system can exchange two names; `fresh`
// then holds the old folder, to be deleted.
void exchange_into_place(const fs::path& fresh, const fs::path& target) {
  if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return;
  // No exchange (an old kernel or file system): move the old one aside, then the new one in.
  fs::path aside = fresh;
  aside += ".old";
  fs::rename(target, aside);
  fs::rename(fresh, target);
  fs::rename(aside, fresh);
}

}  // namespace

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, "cannot open the folder");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(dir, "fsync failed");
}

void remove_stale_temporaries(const fs::path& dir, std::string_view prefix) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const long pid = temporary_writer_pid(entry.path().filename().string(), prefix);
    if (pid >= 0 && !writer_runs(pid)) fs::remove_all(entry.path(), ec);
  }
}

void write_directory_atomic(const fs::path& target, const std::function<void(const fs::path&)>& fill) {
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = target.filename().string() + ".tmp-";
  const fs::path tmp = parent / fmt::format("{}{}", prefix, ::getpid());
  try {
    remove_stale_temporaries(parent, prefix);
    fs::create_directory(tmp);
    fill(tmp);
    fsync_directory(tmp);
    if (fs::exists(target)) {
      exchange_into_place(tmp, target);
      fs::remove_all(tmp);
    } else {
      fs::rename(tmp, target);
    }
    fsync_directory(parent);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw InputError(fmt::format("[write] {}: {}", target.string(), e.what()));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace concord::io
