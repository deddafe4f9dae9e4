#include "server/core/specs/spec_files.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fitrun::server {
absl::StatusOr<SpecFile> SpecFile::Open(const std::string& path) {
  // Non-blocking: a FIFO opened for reading would otherwise wait for a writer.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(absl::StrCat("no file '", path, "'"));
    return absl::InvalidArgumentError(absl::StrCat("cannot open '", path, "': ", std::strerror(error)));
  }
  struct stat info {};
  struct statfs fs {};
  std::string refused;
  if (fstat(fd, &info) != 0 || fstatfs(fd, &fs) != 0) {
    refused = std::strerror(errno);
  } else if (!S_ISREG(info.st_mode)) {
    refused = S_ISFIFO(info.st_mode)                          ? "is a FIFO"
              : S_ISDIR(info.st_mode)                         ? "is a directory"
              : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "is a device"
                                                              : "is not a regular file";
  } else if (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC) {
    refused = "is a kernel file";
  }
  if (!refused.empty()) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", refused, "; give a regular file"));
  }
  const int64_t mtime_ns = int64_t{info.st_mtim.tv_sec} * 1000000000 + info.st_mtim.tv_nsec;
  return SpecFile(fd, static_cast<int64_t>(info.st_size), absl::StrCat(path, "@", mtime_ns, ":", info.st_size));
}

SpecFile::SpecFile(SpecFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), version_(std::move(other.version_)) {
  other.fd_ = -1;
}

SpecFile::~SpecFile() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<RatingsCounts> CountRatings(const SpecFile& file, const std::string& path) {
  if (file.size() > kMaxRatingsFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' has ", file.size(), " bytes; a ratings file may have ",
                                                   kMaxRatingsFileBytes, " at most"));
  }
  constexpr size_t kMaxLine = 4096;
  std::unordered_set<int64_t> items;
  std::unordered_map<int64_t, int64_t> ratings_per_user;
  std::string buffer(1 << 16, '\0');
  std::string line;
  int64_t line_number = 0;
  auto take_line = [&]() -> absl::Status {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return absl::OkStatus();
    const size_t first = line.find("::");
    const size_t second = first == std::string::npos ? first : line.find("::", first + 2);
    int64_t user = 0;
    int64_t item = 0;
    if (second == std::string::npos || !absl::SimpleAtoi(line.substr(0, first), &user) ||
        !absl::SimpleAtoi(line.substr(first + 2, second - first - 2), &item)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' line ", line_number, " is not user::item::rating::timestamp"));
    }
    items.insert(item);
    ++ratings_per_user[user];
    if (items.size() > kMaxRatingsIds || ratings_per_user.size() > kMaxRatingsIds) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' has more than ", kMaxRatingsIds, " distinct items or users"));
    }
    return absl::OkStatus();
  };
  // Only the bytes the file had when it was opened: a file that grows meanwhile is not followed.
  for (int64_t offset = 0; offset < file.size();) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(buffer.size(), file.size() - offset));
    const ssize_t n = pread(file.fd(), buffer.data(), want, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    offset += n;
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] != '\n') {
        if (line.size() == kMaxLine) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", path, "' line ", line_number + 1, " is longer than ", kMaxLine, " bytes"));
        }
        line.push_back(buffer[i]);
        continue;
      }
      if (absl::Status taken = take_line(); !taken.ok()) return taken;
      line.clear();
    }
  }
  if (!line.empty()) {
    if (absl::Status taken = take_line(); !taken.ok()) return taken;
  }
  RatingsCounts counts;
  counts.items = static_cast<int64_t>(items.size());
  for (const auto& [user, count] : ratings_per_user) {
    if (count >= 3) ++counts.trainable_users;
  }
  return counts;
}

absl::StatusOr<IdxHeader> ReadGzippedIdxHeader(const SpecFile& file, const std::string& path) {
  // IDX: two zero bytes, the type code, the number of dimensions, then each dimension as a big-endian
  // 32-bit count. Three dimensions at most here (images: count, rows, columns).
  constexpr int kMaxDims = 3;
  constexpr int64_t kMaxCompressedRead = 64 << 10;
  unsigned char header[4 + 4 * kMaxDims] = {};
  std::string compressed(static_cast<size_t>(std::min<int64_t>(file.size(), kMaxCompressedRead)), '\0');
  size_t have = 0;
  while (have < compressed.size()) {
    const ssize_t n = pread(file.fd(), compressed.data() + have, compressed.size() - have, static_cast<off_t>(have));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
  }
  z_stream stream{};
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK) return absl::InternalError("zlib: inflateInit2 failed");
  stream.next_in = reinterpret_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(have);
  stream.next_out = header;
  stream.avail_out = sizeof(header);
  int result = Z_OK;
  while (stream.avail_out > 0 && result == Z_OK) result = inflate(&stream, Z_NO_FLUSH);
  const size_t inflated = sizeof(header) - stream.avail_out;
  inflateEnd(&stream);
  auto refused = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", why));
  };
  if (inflated < 4 && result != Z_OK && result != Z_STREAM_END) return refused("is not a gzipped file");
  if (inflated < 4 || header[0] != 0 || header[1] != 0) return refused("is not an IDX file (gzipped)");
  const int dims = header[3];
  if (dims < 1 || dims > kMaxDims || inflated < static_cast<size_t>(4 + 4 * dims)) {
    return refused(absl::StrCat("has an IDX header of ", dims, " dimensions; expected 1 to ", kMaxDims));
  }
  IdxHeader idx;
  idx.type_code = header[2];
  for (int d = 0; d < dims; ++d) {
    const unsigned char* b = header + 4 + 4 * d;
    idx.dims.push_back((int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]});
  }
  return idx;
}

}  // namespace fitrun::server
