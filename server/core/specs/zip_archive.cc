#include "server/core/specs/zip_archive.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fitrun::server {
namespace {

constexpr size_t kMaxCentralDirectoryBytes = size_t{64} << 20;

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

uint16_t U16(absl::string_view b, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(b[at]) | static_cast<uint8_t>(b[at + 1]) << 8);
}
uint32_t U32(absl::string_view b, size_t at) { return U16(b, at) | static_cast<uint32_t>(U16(b, at + 2)) << 16; }
uint64_t U64(absl::string_view b, size_t at) { return U32(b, at) | static_cast<uint64_t>(U32(b, at + 4)) << 32; }

}  // namespace

absl::StatusOr<std::string> MemoryZipSource::Read(uint64_t offset, uint64_t n) const {
  if (offset > bytes_.size() || n > bytes_.size() - offset) return Invalid("the archive is truncated");
  return std::string(bytes_.substr(offset, n));
}

FileZipSource::~FileZipSource() { close(fd_); }

absl::StatusOr<std::string> FileZipSource::Read(uint64_t offset, uint64_t n) const {
  if (offset > size_ || n > size_ - offset) return Invalid("the archive is truncated");
  std::string out(n, '\0');
  for (uint64_t done = 0; done < n;) {
    const ssize_t got = pread(fd_, out.data() + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Invalid(absl::StrCat("cannot read it: ", got < 0 ? std::strerror(errno) : "short read"));
    done += static_cast<uint64_t>(got);
  }
  return out;
}

absl::StatusOr<std::map<std::string, ZipEntry>> ReadZipDirectory(const ZipSource& source) {
  const uint64_t size = source.size();
  if (size < 22) return Invalid("not a zip archive (too short)");
  const uint64_t tail_size = std::min<uint64_t>(size, 65535 + 22);
  absl::StatusOr<std::string> tail = source.Read(size - tail_size, tail_size);
  if (!tail.ok()) return tail.status();
  size_t eocd = std::string::npos;
  for (size_t i = tail->size() - 22 + 1; i-- > 0;) {
    if (U32(*tail, i) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) {
    return Invalid("not a zip archive; torch.save writes one since PyTorch 1.6 (a file saved with "
                   "_use_new_zipfile_serialization=False cannot be read: save it again with torch.save(obj, path))");
  }
  uint64_t entries = U16(*tail, eocd + 10);
  uint64_t directory_size = U32(*tail, eocd + 12);
  uint64_t directory_offset = U32(*tail, eocd + 16);
  // Zip64: the locator sits just before the end record and points at the zip64 end record.
  if (eocd >= 20 && U32(*tail, eocd - 20) == 0x07064b50) {
    const uint64_t record_offset = U64(*tail, eocd - 20 + 8);
    absl::StatusOr<std::string> record = source.Read(record_offset, 56);
    if (!record.ok()) return record.status();
    if (U32(*record, 0) != 0x06064b50) return Invalid("a damaged zip64 end record");
    entries = U64(*record, 32);
    directory_size = U64(*record, 40);
    directory_offset = U64(*record, 48);
  }
  if (directory_size > kMaxCentralDirectoryBytes) return Invalid("a zip central directory too large to be torch.save's");
  absl::StatusOr<std::string> directory = source.Read(directory_offset, directory_size);
  if (!directory.ok()) return directory.status();
  std::map<std::string, ZipEntry> out;
  size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at + 46 > directory->size() || U32(*directory, at) != 0x02014b50) return Invalid("a damaged zip directory");
    ZipEntry entry;
    entry.method = U16(*directory, at + 10);
    const uint64_t compressed = U32(*directory, at + 20);
    entry.size = U32(*directory, at + 24);
    entry.header_offset = U32(*directory, at + 42);
    const size_t name_length = U16(*directory, at + 28);
    const size_t extra_length = U16(*directory, at + 30);
    const size_t comment_length = U16(*directory, at + 32);
    if (at + 46 + name_length + extra_length + comment_length > directory->size()) {
      return Invalid("a damaged zip directory");
    }
    std::string name = directory->substr(at + 46, name_length);
    // Zip64 extended information: the 0xFFFFFFFF fields, in order, as 8-byte values.
    absl::string_view extra = absl::string_view(*directory).substr(at + 46 + name_length, extra_length);
    for (size_t x = 0; x + 4 <= extra.size();) {
      const uint16_t id = U16(extra, x);
      const uint16_t length = U16(extra, x + 2);
      if (x + 4 + length > extra.size()) break;
      if (id == 0x0001) {
        size_t field = x + 4;
        auto next = [&](uint64_t& value) {
          if (value == 0xFFFFFFFF && field + 8 <= x + 4 + length) {
            value = U64(extra, field);
            field += 8;
          }
        };
        next(entry.size);
        uint64_t c = compressed;
        next(c);
        next(entry.header_offset);
      }
      x += 4 + length;
    }
    out[std::move(name)] = entry;
    at += 46 + name_length + extra_length + comment_length;
  }
  return out;
}

absl::StatusOr<std::string> ReadZipEntry(const ZipSource& source, const ZipEntry& entry, uint64_t limit) {
  if (entry.method != 0) return Invalid("a compressed zip entry; torch.save stores its entries uncompressed");
  if (entry.size > limit) return Invalid("a pickle too large to be a dict of tensors");
  absl::StatusOr<std::string> header = source.Read(entry.header_offset, 30);
  if (!header.ok()) return header.status();
  if (U32(*header, 0) != 0x04034b50) return Invalid("a damaged zip entry");
  const uint64_t data = entry.header_offset + 30 + U16(*header, 26) + U16(*header, 28);
  return source.Read(data, entry.size);
}

}  // namespace fitrun::server
