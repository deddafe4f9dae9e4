#include "worker/ddp/shared_memory_all_reduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace fitrun::worker {
namespace {

constexpr uint64_t kMagic = 0x66697472756e4152;  // "fitrunAR"
constexpr size_t kPageBytes = 4096;
// How long a wait spins before it sleeps: the peer is usually a few microseconds behind.
constexpr int kSpinIterations = 4000;
// How often a sleeping wait looks at whether its peer is still there.
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(20);

// Whether `phase` has reached `target` (both count up and may wrap around).
bool Reached(uint32_t phase, uint32_t target) { return static_cast<int32_t>(phase - target) >= 0; }

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word lives in a mapping shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Whether `pid` has exited (gone, or a zombie its parent has not collected yet).
bool ProcessGone(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t after_name = line.rfind(')');
  if (after_name == std::string::npos || after_name + 2 >= line.size()) return false;
  const char state = line[after_name + 2];
  return state == 'Z' || state == 'X';
}

uint64_t RandomWord() {
  uint64_t word = 0;
  if (getrandom(&word, sizeof(word), 0) != sizeof(word)) {
    word = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^ (static_cast<uint64_t>(getpid()) << 32);
  }
  return word;
}

absl::Status CheckOptions(const SharedMemoryAllReduce::Options& options) {
  if (options.world_size < 1 || options.world_size > SharedMemoryAllReduce::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("a shared-memory all-reduce serves 1 to ",
                                                   SharedMemoryAllReduce::kMaxRanks, " ranks, not ",
                                                   options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " is not in a world of ", options.world_size));
  }
  if (options.slot_bytes < 64 || options.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("slot_bytes ", options.slot_bytes, " is not a positive multiple of 64"));
  }
  return absl::OkStatus();
}

std::string ErrnoText(int error) { return std::strerror(error); }

std::string PathOf(const SharedMemoryAllReduce::Options& options, const std::string& name) {
  return absl::StrCat(options.directory, "/", name);
}

}  // namespace

// One cache line per rank, so that a rank's stores do not slow the others' reads.
struct alignas(64) RankWord {
  // This rank's progress: 2c + 1 once its values for chunk c are in its slot, 2c + 2 once its slice of
  // chunk c is summed. The word a waiter sleeps on.
  std::atomic<uint32_t> phase;
  // Waiters asleep on `phase`, so that a rank only makes the wake-up system call when one is.
  std::atomic<uint32_t> sleepers;
  std::atomic<uint32_t> left;
  std::atomic<int32_t> pid;
};

struct SharedMemoryAllReduce::Header {
  // Stored last by rank 0, so that a segment whose magic a peer reads is initialised.
  std::atomic<uint64_t> magic;
  uint64_t nonce;
  int64_t world_size;
  int64_t slot_bytes;
  RankWord ranks[kMaxRanks];
};

size_t SharedMemoryAllReduce::HeaderBytes() { return (sizeof(Header) + kPageBytes - 1) / kPageBytes * kPageBytes; }

size_t SharedMemoryAllReduce::SegmentBytes(const Options& options) {
  return HeaderBytes() + 2 * static_cast<size_t>(options.world_size) * static_cast<size_t>(options.slot_bytes);
}

static_assert(std::atomic<uint32_t>::is_always_lock_free, "progress words must be lock-free to be shared");

absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> SharedMemoryAllReduce::Create(const Options& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const std::string name = absl::StrCat("fitrun-allreduce-", getpid(), "-", absl::Hex(RandomWord(), absl::kZeroPad16));
  const std::string path = PathOf(options, name);
  // As shm_open does it, in a directory of the caller's choosing: never through a link, never an existing file.
  const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("creating shared memory ", path, ": ", ErrnoText(errno)));
  const size_t bytes = SegmentBytes(options);
  void* mapping = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int error = errno;
  close(fd);
  if (mapping == MAP_FAILED) {
    unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("mapping ", bytes, " bytes of shared memory: ", ErrnoText(error)));
  }
  const uint64_t nonce = RandomWord();
  auto* header = static_cast<Header*>(mapping);
  header->nonce = nonce;
  header->world_size = options.world_size;
  header->slot_bytes = options.slot_bytes;
  header->magic.store(kMagic, std::memory_order_release);
  auto all_reduce = std::unique_ptr<SharedMemoryAllReduce>(new SharedMemoryAllReduce(options, name, nonce, mapping, bytes));
  header->ranks[options.rank].pid.store(getpid());
  return all_reduce;
}

absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> SharedMemoryAllReduce::Open(const std::string& name,
                                                                                   uint64_t nonce,
                                                                                   const Options& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a segment's name"));
  }
  const std::string path = PathOf(options, name);
  const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("opening shared memory ", path, ": ", ErrnoText(errno)));
  const size_t bytes = SegmentBytes(options);
  struct stat st {};
  std::string wrong;
  if (fstat(fd, &st) != 0) {
    wrong = ErrnoText(errno);
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    wrong = "not a segment of this user's only";
  } else if (static_cast<size_t>(st.st_size) != bytes) {
    wrong = absl::StrCat(st.st_size, " bytes, not ", bytes);
  }
  void* mapping = MAP_FAILED;
  if (wrong.empty()) {
    mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED) wrong = ErrnoText(errno);
  }
  close(fd);
  if (!wrong.empty()) return absl::UnavailableError(absl::StrCat("opening shared memory ", path, ": ", wrong));
  auto* header = static_cast<Header*>(mapping);
  if (header->magic.load(std::memory_order_acquire) != kMagic || header->nonce != nonce ||
      header->world_size != options.world_size || header->slot_bytes != options.slot_bytes) {
    munmap(mapping, bytes);
    return absl::UnavailableError(absl::StrCat("shared memory ", path, " is not rank 0's segment for this group"));
  }
  header->ranks[options.rank].pid.store(getpid());
  return std::unique_ptr<SharedMemoryAllReduce>(new SharedMemoryAllReduce(options, name, nonce, mapping, bytes));
}

absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> SharedMemoryAllReduce::Join(Rendezvous& rendezvous,
                                                                                   const std::string& key_prefix,
                                                                                   const Options& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const std::string segment_key = key_prefix + "segment";
  const std::string tried_key = key_prefix + "tried";
  const std::string opened_key = key_prefix + "opened";
  absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> segment = absl::UnavailableError("not tried");
  if (options.rank == 0) {
    segment = Create(options);
    // An empty value tells the peers there is nothing to open.
    rendezvous.Set(segment_key, segment.ok() ? absl::StrCat((*segment)->name(), " ", (*segment)->nonce()) : "");
  } else {
    const std::vector<std::string> parts = absl::StrSplit(rendezvous.Get(segment_key), ' ');
    uint64_t nonce = 0;
    segment = parts.size() == 2 && absl::SimpleAtoi(parts[1], &nonce)
                  ? Open(parts[0], nonce, options)
                  : absl::UnavailableError("rank 0 could not create a shared-memory segment");
  }
  rendezvous.Add(opened_key, segment.ok() ? 1 : 0);
  int64_t tried = rendezvous.Add(tried_key, 1);
  const absl::Time deadline = absl::Now() + options.timeout;
  while (tried < options.world_size && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    tried = rendezvous.Add(tried_key, 0);
  }
  const int64_t opened = rendezvous.Add(opened_key, 0);
  // Every rank has the segment mapped or never will: its name is no longer needed.
  if (segment.ok() && options.rank == 0) (*segment)->Unlink();
  if (tried < options.world_size) {
    return absl::UnavailableError(absl::StrCat("only ", tried, " of ", options.world_size,
                                               " ranks answered within ", absl::FormatDuration(options.timeout)));
  }
  if (opened < options.world_size) {
    return absl::UnavailableError(absl::StrCat(opened, " of ", options.world_size, " ranks could map the segment",
                                               segment.ok() ? "" : absl::StrCat("; this one: ", segment.status().message())));
  }
  return segment;
}

SharedMemoryAllReduce::SharedMemoryAllReduce(const Options& options, std::string name, uint64_t nonce, void* mapping,
                                             size_t bytes)
    : options_(options),
      name_(std::move(name)),
      nonce_(nonce),
      mapping_(mapping),
      mapping_bytes_(bytes),
      header_(static_cast<Header*>(mapping)) {}

SharedMemoryAllReduce::~SharedMemoryAllReduce() {
  RankWord& me = header_->ranks[options_.rank];
  me.left.store(1);
  Futex(&me.phase, FUTEX_WAKE, INT_MAX, nullptr);
  munmap(mapping_, mapping_bytes_);
  if (options_.rank == 0 && !unlinked_) unlink(PathOf(options_, name_).c_str());
}

void SharedMemoryAllReduce::Unlink() {
  if (!unlinked_) unlink(PathOf(options_, name_).c_str());
  unlinked_ = true;
}

std::byte* SharedMemoryAllReduce::Slot(int rank, int set) const {
  return static_cast<std::byte*>(mapping_) + HeaderBytes() +
         (static_cast<size_t>(set) * options_.world_size + rank) * static_cast<size_t>(options_.slot_bytes);
}

absl::Status SharedMemoryAllReduce::WaitFor(int peer, uint32_t phase) {
  RankWord& word = header_->ranks[peer];
  for (int i = 0; i < kSpinIterations; ++i) {
    if (Reached(word.phase.load(std::memory_order_acquire), phase)) return absl::OkStatus();
    CpuRelax();
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (true) {
    if (Reached(word.phase.load(std::memory_order_acquire), phase)) return absl::OkStatus();
    if (word.left.load() != 0) {
      return absl::UnavailableError(absl::StrCat("rank ", peer, " left the group before this collective"));
    }
    if (ProcessGone(word.pid.load())) {
      return absl::UnavailableError(absl::StrCat("rank ", peer, " (process ", word.pid.load(), ") exited"));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout),
                                                      " waiting for rank ", peer));
    }
    const timespec slice = absl::ToTimespec(std::min(kLivenessInterval, deadline - now));
    // Counted before the last look, so that a rank publishing after it sees a sleeper and wakes it.
    word.sleepers.fetch_add(1);
    const uint32_t seen = word.phase.load();
    if (!Reached(seen, phase) && word.left.load() == 0) Futex(&word.phase, FUTEX_WAIT, seen, &slice);
    word.sleepers.fetch_sub(1);
  }
}

absl::Status SharedMemoryAllReduce::Arrive(uint32_t phase) {
  RankWord& me = header_->ranks[options_.rank];
  me.phase.store(phase);
  if (me.sleepers.load() != 0) Futex(&me.phase, FUTEX_WAKE, INT_MAX, nullptr);
  for (int peer = 0; peer < options_.world_size; ++peer) {
    if (peer == options_.rank) continue;
    if (absl::Status s = WaitFor(peer, phase); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SharedMemoryAllReduce::SumChunk(T* data, int64_t count) {
  const int world = options_.world_size;
  const int rank = options_.rank;
  const int set = static_cast<int>(chunks_ % 2);
  const uint32_t phase = 2 * chunks_;
  ++chunks_;
  auto slot = [&](int r) { return reinterpret_cast<T*>(Slot(r, set)); };
  auto slice_begin = [&](int r) { return count * r / world; };

  std::memcpy(slot(rank), data, static_cast<size_t>(count) * sizeof(T));
  if (absl::Status s = Arrive(phase + 1); !s.ok()) return s;

  // This rank's slice: summed in rank order into its own output, then published in its slot.
  const int64_t begin = slice_begin(rank);
  const int64_t end = slice_begin(rank + 1);
  T* out = data;
  const T* first = slot(0);
  for (int64_t i = begin; i < end; ++i) out[i] = first[i];
  for (int r = 1; r < world; ++r) {
    const T* in = slot(r);
    for (int64_t i = begin; i < end; ++i) out[i] += in[i];
  }
  std::memcpy(slot(rank) + begin, out + begin, static_cast<size_t>(end - begin) * sizeof(T));
  if (absl::Status s = Arrive(phase + 2); !s.ok()) return s;

  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    const int64_t b = slice_begin(r);
    std::memcpy(data + b, slot(r) + b, static_cast<size_t>(slice_begin(r + 1) - b) * sizeof(T));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SharedMemoryAllReduce::SumChunks(T* data, int64_t count) {
  if (!broken_.ok()) return broken_;
  if (count < 0) return absl::InvalidArgumentError("a negative element count");
  const int64_t per_chunk = options_.slot_bytes / static_cast<int64_t>(sizeof(T));
  // Every rank counts the same chunks, so that an empty array still meets its peers at one chunk.
  int64_t done = 0;
  do {
    const int64_t n = std::min(per_chunk, count - done);
    if (absl::Status s = SumChunk(data + done, n); !s.ok()) {
      broken_ = absl::Status(s.code(), absl::StrCat("shared-memory all-reduce of rank ", options_.rank, " of ",
                                                    options_.world_size, ": ", s.message()));
      return broken_;
    }
    done += n;
  } while (done < count);
  return absl::OkStatus();
}

absl::Status SharedMemoryAllReduce::Sum(float* data, int64_t count) { return SumChunks(data, count); }
absl::Status SharedMemoryAllReduce::Sum(double* data, int64_t count) { return SumChunks(data, count); }

}  // namespace fitrun::worker
