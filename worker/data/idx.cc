#include "worker/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fitrun::worker {
namespace {

// IDX magic: two zero bytes, a type code, then the number of dimensions.
constexpr uint8_t kUnsignedByteType = 0x08;
// Nothing in the MNIST family comes close; the bound keeps a corrupt header from asking for gigabytes.
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 32;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly `size` bytes; returns how many were read before the end of the stream.
absl::StatusOr<int64_t> ReadFully(gzFile file, const std::string& path, uint8_t* out, int64_t size) {
  int64_t done = 0;
  while (done < size) {
    // gzread takes an unsigned int count, so large payloads are read in chunks.
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(size - done, 1 << 30));
    const int n = gzread(file, out + done, chunk);
    if (n < 0) {
      int errnum = 0;
      const char* message = gzerror(file, &errnum);
      return absl::DataLossError(absl::StrCat(path, ": cannot decompress: ", message));
    }
    if (n == 0) break;
    done += n;
  }
  return done;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int expected_dims) {
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  uint8_t magic[4];
  absl::StatusOr<int64_t> got = ReadFully(file.get(), path, magic, sizeof(magic));
  if (!got.ok()) return got.status();
  if (*got != sizeof(magic)) {
    return absl::DataLossError(absl::StrCat(path, ": too short for an IDX header"));
  }
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != kUnsignedByteType) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not an IDX file of unsigned bytes (magic ", magic[0], ",", magic[1], ",",
                     magic[2], ",", magic[3], ")"));
  }
  if (magic[3] != expected_dims) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected ", expected_dims,
                                                   " dimensions, the header says ", magic[3]));
  }

  IdxArray array;
  int64_t payload = 1;
  for (int i = 0; i < expected_dims; ++i) {
    uint8_t be[4];
    got = ReadFully(file.get(), path, be, sizeof(be));
    if (!got.ok()) return got.status();
    if (*got != sizeof(be)) {
      return absl::DataLossError(absl::StrCat(path, ": header truncated in dimension ", i));
    }
    const int64_t dim = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | be[3];
    if (dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": dimension ", i, " is ", dim));
    }
    payload *= dim;
    if (payload > kMaxPayloadBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": header claims more than ",
                                                     kMaxPayloadBytes, " bytes"));
    }
    array.dims.push_back(dim);
  }

  // The buffer grows with what the file really holds (doubling from 1 MiB), so a 15-byte file whose
  // header claims 4 GB fails as truncated without first allocating the 4 GB.
  int64_t read = 0;
  while (read < payload) {
    const int64_t want = std::min(payload, std::max<int64_t>(int64_t{1} << 20, 2 * read));
    array.data.resize(want);
    got = ReadFully(file.get(), path, array.data.data() + read, want - read);
    if (!got.ok()) return got.status();
    read += *got;
    if (read < want) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: header promises ", payload, " bytes, file has ", read));
    }
  }
  uint8_t extra;
  got = ReadFully(file.get(), path, &extra, 1);
  if (!got.ok()) return got.status();
  if (*got != 0) {
    return absl::DataLossError(absl::StrCat(path, ": trailing bytes after the ", payload,
                                            "-byte payload (wrong header?)"));
  }
  return array;
}

}  // namespace fitrun::worker
