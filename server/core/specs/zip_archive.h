// The zip archive torch.save writes (PyTorch >= 1.6), read as far as fitrund needs it: the central
// directory (zip64 included) and the bytes of a stored entry. torch.save stores, never deflates, so a
// compressed entry is refused. The archive is untrusted: every offset and size is checked against the
// source, and the directory's size is bounded.
//
// Plain functions, thread-safe.
#ifndef FITRUN_SERVER_CORE_SPECS_ZIP_ARCHIVE_H_
#define FITRUN_SERVER_CORE_SPECS_ZIP_ARCHIVE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fitrun::server {

struct ZipEntry {
  uint64_t size = 0;          // uncompressed = compressed: torch.save stores, never deflates
  uint64_t header_offset = 0;
  uint16_t method = 0;
};

// Random access to the archive: a file descriptor, or bytes in memory.
class ZipSource {
 public:
  virtual ~ZipSource() = default;
  virtual uint64_t size() const = 0;
  // Exactly `n` bytes at `offset`, or INVALID_ARGUMENT.
  virtual absl::StatusOr<std::string> Read(uint64_t offset, uint64_t n) const = 0;
};

// Bytes in memory, which must outlive it.
class MemoryZipSource final : public ZipSource {
 public:
  explicit MemoryZipSource(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::StatusOr<std::string> Read(uint64_t offset, uint64_t n) const override;

 private:
  absl::string_view bytes_;
};

// An open file's first `size` bytes; it owns `fd` and closes it.
class FileZipSource final : public ZipSource {
 public:
  FileZipSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~FileZipSource() override;
  FileZipSource(const FileZipSource&) = delete;
  FileZipSource& operator=(const FileZipSource&) = delete;
  uint64_t size() const override { return size_; }
  absl::StatusOr<std::string> Read(uint64_t offset, uint64_t n) const override;

 private:
  int fd_;
  uint64_t size_;
};

// The archive's entries by name. INVALID_ARGUMENT, saying what was found, for anything else (not a
// zip, the legacy torch.save format, a damaged or oversized directory).
absl::StatusOr<std::map<std::string, ZipEntry>> ReadZipDirectory(const ZipSource& source);

// The bytes of a stored `entry`, at most `limit` of them (INVALID_ARGUMENT past it).
absl::StatusOr<std::string> ReadZipEntry(const ZipSource& source, const ZipEntry& entry, uint64_t limit);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_ZIP_ARCHIVE_H_
