#include "server/sandbox/owned_directory.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fitrun::server {
namespace {

std::atomic<bool> walk_for_testing{false};
// Cleared the first time the kernel answers ENOSYS (before 5.6).
std::atomic<bool> kernel_has_openat2{true};

// Closes a descriptor when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// The operation's rights: the owner's on this thread while alive, when there is an owner and
// fitrund can take its rights (it is root); fitrund's own otherwise.
class AsOwner {
 public:
  explicit AsOwner(const std::optional<UnixAccount>& owner) {
    if (owner.has_value() && CanRunAsOtherAccounts()) access_.emplace(*owner);
  }
  absl::Status status() const { return access_.has_value() ? access_->status() : absl::OkStatus(); }

 private:
  std::optional<FileAccessAs> access_;
};

std::string SysError(int error) { return std::strerror(error); }

// What a failed resolution of `relative` means, as a status naming the path.
absl::Status ResolveError(const std::string& dir, absl::string_view relative, int error) {
  const std::string path = absl::StrCat(dir, "/", relative);
  switch (error) {
    case ENOENT: return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    case ELOOP:
    case EXDEV:
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": a symlink on the way (fitrund follows none in a job's directory)"));
    case ENOTDIR:
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": a symlink or a file where a directory belongs (fitrund follows no symlink in a job's directory)"));
    default: return absl::InternalError(absl::StrCat(path, ": ", SysError(error)));
  }
}

absl::StatusOr<std::vector<std::string>> Components(absl::string_view relative) {
  std::vector<std::string> parts = absl::StrSplit(relative, '/');
  for (const std::string& part : parts) {
    if (part.empty() || part == "." || part == "..") {
      return absl::InvalidArgumentError(absl::StrCat("'", relative, "' is not a plain relative path"));
    }
  }
  return parts;
}

// Opens `relative` beneath `dir_fd` with `flags` (O_NOFOLLOW and O_CLOEXEC added) and no symlink
// anywhere on the way. Returns the descriptor or -errno.
int OpenBeneath(int dir_fd, const std::vector<std::string>& parts, int flags, mode_t mode = 0) {
  flags |= O_NOFOLLOW | O_CLOEXEC;
  if (!walk_for_testing.load() && kernel_has_openat2.load()) {
    const std::string joined = absl::StrJoin(parts, "/");
    open_how how{};
    how.flags = static_cast<uint64_t>(flags);
    how.mode = (flags & O_CREAT) != 0 ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    for (int tries = 0; tries < 8; ++tries) {
      const long fd = syscall(SYS_openat2, dir_fd, joined.c_str(), &how, sizeof(how));
      if (fd >= 0) return static_cast<int>(fd);
      // EAGAIN: a rename raced the lookup (RESOLVE_BENEATH checks for that); look again.
      if (errno == EAGAIN || errno == EINTR) continue;
      if (errno != ENOSYS) return -errno;
      kernel_has_openat2.store(false);
      break;
    }
    if (kernel_has_openat2.load()) return -EAGAIN;
  }
  // One O_NOFOLLOW directory descriptor per component: a symlink anywhere fails with ELOOP.
  ScopedFd current(dup(dir_fd));
  if (current.get() < 0) return -errno;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next = openat(current.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return -errno;
    current.reset(next);
  }
  const int fd = openat(current.get(), parts.back().c_str(), flags, mode);
  return fd >= 0 ? fd : -errno;
}

absl::Status WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(SysError(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

UntrustedFile& UntrustedFile::operator=(UntrustedFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

UntrustedFile::~UntrustedFile() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::string> UntrustedFile::ReadAt(int64_t offset, size_t max_bytes) const {
  std::string bytes(max_bytes, '\0');
  size_t filled = 0;
  while (filled < max_bytes) {
    const ssize_t n = pread(fd_, bytes.data() + filled, max_bytes - filled, static_cast<off_t>(offset + filled));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("reading: ", SysError(errno)));
    }
    if (n == 0) break;
    filled += static_cast<size_t>(n);
  }
  bytes.resize(filled);
  return bytes;
}

absl::StatusOr<UntrustedFile::Tail> UntrustedFile::ReadTail(size_t max_bytes) const {
  absl::StatusOr<int64_t> size = Size();
  if (!size.ok()) return size.status();
  Tail tail;
  tail.offset = std::max<int64_t>(0, *size - static_cast<int64_t>(max_bytes));
  absl::StatusOr<std::string> bytes = ReadAt(tail.offset, max_bytes);
  if (!bytes.ok()) return bytes.status();
  tail.bytes = *std::move(bytes);
  return tail;
}

absl::StatusOr<int64_t> UntrustedFile::Size() const {
  struct stat info {};
  if (fstat(fd_, &info) != 0) return absl::InternalError(absl::StrCat("fstat: ", SysError(errno)));
  return static_cast<int64_t>(info.st_size);
}

absl::StatusOr<OwnedDirectory> OwnedDirectory::Open(const std::string& path, const std::optional<UnixAccount>& owner,
                                                    bool create) {
  const size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' does not name a directory inside another"));
  }
  ScopedFd parent_fd(open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (parent_fd.get() < 0) return absl::InternalError(absl::StrCat("cannot open ", parent, ": ", SysError(errno)));
  if (owner.has_value()) {
    // Only a parent nobody else may write keeps the entry from being swapped for a symlink.
    struct stat info {};
    if (fstat(parent_fd.get(), &info) != 0) {
      return absl::InternalError(absl::StrCat("cannot stat ", parent, ": ", SysError(errno)));
    }
    if (info.st_uid != geteuid() || (info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          parent, " must belong to fitrund's user and be writable by it alone (it holds directories of ",
          "other accounts' jobs); fix its owner and mode"));
    }
  }
  bool made = false;
  if (create) {
    if (mkdirat(parent_fd.get(), name.c_str(), 0700) == 0) {
      made = true;
    } else if (errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot create ", path, ": ", SysError(errno)));
    }
  }
  ScopedFd fd(openat(parent_fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
    return ResolveError(parent, name, errno);
  }
  if (owner.has_value() && CanRunAsOtherAccounts()) {
    // On the descriptor: what was opened is what is given, whatever the name says by now.
    if (fchown(fd.get(), owner->uid, owner->gid) != 0 || fchmod(fd.get(), 0700) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot give ", path, " to Unix account ", owner->name, ": ", SysError(errno)));
    }
  } else if (made && fchmod(fd.get(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot set the mode of ", path, ": ", SysError(errno)));
  }
  return OwnedDirectory(fd.release(), path, owner);
}

OwnedDirectory::OwnedDirectory(OwnedDirectory&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), owner_(std::move(other.owner_)) {
  other.fd_ = -1;
}

OwnedDirectory& OwnedDirectory::operator=(OwnedDirectory&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    owner_ = std::move(other.owner_);
    other.fd_ = -1;
  }
  return *this;
}

OwnedDirectory::~OwnedDirectory() {
  if (fd_ >= 0) close(fd_);
}

void OwnedDirectory::UseDescriptorWalkForTesting(bool walk) { walk_for_testing.store(walk); }

absl::StatusOr<int> OwnedDirectory::OpenParentOf(absl::string_view relative, std::string* last) const {
  absl::StatusOr<std::vector<std::string>> parts = Components(relative);
  if (!parts.ok()) return parts.status();
  *last = parts->back();
  if (parts->size() == 1) {
    const int fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("dup: ", SysError(errno)));
    return fd;
  }
  parts->pop_back();
  const int fd = OpenBeneath(fd_, *parts, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ResolveError(path_, absl::StrJoin(*parts, "/"), -fd);
  return fd;
}

absl::Status OwnedDirectory::MakeDirectory(absl::string_view relative, mode_t mode) const {
  AsOwner as_owner(owner_);
  if (!as_owner.status().ok()) return as_owner.status();
  std::string last;
  absl::StatusOr<int> parent = OpenParentOf(relative, &last);
  if (!parent.ok()) return parent.status();
  ScopedFd parent_fd(*parent);
  if (mkdirat(parent_fd.get(), last.c_str(), mode) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", path_, "/", relative, ": ", SysError(errno)));
  }
  // Made now or before (by anyone): it must be a directory, not a symlink to one.
  ScopedFd made(openat(parent_fd.get(), last.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (made.get() < 0) return ResolveError(path_, relative, errno);
  return absl::OkStatus();
}

absl::Status OwnedDirectory::WriteFile(absl::string_view relative, absl::string_view contents, mode_t mode) const {
  AsOwner as_owner(owner_);
  if (!as_owner.status().ok()) return as_owner.status();
  std::string last;
  absl::StatusOr<int> parent = OpenParentOf(relative, &last);
  if (!parent.ok()) return parent.status();
  ScopedFd parent_fd(*parent);
  // A name nobody can have planted: O_EXCL fails on anything already there, symlinks included.
  std::random_device entropy;
  std::string temporary;
  ScopedFd out;
  for (int tries = 0; tries < 16 && out.get() < 0; ++tries) {
    temporary = absl::StrCat(".", last, ".tmp-", entropy(), entropy());
    out.reset(openat(parent_fd.get(), temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (out.get() < 0 && errno != EEXIST) break;
  }
  if (out.get() < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path_, "/", relative, ": ", SysError(errno)));
  }
  absl::Status status;
  // The umask does not apply to fchmod: the file gets exactly `mode`.
  if (fchmod(out.get(), mode) != 0) status = absl::InternalError(SysError(errno));
  if (status.ok()) status = WriteAll(out.get(), contents);
  if (status.ok() && fsync(out.get()) != 0) status = absl::InternalError(SysError(errno));
  if (status.ok() && close(out.release()) != 0) status = absl::InternalError(SysError(errno));
  // renameat replaces the name itself: a symlink planted there is replaced, never followed.
  if (status.ok() && renameat(parent_fd.get(), temporary.c_str(), parent_fd.get(), last.c_str()) != 0) {
    status = absl::InternalError(SysError(errno));
  }
  if (!status.ok()) {
    unlinkat(parent_fd.get(), temporary.c_str(), 0);
    return absl::InternalError(absl::StrCat("cannot write ", path_, "/", relative, ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status OwnedDirectory::RemoveFile(absl::string_view relative) const {
  AsOwner as_owner(owner_);
  if (!as_owner.status().ok()) return as_owner.status();
  std::string last;
  absl::StatusOr<int> parent = OpenParentOf(relative, &last);
  if (!parent.ok()) return absl::IsNotFound(parent.status()) ? absl::OkStatus() : parent.status();
  ScopedFd parent_fd(*parent);
  if (unlinkat(parent_fd.get(), last.c_str(), 0) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat("cannot remove ", path_, "/", relative, ": ", SysError(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<UntrustedFile> OwnedDirectory::OpenForReading(absl::string_view relative) const {
  AsOwner as_owner(owner_);
  if (!as_owner.status().ok()) return as_owner.status();
  absl::StatusOr<std::vector<std::string>> parts = Components(relative);
  if (!parts.ok()) return parts.status();
  // Non-blocking: opening a FIFO would otherwise wait for a writer that never comes.
  const int fd = OpenBeneath(fd_, *parts, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ResolveError(path_, relative, -fd);
  UntrustedFile file(fd);
  struct stat info {};
  if (fstat(fd, &info) != 0) return absl::InternalError(absl::StrCat(path_, "/", relative, ": ", SysError(errno)));
  if (!S_ISREG(info.st_mode)) {
    const char* what = S_ISFIFO(info.st_mode) ? "a FIFO"
                       : S_ISDIR(info.st_mode) ? "a directory"
                       : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "a device"
                       : S_ISSOCK(info.st_mode) ? "a socket"
                                                 : "not a regular file";
    return absl::FailedPreconditionError(
        absl::StrCat(path_, "/", relative, " is ", what, ", not a regular file: fitrund reads only regular files"));
  }
  return file;
}

absl::StatusOr<std::string> AccountSubdirectory(const std::string& parent, const UnixAccount& account) {
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", parent, ": ", error.message()));
  const std::string dir = absl::StrCat(parent, "/", account.name);
  absl::StatusOr<OwnedDirectory> opened = OwnedDirectory::Open(dir, account, /*create=*/true);
  if (!opened.ok()) return opened.status();
  return dir;
}

}  // namespace fitrun::server
