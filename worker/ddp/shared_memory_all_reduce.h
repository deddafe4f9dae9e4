#ifndef FITRUN_WORKER_DDP_SHARED_MEMORY_ALL_REDUCE_H_
#define FITRUN_WORKER_DDP_SHARED_MEMORY_ALL_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fitrun::worker {

// The sum all-reduce of ranks on one machine, through a POSIX shared-memory segment they all map:
// each rank copies its values into a slot of its own, sums one slice of every slot (in rank order, so
// every element is summed the same way whichever rank computes it), and copies the others' summed
// slices back. Two waits per chunk on each other's progress words, no thread and no socket: on a
// machine whose cores the ranks' compute already fills, Gloo over loopback (kernel copies, its own
// thread to be scheduled on both sides) is most of a small model's step.
//
// Ranks join through their group's rendezvous store (Join): rank 0 creates the segment under a fresh
// name, the others open it by that name, and all take it only when every rank could, so that ranks on
// several machines fall back to their other transport together. Once every rank has answered, the name
// is removed, so that a rank killed later leaves nothing behind.
//
// A wait fails instead of hanging: when a peer has left (its object destroyed, or its process gone)
// before reaching the point waited for, or after `timeout`. After a failure every later call fails.
// One collective at a time: the object is owned by the rank's training thread.
class SharedMemoryAllReduce {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    absl::Duration timeout = absl::Seconds(60);
    // Each rank's slot; a longer array is summed in chunks of this many bytes. The segment is twice
    // world_size slots (consecutive chunks alternate between two sets, so that a chunk's slots are
    // only written again once every rank has finished reading them).
    int64_t slot_bytes = int64_t{1} << 20;
    // Where the segment's file lives: a memory file system every rank of one machine sees (/dev/shm,
    // POSIX shared memory's). Ranks given different directories behave as ranks of different machines.
    std::string directory = "/dev/shm";
  };

  // What Join needs of the group's rendezvous store (c10d's Store in the worker, a map in tests).
  class Rendezvous {
   public:
    virtual ~Rendezvous() = default;
    virtual void Set(const std::string& key, const std::string& value) = 0;
    // Blocks until `key` is set (the store's own timeout bounds it).
    virtual std::string Get(const std::string& key) = 0;
    // Adds `delta` to the counter `key` (0 when unset) and returns the sum.
    virtual int64_t Add(const std::string& key, int64_t delta) = 0;
  };

  // The most ranks a segment serves; more fall back to the caller's other transport.
  static constexpr int kMaxRanks = 64;

  // Every rank of the group calls it once, with the group's rendezvous (keys under `key_prefix`). The
  // segment when every rank could map it; otherwise UNAVAILABLE on every rank, saying how many could.
  // Waits at most options.timeout for the others' answers.
  static absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> Join(Rendezvous& rendezvous,
                                                                     const std::string& key_prefix,
                                                                     const Options& options);

  // Rank 0: a new segment under a name no other segment has (O_EXCL), readable by this user only.
  static absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> Create(const Options& options);

  // The other ranks: rank 0's segment, checked to be the one it made (its owner is this process's
  // user, its size and world size are the options', it carries `nonce`).
  static absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> Open(const std::string& name, uint64_t nonce,
                                                                     const Options& options);

  // Marks this rank as gone, so that peers waiting on it fail at once, and unmaps the segment.
  ~SharedMemoryAllReduce();

  SharedMemoryAllReduce(const SharedMemoryAllReduce&) = delete;
  SharedMemoryAllReduce& operator=(const SharedMemoryAllReduce&) = delete;

  const std::string& name() const { return name_; }
  uint64_t nonce() const { return nonce_; }

  // Removes the segment's name (rank 0, once every rank has opened it); the mappings stay.
  void Unlink();

  // Replaces data[0..count) on every rank with the sum over ranks, element by element. Every rank
  // calls it with the same count, in the same order as its other sums.
  absl::Status Sum(float* data, int64_t count);
  absl::Status Sum(double* data, int64_t count);

 private:
  struct Header;
  static size_t HeaderBytes();
  static size_t SegmentBytes(const Options& options);
  SharedMemoryAllReduce(const Options& options, std::string name, uint64_t nonce, void* mapping, size_t bytes);

  template <typename T>
  absl::Status SumChunks(T* data, int64_t count);
  template <typename T>
  absl::Status SumChunk(T* data, int64_t count);
  // Publishes this rank's progress `phase` and waits until every rank has published at least it.
  absl::Status Arrive(uint32_t phase);
  absl::Status WaitFor(int peer, uint32_t phase);
  std::byte* Slot(int rank, int set) const;

  Options options_;
  std::string name_;
  uint64_t nonce_ = 0;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  Header* header_ = nullptr;
  bool unlinked_ = false;
  // Chunks summed so far: every rank counts the same, which keys the phases and the slot set.
  uint32_t chunks_ = 0;
  absl::Status broken_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_SHARED_MEMORY_ALL_REDUCE_H_
