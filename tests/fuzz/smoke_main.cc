// A main for a libFuzzer target (LLVMFuzzerTestOneInput) in the ordinary test build, where there is
// no libFuzzer: it runs every file of the target's seed corpus, then mutations of them (byte flips,
// insertions, deletions, truncations and splices, from a fixed seed) for a time budget, and prints how
// many inputs ran. A crash, a sanitizer report or a hang fails the test, as under libFuzzer; real,
// coverage-guided fuzzing is tools/fuzz.sh's.
//
//   smoke_test CORPUS_DIR [SECONDS]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

std::string Mutate(std::string input, const std::vector<std::string>& corpus, std::mt19937_64& random) {
  const int edits = 1 + static_cast<int>(random() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = input.empty() ? 0 : random() % input.size();
    switch (random() % 6) {
      case 0:
      case 1:
        if (!input.empty()) input[at] = static_cast<char>(random());
        break;
      case 2:
        input.insert(at, 1 + random() % 8, static_cast<char>(random()));
        break;
      case 3:
        if (!input.empty()) input.erase(at, 1 + random() % 8);
        break;
      case 4:
        input.resize(at);
        break;
      default: {
        const std::string& other = corpus[random() % corpus.size()];
        if (!other.empty()) input.insert(at, other.substr(random() % other.size(), 1 + random() % 64));
      }
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [SECONDS]\n", argv[0]);
    return 2;
  }
  const double seconds = argc > 2 ? std::atof(argv[2]) : 2.0;
  std::vector<std::string> corpus;
  for (const auto& entry : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream in(entry.path(), std::ios::binary);
    corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "%s: no seed in %s\n", argv[0], argv[1]);
    return 1;
  }
  long runs = 0;
  for (const std::string& seed : corpus) {
    Run(seed);
    ++runs;
  }
  std::mt19937_64 random(20261124);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    Run(Mutate(corpus[random() % corpus.size()], corpus, random));
    ++runs;
  }
  std::printf("%ld inputs run (%zu seeds, %.1f s of mutations), no crash\n", runs, corpus.size(), seconds);
  return 0;
}
