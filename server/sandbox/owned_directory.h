// A directory fitrund keeps for an account (a job's directory, an account's dataset cache) whose
// contents that account controls, and so everything fitrund does inside it.
//
// fitrund may be root; a job's processes run as their owner's account and may replace anything in
// their job's directory at any moment (a symlink to /etc/shadow, a FIFO, a hard link, a directory
// where a file was). So, inside an OwnedDirectory:
//   - every operation runs with the account's file-system rights on the calling thread
//     (FileAccessAs): whatever a path leads to, fitrund can do there only what the account could;
//   - every path is resolved beneath the directory's descriptor and through no symlink at all
//     (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS where the kernel
//     has it, a walk of O_NOFOLLOW descriptors where it does not);
//   - files are written through a new file (O_CREAT | O_EXCL) renamed over the old name, and read
//     only when they are regular files, opened non-blocking, within a size bound.
// The directory itself is opened (and made) in a parent that must be fitrund's own, which is what
// keeps the directory where it is: its account may change what is inside, never the entry itself.
//
// Thread-safety: an OwnedDirectory may be used from several threads at once (each operation
// switches only its own thread's rights, and back).
#ifndef FITRUN_SERVER_SANDBOX_OWNED_DIRECTORY_H_
#define FITRUN_SERVER_SANDBOX_OWNED_DIRECTORY_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/sandbox/unix_account.h"

namespace fitrun::server {

// A regular file of an OwnedDirectory open for reading. Reads never block and never return more
// than asked, whatever the file becomes meanwhile.
class UntrustedFile {
 public:
  UntrustedFile(UntrustedFile&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  UntrustedFile& operator=(UntrustedFile&& other) noexcept;
  ~UntrustedFile();

  // Up to `max_bytes` from `offset` (fewer at the end of the file, none past it).
  absl::StatusOr<std::string> ReadAt(int64_t offset, size_t max_bytes) const;
  // The file's last `max_bytes` at most, and from where they start.
  struct Tail {
    std::string bytes;
    int64_t offset = 0;
  };
  absl::StatusOr<Tail> ReadTail(size_t max_bytes) const;
  // Its size now.
  absl::StatusOr<int64_t> Size() const;

 private:
  friend class OwnedDirectory;
  explicit UntrustedFile(int fd) : fd_(fd) {}
  int fd_ = -1;
};

class OwnedDirectory {
 public:
  // Opens `path`, making it first (mode 0700) when `create` and it is missing. Its parent is
  // resolved as any path is and must be fitrund's own, writable by nobody else, when `owner` is set
  // (FAILED_PRECONDITION naming it otherwise). The directory itself must not be a symlink. With
  // `owner`, the directory is given to the account (owner, group, 0700) and every later operation
  // runs with its rights; without, with fitrund's own.
  static absl::StatusOr<OwnedDirectory> Open(const std::string& path, const std::optional<UnixAccount>& owner,
                                             bool create);

  OwnedDirectory(OwnedDirectory&& other) noexcept;
  OwnedDirectory& operator=(OwnedDirectory&& other) noexcept;
  ~OwnedDirectory();

  const std::string& path() const { return path_; }
  const std::optional<UnixAccount>& owner() const { return owner_; }

  // Paths below are relative: names joined by '/', none empty, "." or "..". A symlink anywhere on
  // the way fails the operation (the status names the path).

  // Makes the directory `relative` (its parents must exist) with `mode`; an existing directory is
  // kept as it is.
  absl::Status MakeDirectory(absl::string_view relative, mode_t mode = 0700) const;
  // Replaces `relative` whole with `contents`: a new file beside it (O_EXCL, `mode`), flushed and
  // renamed over the name, whatever the name held (a file, a symlink, nothing).
  absl::Status WriteFile(absl::string_view relative, absl::string_view contents, mode_t mode) const;
  // Removes the file (or symlink) `relative`; OK when there is none.
  absl::Status RemoveFile(absl::string_view relative) const;
  // Opens `relative` for reading: NOT_FOUND when missing, FAILED_PRECONDITION naming what it is
  // when it is not a regular file (a FIFO, a device, a directory, a symlink).
  absl::StatusOr<UntrustedFile> OpenForReading(absl::string_view relative) const;

  // For tests: resolve with the O_NOFOLLOW walk even where the kernel has openat2.
  static void UseDescriptorWalkForTesting(bool walk);

 private:
  OwnedDirectory(int fd, std::string path, std::optional<UnixAccount> owner)
      : fd_(fd), path_(std::move(path)), owner_(std::move(owner)) {}
  // The directory holding `relative`'s last name, opened beneath fd_ without following symlinks,
  // and that name. Runs with the caller's rights: call it as the owner.
  absl::StatusOr<int> OpenParentOf(absl::string_view relative, std::string* last) const;

  int fd_ = -1;
  std::string path_;
  std::optional<UnixAccount> owner_;
};

// <parent>/<account name>, made if missing (`parent` too) and the account's alone (0700): where a
// cache shared by one account's jobs lives (decoded datasets), so no account reads or plants
// another's. `parent` must be fitrund's own (OwnedDirectory::Open).
absl::StatusOr<std::string> AccountSubdirectory(const std::string& parent, const UnixAccount& account);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SANDBOX_OWNED_DIRECTORY_H_
