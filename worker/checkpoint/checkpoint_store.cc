#include "worker/checkpoint/checkpoint_store.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "worker/memory/oom_error.h"
#include "worker/torch_compat.h"

namespace fitrun::worker {
namespace {

constexpr absl::string_view kPrefix = "ckpt-";
constexpr absl::string_view kSuffix = ".pt";
// Bumped when the archive's keys change; a checkpoint of another version is not loaded.
constexpr int64_t kFormatVersion = 1;

absl::Status ErrnoError(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Writes all of `data` to a new file at `path` and fsyncs it.
absl::Status WriteDurably(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(absl::StrCat("creating ", path));
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status status = ErrnoError(absl::StrCat("writing ", path));
      ::close(fd);
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status status = ErrnoError(absl::StrCat("fsync of ", path));
    ::close(fd);
    return status;
  }
  if (::close(fd) != 0) return ErrnoError(absl::StrCat("closing ", path));
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(absl::StrCat("opening ", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError(absl::StrCat("fsync of ", dir));
  return absl::OkStatus();
}

// Puts `data` at `path` in `dir` atomically and durably: written to a temporary file beside it,
// fsynced, renamed over `path`, and the directory fsynced, so a crash or a full disk leaves the old
// file or the new one, never a torn one.
absl::Status ReplaceDurably(const std::string& dir, const std::string& path, const std::string& data) {
  const std::string temp = absl::StrCat(path, ".tmp");
  if (absl::Status s = WriteDurably(temp, data); !s.ok()) {
    ::unlink(temp.c_str());  // best effort: a full disk should not also keep the partial file
    return s;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoError(absl::StrCat("renaming ", temp, " to ", path));
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(dir);
}

// Every checkpoint file ends with a trailer after LibTorch's archive: a magic, the archive's length
// and its CRC-32 (little-endian). Loading checks it before LibTorch parses a byte, because LibTorch
// 1.13's reader checks no checksum and can crash, not throw, on a damaged file (its TorchScript type
// parser dereferences garbage; found by checkpoint_fuzz). LibTorch's own readers ignore the trailer,
// so the file still opens with torch::load or torch.jit.load.
constexpr absl::string_view kTrailerMagic = "fitrunCK";
constexpr size_t kTrailerBytes = 8 + 8 + 4;

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < bytes.size();) {  // crc32 takes an unsigned int length
    const uInt chunk = static_cast<uInt>(std::min<size_t>(bytes.size() - at, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), chunk);
    at += chunk;
  }
  return static_cast<uint32_t>(crc);
}

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

uint64_t ReadLittleEndian(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  return value;
}

void AppendTrailer(std::string* archive) {
  const uint64_t length = archive->size();
  const uint32_t crc = Crc32(*archive);
  archive->append(kTrailerMagic.data(), kTrailerMagic.size());
  AppendLittleEndian(length, 8, archive);
  AppendLittleEndian(crc, 4, archive);
}

// The archive of a checkpoint file whose trailer matches it; DataLoss naming what is wrong otherwise.
absl::StatusOr<absl::string_view> VerifiedArchive(const std::string& path, absl::string_view file) {
  if (file.size() < kTrailerBytes || file.substr(file.size() - kTrailerBytes, 8) != kTrailerMagic) {
    return absl::DataLossError(absl::StrCat(path, ": no checkpoint trailer (a truncated or foreign file)"));
  }
  const absl::string_view trailer = file.substr(file.size() - kTrailerBytes);
  const uint64_t length = ReadLittleEndian(trailer.substr(8, 8));
  if (length != file.size() - kTrailerBytes) {
    return absl::DataLossError(absl::StrCat(path, ": the trailer records ", length, " bytes of archive, the file has ",
                                            file.size() - kTrailerBytes));
  }
  const absl::string_view archive = file.substr(0, length);
  if (Crc32(archive) != ReadLittleEndian(trailer.substr(16, 4))) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (the file was damaged after it was written)"));
  }
  return archive;
}

at::Tensor Scalar(int64_t value) { return at::full({1}, value, at::kLong); }

int64_t ReadScalar(torch::serialize::InputArchive& archive, const std::string& key) {
  at::Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

at::Tensor OnCpu(const at::Tensor& t) { return t.defined() ? t.to(at::kCPU) : t; }

// Module::save with every parameter and buffer copied to the CPU (a no-op for CPU tensors), in the
// same archive layout, so Module::load reads it and the file names no device.
void SaveModuleOnCpu(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  at::NoGradGuard no_grad;
  for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
    archive.write(parameter.key(), OnCpu(parameter.value()));
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    archive.write(buffer.key(), OnCpu(buffer.value()), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    SaveModuleOnCpu(*child.value(), child_archive);
    archive.write(child.key(), child_archive);
  }
}

// A stand-in for `optimizer` that saves the same archive with its state on the CPU: the same kind and
// options over the same parameters (the archive keys state by parameter), holding CPU copies of the
// state. Sharing the parameters copies none of them.
template <typename OptimizerT, typename OptionsT, typename StateT>
std::unique_ptr<torch::optim::Optimizer> CpuStateCopy(const OptimizerT& optimizer,
                                                      void (*to_cpu)(StateT& state)) {
  auto copy = std::make_unique<OptimizerT>(optimizer.param_groups(),
                                           static_cast<const OptionsT&>(optimizer.defaults()));
  for (const auto& [key, state] : optimizer.state()) {
    auto cpu_state = std::make_unique<StateT>(static_cast<const StateT&>(*state));
    to_cpu(*cpu_state);
    copy->state()[key] = std::move(cpu_state);
  }
  return copy;
}

template <typename AdamStateT>
void AdamStateToCpu(AdamStateT& s) {
  s.exp_avg(OnCpu(s.exp_avg()));
  s.exp_avg_sq(OnCpu(s.exp_avg_sq()));
  s.max_exp_avg_sq(OnCpu(s.max_exp_avg_sq()));
}

// The optimizer fitrun trains with (SGD, Adam, AdamW) with its state on the CPU; nullptr for another
// kind, which is then saved where its state lives (still loadable anywhere, as loads map every tensor
// to the model's device).
std::unique_ptr<torch::optim::Optimizer> OptimizerOnCpu(const torch::optim::Optimizer& optimizer) {
  namespace optim = torch::optim;
  at::NoGradGuard no_grad;
  if (const auto* sgd = dynamic_cast<const optim::SGD*>(&optimizer)) {
    return CpuStateCopy<optim::SGD, optim::SGDOptions, optim::SGDParamState>(
        *sgd, [](optim::SGDParamState& s) { s.momentum_buffer(OnCpu(s.momentum_buffer())); });
  }
  if (const auto* adam = dynamic_cast<const optim::Adam*>(&optimizer)) {
    return CpuStateCopy<optim::Adam, optim::AdamOptions, optim::AdamParamState>(*adam, &AdamStateToCpu);
  }
  if (const auto* adamw = dynamic_cast<const optim::AdamW*>(&optimizer)) {
    return CpuStateCopy<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState>(*adamw, &AdamStateToCpu);
  }
  return nullptr;
}

// The parameters `optimizer` steps, in its order (its groups' in turn).
std::vector<at::Tensor> ParametersOf(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> parameters;
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) parameters.push_back(p);
  }
  return parameters;
}

// An empty per-parameter state of `optimizer`'s kind, to read one saved state into; nullptr for a
// kind fitrun does not train with.
std::unique_ptr<torch::optim::OptimizerParamState> EmptyStateLike(const torch::optim::Optimizer& optimizer) {
  namespace optim = torch::optim;
  if (dynamic_cast<const optim::SGD*>(&optimizer) != nullptr) return std::make_unique<optim::SGDParamState>();
  if (dynamic_cast<const optim::Adam*>(&optimizer) != nullptr) return std::make_unique<optim::AdamParamState>();
  if (dynamic_cast<const optim::AdamW*>(&optimizer) != nullptr) return std::make_unique<optim::AdamWParamState>();
  return nullptr;
}

// An optimizer of `optimizer`'s kind and options over `parameters`; nullptr for another kind.
std::unique_ptr<torch::optim::Optimizer> SameKindOver(const torch::optim::Optimizer& optimizer,
                                                      std::vector<at::Tensor> parameters) {
  namespace optim = torch::optim;
  if (dynamic_cast<const optim::SGD*>(&optimizer) != nullptr) {
    return std::make_unique<optim::SGD>(std::move(parameters), static_cast<const optim::SGDOptions&>(optimizer.defaults()));
  }
  if (dynamic_cast<const optim::Adam*>(&optimizer) != nullptr) {
    return std::make_unique<optim::Adam>(std::move(parameters), static_cast<const optim::AdamOptions&>(optimizer.defaults()));
  }
  if (dynamic_cast<const optim::AdamW*>(&optimizer) != nullptr) {
    return std::make_unique<optim::AdamW>(std::move(parameters), static_cast<const optim::AdamWOptions&>(optimizer.defaults()));
  }
  return nullptr;
}

std::string ParameterKey(int model_index) { return absl::StrCat("parameter_", model_index); }

// Reads the states an optimizer shard file holds into `optimizer`, for those of its parameters
// (model indices `indices`, in its order) that the file has.
void ReadShardStates(torch::serialize::InputArchive& archive, const std::vector<int>& indices,
                     torch::optim::Optimizer& optimizer) {
  const std::vector<at::Tensor> parameters = ParametersOf(optimizer);
  for (size_t k = 0; k < parameters.size() && k < indices.size(); ++k) {
    torch::serialize::InputArchive saved;
    if (!archive.try_read(ParameterKey(indices[k]), saved)) continue;
    std::unique_ptr<torch::optim::OptimizerParamState> state = EmptyStateLike(optimizer);
    TORCH_CHECK(state != nullptr, "this optimizer kind has no sharded checkpoint states");
    state->serialize(saved);
    optimizer.state()[torch_compat::OptimizerStateKey(parameters[k])] = std::move(state);
  }
}

// The model indices of the parameters an unsharded `optimizer` over all of `model`'s steps.
std::vector<int> AllIndices(const torch::nn::Module& model) {
  std::vector<int> indices(model.parameters().size());
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int>(i);
  return indices;
}

// The archive in the checkpoint file at `path`, its tensors read onto `device`.
absl::Status ReadArchive(const std::string& path, const at::Device& device, torch::serialize::InputArchive& archive,
                         std::string& file) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  file.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<absl::string_view> verified = VerifiedArchive(path, file);
  if (!verified.ok()) return verified.status();
  archive.load_from(verified->data(), verified->size(), device);
  return absl::OkStatus();
}

// Where a checkpoint's tensors go when it is loaded into `model`: where the model already is. A
// parameter read from another device would be moved (set_data), which would detach it from the
// reducer's hooks and buckets; read on its own device it keeps its identity.
at::Device DeviceOf(const torch::nn::Module& model) {
  for (const at::Tensor& p : model.parameters()) return p.device();
  for (const at::Tensor& b : model.buffers()) return b.device();
  return at::Device(at::kCPU);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Create(const Options& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("checkpoint_dir: empty");
  if (options.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.checkpoint.keep_last: must be >= 1 (got ", options.keep_last, ")"));
  }
  // mkdir -p: the coordinator may not have created it.
  for (size_t slash = 1; slash <= options.dir.size(); ++slash) {
    if (slash != options.dir.size() && options.dir[slash] != '/') continue;
    const std::string prefix = options.dir.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError(absl::StrCat("checkpoint_dir: creating ", prefix));
    }
  }
  return std::unique_ptr<CheckpointStore>(new CheckpointStore(options));
}

std::string CheckpointStore::PathFor(int64_t step) const {
  return absl::StrFormat("%s/%s%010d%s", options_.dir, kPrefix, step, kSuffix);
}

std::string CheckpointStore::OptimizerShardPathFor(int64_t step, int rank, int world_size) const {
  return absl::StrFormat("%s.optimizer-%d-of-%d", PathFor(step), rank, world_size);
}

std::vector<int64_t> CheckpointStore::Steps() const {
  std::vector<int64_t> steps;
  DIR* dir = ::opendir(options_.dir.c_str());
  if (dir == nullptr) return steps;
  while (const dirent* entry = ::readdir(dir)) {
    absl::string_view name(entry->d_name);
    if (!absl::ConsumePrefix(&name, kPrefix) || !absl::ConsumeSuffix(&name, kSuffix)) continue;
    int64_t step = 0;
    if (absl::SimpleAtoi(name, &step) && step >= 0) steps.push_back(step);
  }
  ::closedir(dir);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<SavedCheckpoint> CheckpointStore::Save(const TrainingPosition& position,
                                                      const torch::nn::Module& model,
                                                      const torch::optim::Optimizer& optimizer,
                                                      const OptimizerShard* shard) {
  std::string data;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format_version", Scalar(kFormatVersion));
    archive.write("step", Scalar(position.step));
    archive.write("epoch", Scalar(position.epoch));
    archive.write("step_in_epoch", Scalar(position.step_in_epoch));
    {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      archive.write("cpu_rng_state", generator.get_state());
    }
    // CPU copies, so that the file loads on any device (and in a build without CUDA).
    torch::serialize::OutputArchive model_archive;
    SaveModuleOnCpu(model, model_archive);
    archive.write("model", model_archive);
    if (shard != nullptr) {
      archive.write("optimizer_shards", Scalar(shard->world_size));
    } else {
      torch::serialize::OutputArchive optimizer_archive;
      const std::unique_ptr<torch::optim::Optimizer> cpu_optimizer = OptimizerOnCpu(optimizer);
      (cpu_optimizer != nullptr ? *cpu_optimizer : optimizer).save(optimizer_archive);
      archive.write("optimizer", optimizer_archive);
    }
    std::ostringstream out;
    archive.save_to(out);
    data = out.str();
    AppendTrailer(&data);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("serializing checkpoint of step ", position.step, ": ", e.what()));
  }

  const std::string path = PathFor(position.step);
  if (absl::Status s = ReplaceDurably(options_.dir, path, data); !s.ok()) return s;

  const std::vector<int64_t> steps = Steps();
  for (size_t i = options_.keep_last; i < steps.size(); ++i) Remove(steps[i]);
  return SavedCheckpoint{position.step, path, static_cast<int64_t>(data.size())};
}

absl::StatusOr<SavedCheckpoint> CheckpointStore::SaveOptimizerShard(int64_t step, const OptimizerShard& shard,
                                                                    const torch::optim::Optimizer& optimizer) {
  std::string data;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format_version", Scalar(kFormatVersion));
    archive.write("step", Scalar(step));
    archive.write("rank", Scalar(shard.rank));
    archive.write("world_size", Scalar(shard.world_size));
    // CPU copies of the states, as in Save; keyed by model index, so that any partition reads them.
    const std::unique_ptr<torch::optim::Optimizer> cpu_optimizer = OptimizerOnCpu(optimizer);
    const torch::optim::Optimizer& states = cpu_optimizer != nullptr ? *cpu_optimizer : optimizer;
    const std::vector<at::Tensor> parameters = ParametersOf(states);
    if (parameters.size() != shard.parameter_indices.size()) {
      return absl::InternalError(absl::StrCat("optimizer shard of rank ", shard.rank, ": ", parameters.size(),
                                              " parameters but ", shard.parameter_indices.size(), " indices"));
    }
    for (size_t k = 0; k < parameters.size(); ++k) {
      const auto found = states.state().find(torch_compat::OptimizerStateKey(parameters[k]));
      if (found == states.state().end()) continue;  // not stepped yet, or a kind without state (plain SGD)
      torch::serialize::OutputArchive saved(archive.compilation_unit());
      found->second->serialize(saved);
      archive.write(ParameterKey(shard.parameter_indices[k]), saved);
    }
    std::ostringstream out;
    archive.save_to(out);
    data = out.str();
    AppendTrailer(&data);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("serializing rank ", shard.rank, "'s optimizer states of step ", step, ": ", e.what()));
  }
  const std::string path = OptimizerShardPathFor(step, shard.rank, shard.world_size);
  if (absl::Status s = ReplaceDurably(options_.dir, path, data); !s.ok()) return s;
  return SavedCheckpoint{step, path, static_cast<int64_t>(data.size())};
}

void CheckpointStore::Remove(int64_t step) const {
  const std::string path = PathFor(step);
  ::unlink(path.c_str());
  const std::string shards = absl::StrCat(path.substr(path.rfind('/') + 1), ".optimizer-");
  DIR* dir = ::opendir(options_.dir.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> doomed;
  while (const dirent* entry = ::readdir(dir)) {
    if (absl::StartsWith(entry->d_name, shards)) doomed.push_back(absl::StrCat(options_.dir, "/", entry->d_name));
  }
  ::closedir(dir);
  for (const std::string& file : doomed) ::unlink(file.c_str());
}

absl::StatusOr<TrainingPosition> CheckpointStore::Load(int64_t step, torch::nn::Module& model,
                                                       torch::optim::Optimizer& optimizer,
                                                       const OptimizerShard* shard) const {
  const std::string path = PathFor(step);
  std::string current;  // the file whose archive is being read, for the error
  try {
    current = path;
    torch::serialize::InputArchive archive;
    std::string file;
    if (absl::Status s = ReadArchive(path, DeviceOf(model), archive, file); !s.ok()) return s;
    const int64_t version = ReadScalar(archive, "format_version");
    if (version != kFormatVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": checkpoint format ", version, ", this worker reads ", kFormatVersion));
    }
    TrainingPosition position;
    position.step = ReadScalar(archive, "step");
    position.epoch = ReadScalar(archive, "epoch");
    position.step_in_epoch = ReadScalar(archive, "step_in_epoch");
    if (position.step != step) {
      return absl::DataLossError(absl::StrCat(path, ": holds step ", position.step));
    }
    at::Tensor rng_state;
    archive.read("cpu_rng_state", rng_state);
    rng_state = rng_state.to(at::kCPU);  // mapped to the model's device with everything else
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    const std::vector<int> indices = shard != nullptr ? shard->parameter_indices : AllIndices(model);

    model.load(model_archive);
    at::Tensor shards;
    if (archive.try_read("optimizer_shards", shards)) {
      // Every rank's file is read: the states this optimizer needs may be in any of them.
      const int64_t saved_ranks = shards.item<int64_t>();
      optimizer.state().clear();
      for (int64_t r = 0; r < saved_ranks; ++r) {
        current = OptimizerShardPathFor(step, static_cast<int>(r), static_cast<int>(saved_ranks));
        torch::serialize::InputArchive shard_archive;
        std::string shard_file;
        if (absl::Status s = ReadArchive(current, DeviceOf(model), shard_archive, shard_file); !s.ok()) {
          return absl::DataLossError(absl::StrCat(path, ": its optimizer shard ", s.message()));
        }
        if (ReadScalar(shard_archive, "step") != step || ReadScalar(shard_archive, "rank") != r ||
            ReadScalar(shard_archive, "world_size") != saved_ranks) {
          return absl::DataLossError(absl::StrCat(current, ": not the optimizer shard of rank ", r, " of ",
                                                  saved_ranks, " at step ", step));
        }
        ReadShardStates(shard_archive, indices, optimizer);
      }
      current = path;
    } else {
      torch::serialize::InputArchive optimizer_archive;
      archive.read("optimizer", optimizer_archive);
      if (shard == nullptr) {
        optimizer.load(optimizer_archive);
      } else {
        // Saved unsharded: read whole into an optimizer over every parameter, then keep this shard's.
        std::unique_ptr<torch::optim::Optimizer> whole = SameKindOver(optimizer, model.parameters());
        TORCH_CHECK(whole != nullptr, "this optimizer kind cannot take a share of an unsharded checkpoint");
        whole->load(optimizer_archive);
        optimizer.state().clear();
        for (const at::Tensor& p : ParametersOf(optimizer)) {
          const auto key = torch_compat::OptimizerStateKey(p);
          auto found = whole->state().find(key);
          if (found != whole->state().end()) optimizer.state()[key] = std::move(found->second);
        }
      }
    }
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rng_state);
    return position;
  } catch (const std::exception& e) {
    // The device that cannot hold the state is not a damaged file: the rank reports an OOM instead
    // of falling back to an older checkpoint, which would not fit either.
    if (IsOutOfMemory(e)) return StatusFromTorchException(e, absl::StrCat("loading ", current));
    return absl::DataLossError(absl::StrCat("loading ", current, ": ", e.what()));
  }
}

absl::StatusOr<std::optional<TrainingPosition>> CheckpointStore::LoadLatest(
    torch::nn::Module& model, torch::optim::Optimizer& optimizer) const {
  std::string skipped;
  for (int64_t step : Steps()) {
    absl::StatusOr<TrainingPosition> position = Load(step, model, optimizer);
    if (position.ok()) return std::optional<TrainingPosition>(*position);
    if (absl::IsResourceExhausted(position.status())) return position.status();  // an older one is no smaller
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", position.status().message());
  }
  if (!skipped.empty()) return absl::DataLossError(absl::StrCat("no checkpoint loads: ", skipped));
  return std::optional<TrainingPosition>();
}

}  // namespace fitrun::worker
