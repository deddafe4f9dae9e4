// Fuzz target: whatever a decoded-dataset cache entry holds (the directory may be shared, and a crash
// or a full disk may have left anything in it), reading through the cache never crashes, never
// over-reads, and answers as many bytes as the dimensions say. The input becomes the entry of a small
// IDX file, with the source's real key patched in at bytes 16-23, so the checks past the key are
// reached too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "worker/data/dataset_cache.h"

namespace {

struct Fixture {
  std::string source;
  std::string cache_dir;
  std::string entry;
  std::string key;  // the entry's bytes 16-23, as a read wrote them
};

const Fixture& GetFixture() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture;
    // A plain (not gzip'd) IDX file of 2x3 bytes; ReadIdxFile takes both.
    const uint8_t idx[] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
    f->source = fitrun::fuzz::WriteInput(idx, sizeof(idx), "source-idx2-ubyte");
    f->cache_dir = fitrun::fuzz::InputDir() + "/cache";
    fitrun::worker::DatasetCache cache({f->cache_dir, [](const std::string&) {}});
    if (!cache.ReadIdx(f->source, 2).ok()) std::abort();
    f->entry = *cache.EntryPath(f->source);
    std::ifstream in(f->entry, std::ios::binary);
    const std::string written{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (written.size() < 24) std::abort();
    f->key = written.substr(16, 8);
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& fixture = GetFixture();
  std::string entry(reinterpret_cast<const char*>(data), size);
  if (entry.size() >= 24) entry.replace(16, 8, fixture.key);
  std::ofstream(fixture.entry, std::ios::binary | std::ios::trunc) << entry;
  for (int dims : {1, 2, 3}) {
    fitrun::worker::DatasetCache cache({fixture.cache_dir, [](const std::string&) {}});
    absl::StatusOr<fitrun::worker::IdxData> read = cache.ReadIdx(fixture.source, dims);
    if (!read.ok()) continue;
    int64_t elements = 1;
    for (int64_t d : read->dims()) elements *= d;
    if (static_cast<int>(read->dims().size()) != dims || static_cast<size_t>(elements) != read->bytes().size()) {
      std::abort();
    }
    // Every byte is readable (an over-long span would fault or trip a sanitizer here).
    volatile uint8_t sum = 0;
    for (uint8_t b : read->bytes()) sum = sum + b;
  }
  return 0;
}
