// The decoded-dataset cache: an IDX file's decompressed payload kept as a raw file that ranks map
// read-only, so a dataset is decompressed once per cache directory (fitrund's <state_dir>/datasets,
// or <shared_dir>/datasets on Slurm) instead of by every rank of every attempt.
//
// An entry is named after its source file and a hash of the file's identity (absolute path, size,
// mtime in ns, inode, device), so a changed or replaced source gets a new entry and never the old
// one's bytes. It holds a 128-byte header (magic, format version, the identity's hash, dimensions,
// payload size) and then the payload. An entry is checked against its header and its own size before
// it is used; one that fails (short, another version, another source) is decoded anew and replaced.
// Entries are written beside and renamed into place, so ranks that miss at the same time each write
// one and the last rename wins; a reader sees a whole entry or none.
#ifndef FITRUN_WORKER_DATA_DATASET_CACHE_H_
#define FITRUN_WORKER_DATA_DATASET_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/data/idx.h"

namespace fitrun::worker {

// An IDX file's payload as the loaders read it: decoded in this process, or a cache entry's
// read-only mapping. Copies share the bytes, which live as long as any copy.
class IdxData {
 public:
  explicit IdxData(IdxArray array);
  // Views `bytes` inside `storage` (a mapping), which it keeps alive.
  IdxData(std::vector<int64_t> dims, absl::Span<const uint8_t> bytes, std::shared_ptr<const void> storage);

  const std::vector<int64_t>& dims() const { return dims_; }
  absl::Span<const uint8_t> bytes() const { return bytes_; }
  // Whether the bytes come from a cache entry rather than decoding the source.
  bool mapped() const { return mapped_; }

 private:
  std::vector<int64_t> dims_;
  absl::Span<const uint8_t> bytes_;
  std::shared_ptr<const void> storage_;
  bool mapped_ = false;
};

// One process's use of a cache directory. A cache that cannot be used is never an error: the file
// is decoded as without one, and `log` hears why (once, for a directory it cannot create or write).
// Thread-compatible: one loading thread per object; objects in other processes (the other ranks) may
// share the directory.
class DatasetCache {
 public:
  struct Options {
    // Empty: no cache, every read decodes.
    std::string dir;
    // Where the one line about an unusable directory (and one per invalid entry) goes; unset: stderr.
    std::function<void(const std::string&)> log;
  };
  struct Stats {
    int mapped = 0;    // reads answered by a valid entry
    int decoded = 0;   // reads that decompressed the source
    int written = 0;   // entries written
    int rejected = 0;  // entries found invalid (and decoded anew)
  };

  explicit DatasetCache(Options options);

  // The IDX file at `path` as ReadIdxFile reads it, with the same errors for a bad source: mapped
  // from its entry when the directory holds a valid one for the file as it is now, otherwise decoded
  // and its entry written for the next reader.
  absl::StatusOr<IdxData> ReadIdx(const std::string& path, int expected_dims);

  // The entry for the file at `path` as it is now (NotFound when it cannot be stat'ed). Tests use
  // it to find and damage entries.
  absl::StatusOr<std::string> EntryPath(const std::string& path) const;

  const Stats& stats() const { return stats_; }

 private:
  // Writes `data`'s entry unless the source changed while it was decoded.
  void WriteEntry(const std::string& path, const std::string& entry, uint64_t key, const IdxData& data);
  // Stops writing entries, saying why (the first time).
  void StopWriting(const std::string& why);
  void Log(const std::string& line) const;

  const Options options_;
  bool writable_ = true;
  Stats stats_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_DATASET_CACHE_H_
