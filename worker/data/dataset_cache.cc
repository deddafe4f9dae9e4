#include "worker/data/dataset_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "proto/contract/atomic_file.h"
#include "proto/contract/log.h"

namespace fitrun::worker {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'f', 'i', 't', 'r', 'u', 'n', 'D', 'C'};
// Bumped when the header or the payload's layout changes; it is part of the entry's key too, so
// workers of two versions sharing a directory keep an entry each instead of replacing each other's.
constexpr uint32_t kFormatVersion = 1;
constexpr int kMaxDims = 8;
// ReadIdxFile's bound: no valid entry holds more.
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 32;
constexpr absl::string_view kEntrySuffix = ".idxcache";
// A writer killed mid-write (ranks are SIGKILLed when an attempt stops) leaves its temporary file;
// the next writer of that entry removes those this old, which no live writer still fills.
constexpr auto kStaleTemporaryAge = std::chrono::minutes(10);

// Native byte order, as the payload is mapped as is; an entry from a machine of the other order
// fails the version check.
struct EntryHeader {
  char magic[8];
  uint32_t version;
  uint32_t num_dims;
  uint64_t source_key;
  int64_t payload_bytes;
  int64_t dims[kMaxDims];
  uint8_t reserved[32];  // zero; pads the payload to a 64-byte boundary
};
static_assert(sizeof(EntryHeader) == 128, "the header's size is part of the format");

// FNV-1a, 64 bits: stable across processes and builds (absl::Hash is not), which a file name needs.
uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

struct Source {
  std::string absolute_path;
  uint64_t key = 0;
};

// The source's identity as it is now. NotFound when it cannot be stat'ed.
absl::StatusOr<Source> Identify(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  std::error_code error;
  Source source;
  source.absolute_path = fs::absolute(path, error).lexically_normal().string();
  if (error) return absl::NotFoundError(absl::StrCat(path, ": ", error.message()));
  const int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  source.key = Fnv1a64(absl::StrCat("fitrun decoded IDX v", kFormatVersion, "\n", source.absolute_path, "\n",
                                    st.st_size, " ", mtime_ns, " ", st.st_ino, " ", st.st_dev));
  return source;
}

std::string EntryPathFor(const std::string& dir, const Source& source) {
  return (fs::path(dir) / absl::StrFormat("%s.%016x%s", fs::path(source.absolute_path).filename().string(),
                                          source.key, kEntrySuffix))
      .string();
}

// OK when `header` describes a whole entry of `file_bytes` bytes for the source keyed `key`, read
// as `expected_dims` dimensions; otherwise why not.
absl::Status CheckHeader(const EntryHeader& header, int64_t file_bytes, int expected_dims, uint64_t key) {
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) return absl::DataLossError("not a cache entry");
  if (header.version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("format version ", header.version, ", expected ", kFormatVersion));
  }
  if (header.source_key != key) return absl::DataLossError("written for another source file");
  if (header.num_dims != static_cast<uint32_t>(expected_dims) || expected_dims > kMaxDims) {
    return absl::DataLossError(absl::StrCat(header.num_dims, " dimensions, expected ", expected_dims));
  }
  int64_t payload = 1;
  for (int i = 0; i < expected_dims; ++i) {
    if (header.dims[i] <= 0) return absl::DataLossError(absl::StrCat("dimension ", i, " is ", header.dims[i]));
    // Checked before multiplying, so no product can overflow.
    if (header.dims[i] > kMaxPayloadBytes / payload) return absl::DataLossError("dimensions beyond any IDX file");
    payload *= header.dims[i];
  }
  if (header.payload_bytes != payload) {
    return absl::DataLossError(absl::StrCat("payload of ", header.payload_bytes, " bytes for ", payload, " elements"));
  }
  if (file_bytes != static_cast<int64_t>(sizeof(EntryHeader)) + payload) {
    return absl::DataLossError(absl::StrCat(file_bytes, " bytes, the header promises ",
                                            sizeof(EntryHeader) + payload));
  }
  return absl::OkStatus();
}

// The entry at `entry`, mapped read-only: NotFound when there is none, another error saying why it
// cannot be used.
absl::StatusOr<IdxData> MapEntry(const std::string& entry, int expected_dims, uint64_t key) {
  // One that cannot be opened (missing, or a directory not there or not ours) is not there for us.
  const int fd = ::open(entry.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(entry, ": ", std::strerror(errno)));
  struct stat st;
  EntryHeader header;
  absl::Status checked;
  if (::fstat(fd, &st) != 0) {
    checked = absl::UnavailableError(absl::StrCat("cannot stat: ", std::strerror(errno)));
  } else if (st.st_size < static_cast<off_t>(sizeof(header)) ||
             ::pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    checked = absl::DataLossError(absl::StrCat(st.st_size, " bytes, shorter than its header"));
  } else {
    checked = CheckHeader(header, st.st_size, expected_dims, key);
  }
  if (!checked.ok()) {
    ::close(fd);
    return checked;
  }
  const size_t length = static_cast<size_t>(st.st_size);
  // Populated at once: the loader reads every byte next, and one read-ahead beats a fault per page.
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (map == MAP_FAILED) return absl::UnavailableError(absl::StrCat("cannot map: ", std::strerror(map_error)));
  std::shared_ptr<const void> storage(map, [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
  const auto* payload = static_cast<const uint8_t*>(map) + sizeof(EntryHeader);
  return IdxData(std::vector<int64_t>(header.dims, header.dims + expected_dims),
                 absl::MakeConstSpan(payload, static_cast<size_t>(header.payload_bytes)), std::move(storage));
}

// Removes the temporaries of `entry` that writers killed long ago left behind.
void RemoveStaleTemporaries(const std::string& entry) {
  const fs::path entry_path(entry);
  const std::string prefix = entry_path.filename().string() + ".tmp-";
  std::error_code error;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& file : fs::directory_iterator(entry_path.parent_path(), error)) {
    if (!absl::StartsWith(file.path().filename().string(), prefix)) continue;
    const auto modified = file.last_write_time(error);
    if (!error && now - modified > kStaleTemporaryAge) fs::remove(file.path(), error);
  }
}

}  // namespace

IdxData::IdxData(IdxArray array) : dims_(std::move(array.dims)) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(array.data));
  bytes_ = absl::MakeConstSpan(*owned);
  storage_ = std::move(owned);
}

IdxData::IdxData(std::vector<int64_t> dims, absl::Span<const uint8_t> bytes, std::shared_ptr<const void> storage)
    : dims_(std::move(dims)), bytes_(bytes), storage_(std::move(storage)), mapped_(true) {}

DatasetCache::DatasetCache(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::string> DatasetCache::EntryPath(const std::string& path) const {
  absl::StatusOr<Source> source = Identify(path);
  if (!source.ok()) return source.status();
  return EntryPathFor(options_.dir, *source);
}

absl::StatusOr<IdxData> DatasetCache::ReadIdx(const std::string& path, int expected_dims) {
  std::optional<Source> source;
  if (!options_.dir.empty() && expected_dims <= kMaxDims) {
    // A source that cannot be stat'ed is ReadIdxFile's to report, in the words it uses without a cache.
    absl::StatusOr<Source> identified = Identify(path);
    if (identified.ok()) source = *std::move(identified);
  }
  std::string entry;
  if (source.has_value()) {
    entry = EntryPathFor(options_.dir, *source);
    absl::StatusOr<IdxData> mapped = MapEntry(entry, expected_dims, source->key);
    if (mapped.ok()) {
      ++stats_.mapped;
      return mapped;
    }
    if (!absl::IsNotFound(mapped.status())) {
      ++stats_.rejected;
      Log(absl::StrCat("dataset cache: ignoring ", entry, " (", mapped.status().message(), "); decoding ", path,
                       " again"));
    }
  }
  absl::StatusOr<IdxArray> decoded = ReadIdxFile(path, expected_dims);
  if (!decoded.ok()) return decoded.status();
  ++stats_.decoded;
  IdxData data(*std::move(decoded));
  if (source.has_value() && writable_) WriteEntry(path, entry, source->key, data);
  return data;
}

void DatasetCache::WriteEntry(const std::string& path, const std::string& entry, uint64_t key, const IdxData& data) {
  // A source rewritten while it was decoded may have given this process either version's bytes;
  // the entry would claim the new identity for them, so none is written.
  absl::StatusOr<Source> now = Identify(path);
  if (!now.ok() || now->key != key) return;
  std::error_code error;
  fs::create_directories(options_.dir, error);
  if (error) return StopWriting(absl::StrCat("cannot create it: ", error.message()));
  RemoveStaleTemporaries(entry);

  EntryHeader header;
  std::memset(&header, 0, sizeof(header));
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kFormatVersion;
  header.num_dims = static_cast<uint32_t>(data.dims().size());
  header.source_key = key;
  header.payload_bytes = static_cast<int64_t>(data.bytes().size());
  for (size_t i = 0; i < data.dims().size() && i < kMaxDims; ++i) header.dims[i] = data.dims()[i];
  const absl::string_view pieces[] = {
      absl::string_view(reinterpret_cast<const char*>(&header), sizeof(header)),
      absl::string_view(reinterpret_cast<const char*>(data.bytes().data()), data.bytes().size())};
  if (absl::Status written = contract::WriteFileAtomically(entry, pieces); !written.ok()) {
    return StopWriting(std::string(written.message()));
  }
  ++stats_.written;
}

void DatasetCache::StopWriting(const std::string& why) {
  if (!writable_) return;
  writable_ = false;
  // Entries already there are still mapped; only what it lacks is decoded every time.
  Log(absl::StrCat("dataset cache ", options_.dir, " not written: ", why,
                   "; datasets it does not hold are decoded as without it"));
}

void DatasetCache::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    contract::Log(contract::LogSeverity::kWarning, line);
  }
}

}  // namespace fitrun::worker
