// What an out-of-memory error says, read from its text: a script's stderr line, or the message of
// the exception LibTorch threw. Needs no LibTorch.
#ifndef FITRUN_WORKER_MEMORY_OOM_MESSAGE_H_
#define FITRUN_WORKER_MEMORY_OOM_MESSAGE_H_

#include <cstdint>
#include <string>

namespace fitrun::worker {

// True when a stderr line or an exception's text reads as an out-of-memory error (PyTorch on CUDA or
// the capped CPU allocator, the CPU allocator's own refusal, Python's MemoryError, a CUDA, NCCL,
// cuBLAS or cuDNN allocation that failed).
bool LooksLikeOutOfMemory(const std::string& line);

// The size an out-of-memory line says was asked for, as the script saw it: PyTorch's "Tried to
// allocate 256.00 MiB" or the capped allocator's "tried to allocate 268435456 bytes"; 0 when the
// line names none.
int64_t RequestedBytesInOutOfMemory(const std::string& line);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MEMORY_OOM_MESSAGE_H_
