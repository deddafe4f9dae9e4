#include "server/slurm/slurm_text.h"

#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/devices/virtual_cpu_devices.h"

namespace fitrun::server::slurm {
namespace {

bool IsKeyChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == ':' || c == '/'; }

// A line quoted in an error: whole when short, else its first 160 characters.
std::string Quote(absl::string_view text) {
  constexpr size_t kLimit = 160;
  return text.size() <= kLimit ? absl::StrCat("'", text, "'") : absl::StrCat("'", text.substr(0, kLimit), "...'");
}

// Slurm prints "(null)" for unset strings, "None" for no reason.
bool IsUnset(absl::string_view value) { return value.empty() || value == "(null)" || value == "None"; }

// The non-blank lines of `text` with their 1-based line numbers.
std::vector<std::pair<int, absl::string_view>> NonBlankLines(absl::string_view text) {
  std::vector<std::pair<int, absl::string_view>> lines;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) lines.emplace_back(number, line);
  }
  return lines;
}

const std::string* Find(const std::map<std::string, std::string>& fields, const std::string& key) {
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

// Commas split gres entries, except inside a socket list: "gpu:a100:2(S:0,2),shard:8".
std::vector<absl::string_view> SplitGresEntries(absl::string_view gres) {
  std::vector<absl::string_view> entries;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= gres.size(); ++i) {
    const char c = i < gres.size() ? gres[i] : ',';
    if (c == '(') ++depth;
    if (c == ')' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      absl::string_view entry = absl::StripAsciiWhitespace(gres.substr(start, i - start));
      if (!entry.empty()) entries.push_back(entry);
      start = i + 1;
    }
  }
  return entries;
}

}  // namespace

std::map<std::string, std::string> ParseOneliner(absl::string_view line) {
  // Where each key starts and where its '=' is.
  std::vector<std::pair<size_t, size_t>> keys;
  for (size_t i = 0; i < line.size(); ++i) {
    if (i > 0 && !absl::ascii_isspace(line[i - 1])) continue;
    if (!absl::ascii_isalpha(line[i])) continue;
    size_t end = i + 1;
    while (end < line.size() && IsKeyChar(line[end])) ++end;
    if (end < line.size() && line[end] == '=') keys.emplace_back(i, end);
  }
  std::map<std::string, std::string> fields;
  for (size_t k = 0; k < keys.size(); ++k) {
    const auto [begin, equals] = keys[k];
    const size_t value_end = k + 1 < keys.size() ? keys[k + 1].first : line.size();
    fields[std::string(line.substr(begin, equals - begin))] =
        std::string(absl::StripAsciiWhitespace(line.substr(equals + 1, value_end - equals - 1)));
  }
  return fields;
}

absl::StatusOr<std::vector<SlurmGpus>> ParseGpuGres(absl::string_view gres) {
  std::vector<SlurmGpus> gpus;
  gres = absl::StripAsciiWhitespace(gres);
  if (IsUnset(gres)) return gpus;
  for (absl::string_view entry : SplitGresEntries(gres)) {
    // "gpu:a100:2(S:0-1)" -> name gpu, type a100, count 2; the socket list is not needed.
    const absl::string_view spec = entry.substr(0, entry.find('('));
    std::vector<absl::string_view> fields = absl::StrSplit(spec, ':');
    if (fields[0] != "gpu") continue;
    std::vector<absl::string_view> rest;
    for (size_t i = 1; i < fields.size(); ++i) {
      if (fields[i] != "no_consume") rest.push_back(fields[i]);
    }
    SlurmGpus entry_gpus;
    entry_gpus.count = 1;  // Slurm's default for "gpu" and "gpu:TYPE".
    if (!rest.empty()) {
      int count = 0;
      const bool last_is_count = absl::SimpleAtoi(rest.back(), &count);
      if (rest.size() > 2 || (rest.size() == 2 && !last_is_count) || (last_is_count && count < 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Gres: ", Quote(entry), " is not gpu[:TYPE][:COUNT] (e.g. gpu:a100:2)"));
      }
      if (last_is_count) {
        entry_gpus.count = count;
        rest.pop_back();
      }
      if (!rest.empty()) entry_gpus.type = std::string(rest[0]);
    }
    if (entry_gpus.count > 0) gpus.push_back(std::move(entry_gpus));
  }
  return gpus;
}

bool SlurmNode::Usable() const {
  const std::string upper = absl::AsciiStrToUpper(state);
  if (upper.empty()) return false;
  // Suffixes of the compact form: not responding, powered off, powering down, maintenance.
  if (upper.find_first_of("*~%$") != std::string::npos) return false;
  static const std::set<std::string> kUnusableFlags = {"NOT_RESPONDING", "NO_RESPOND", "FUTURE", "MAINT",
                                                       "UNKNOWN",        "INVAL",      "INVALID_REG"};
  for (absl::string_view flag : absl::StrSplit(upper, '+')) {
    flag = absl::StripAsciiWhitespace(flag);
    // DOWN covers POWERED_DOWN, POWER_DOWN and POWERING_DOWN; DRAIN covers DRAINING and DRAINED.
    if (absl::StrContains(flag, "DOWN") || absl::StrContains(flag, "DRAIN") || absl::StrContains(flag, "FAIL")) {
      return false;
    }
    if (kUnusableFlags.count(std::string(flag))) return false;
  }
  return true;
}

absl::StatusOr<std::vector<SlurmNode>> ParseNodes(absl::string_view output) {
  std::vector<SlurmNode> nodes;
  for (const auto& [number, line] : NonBlankLines(output)) {
    if (absl::StartsWith(line, "No nodes in the system")) continue;
    const std::map<std::string, std::string> fields = ParseOneliner(line);
    const std::string* name = Find(fields, "NodeName");
    if (name == nullptr || name->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scontrol show node: line ", number, ": no NodeName= in ", Quote(line)));
    }
    const std::string where = absl::StrCat("scontrol show node: line ", number, " (node ", *name, "): ");
    SlurmNode node;
    node.name = *name;
    const std::string* addr = Find(fields, "NodeAddr");
    node.addr = addr != nullptr && !IsUnset(*addr) ? *addr : node.name;

    const std::string* state = Find(fields, "State");
    if (state == nullptr || state->empty()) return absl::InvalidArgumentError(absl::StrCat(where, "no State="));
    node.state = *state;

    // CPUEfctv (22.05 on) leaves out cores reserved for Slurm's daemons; CPUTot counts them.
    const std::string* cpus = Find(fields, "CPUEfctv");
    const char* cpus_key = "CPUEfctv";
    if (cpus == nullptr) {
      cpus = Find(fields, "CPUTot");
      cpus_key = "CPUTot";
    }
    if (cpus == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, "no CPUTot= (nor CPUEfctv=)"));
    if (!absl::SimpleAtoi(*cpus, &node.cpus) || node.cpus < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, cpus_key, "=", Quote(*cpus), " is not a CPU count"));
    }

    if (const std::string* memory = Find(fields, "RealMemory"); memory != nullptr && !memory->empty()) {
      int64_t mib = 0;
      if (!absl::SimpleAtoi(*memory, &mib) || mib < 0 || mib > (int64_t{1} << 43)) {
        return absl::InvalidArgumentError(absl::StrCat(where, "RealMemory=", Quote(*memory), " is not a size in MiB"));
      }
      node.real_memory_bytes = mib << 20;
    }

    if (const std::string* gres = Find(fields, "Gres"); gres != nullptr) {
      absl::StatusOr<std::vector<SlurmGpus>> gpus = ParseGpuGres(*gres);
      if (!gpus.ok()) return absl::InvalidArgumentError(absl::StrCat(where, gpus.status().message()));
      node.gpus = *std::move(gpus);
    }

    if (const std::string* partitions = Find(fields, "Partitions"); partitions != nullptr && !IsUnset(*partitions)) {
      for (absl::string_view partition : absl::StrSplit(*partitions, ',', absl::SkipWhitespace())) {
        node.partitions.emplace_back(absl::StripAsciiWhitespace(partition));
      }
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

bool SlurmJobStatus::Ended() const {
  static const std::set<std::string> kEnded = {"COMPLETED", "FAILED",        "CANCELLED", "TIMEOUT",
                                               "NODE_FAIL", "PREEMPTED",     "BOOT_FAIL", "DEADLINE",
                                               "REVOKED",   "OUT_OF_MEMORY"};
  return kEnded.count(state) > 0;
}

bool SlurmJobStatus::Pending() const {
  static const std::set<std::string> kPending = {"PENDING",      "CONFIGURING",  "REQUEUED",
                                                 "REQUEUE_HOLD", "REQUEUE_FED",  "SPECIAL_EXIT",
                                                 "RESV_DEL_HOLD", "POWER_UP_NODE"};
  return kPending.count(state) > 0;
}

namespace {

// "CANCELLED by 0" -> "CANCELLED".
std::string StateWord(absl::string_view state) {
  state = absl::StripAsciiWhitespace(state);
  return std::string(state.substr(0, state.find(' ')));
}

}  // namespace

absl::StatusOr<SlurmJobStatus> ParseShowJob(absl::string_view text) {
  const auto lines = NonBlankLines(text);
  if (lines.empty()) return absl::InvalidArgumentError("scontrol show job: no output");
  const absl::string_view line = lines.front().second;
  const std::map<std::string, std::string> fields = ParseOneliner(line);
  SlurmJobStatus job;
  const std::string* id = Find(fields, "JobId");
  if (id == nullptr || id->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("scontrol show job: no JobId= in ", Quote(line)));
  }
  job.id = *id;
  const std::string where = absl::StrCat("scontrol show job (job ", job.id, "): ");
  const std::string* state = Find(fields, "JobState");
  if (state == nullptr || state->empty()) return absl::InvalidArgumentError(absl::StrCat(where, "no JobState="));
  job.state = StateWord(*state);
  if (const std::string* reason = Find(fields, "Reason"); reason != nullptr && !IsUnset(*reason)) job.reason = *reason;
  if (const std::string* nodes = Find(fields, "NodeList"); nodes != nullptr && !IsUnset(*nodes)) job.nodes = *nodes;
  if (const std::string* exit = Find(fields, "ExitCode"); exit != nullptr && !exit->empty()) {
    std::vector<absl::string_view> parts = absl::StrSplit(*exit, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &job.exit_code) ||
        !absl::SimpleAtoi(parts[1], &job.exit_signal)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "ExitCode=", Quote(*exit), " is not CODE:SIGNAL"));
    }
  }
  if (const std::string* user = Find(fields, "UserId"); user != nullptr) {
    // name(uid)
    const size_t open = user->rfind('(');
    if (open == std::string::npos || user->back() != ')' ||
        !absl::SimpleAtoi(absl::string_view(*user).substr(open + 1, user->size() - open - 2), &job.user_id)) {
      job.user_id = -1;
    }
  }
  if (const std::string* name = Find(fields, "JobName"); name != nullptr) job.name = *name;
  if (const std::string* comment = Find(fields, "Comment"); comment != nullptr && !IsUnset(*comment)) {
    job.comment = *comment;
  }
  return job;
}

absl::StatusOr<std::vector<SlurmJobStatus>> ParseSqueue(absl::string_view output) {
  std::vector<SlurmJobStatus> jobs;
  for (const auto& [number, line] : NonBlankLines(output)) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, '|');
    if (parts.size() != 4 || absl::StripAsciiWhitespace(parts[0]).empty() ||
        absl::StripAsciiWhitespace(parts[1]).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("squeue: line ", number, ": ", Quote(line),
                                                     " is not id|state|reason|nodes (--format=", kSqueueFormat,
                                                     ")"));
    }
    SlurmJobStatus job;
    job.id = std::string(absl::StripAsciiWhitespace(parts[0]));
    job.state = StateWord(parts[1]);
    const absl::string_view reason = absl::StripAsciiWhitespace(parts[2]);
    const absl::string_view nodes = absl::StripAsciiWhitespace(parts[3]);
    if (!IsUnset(reason)) job.reason = std::string(reason);
    if (!IsUnset(nodes)) job.nodes = std::string(nodes);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<std::string> ParseSbatchParsable(absl::string_view out) {
  const auto lines = NonBlankLines(out);
  // Only the id is printed; anything a site's plugins add would come before it.
  const absl::string_view last = lines.empty() ? absl::string_view() : lines.back().second;
  const absl::string_view id = absl::StripAsciiWhitespace(last.substr(0, last.find(';')));
  bool digits = !id.empty();
  for (char c : id) digits = digits && absl::ascii_isdigit(c);
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("sbatch --parsable: expected a job id (\"<jobid>\" or \"<jobid>;<cluster>\"), got ",
                     Quote(absl::StripAsciiWhitespace(out))));
  }
  return std::string(id);
}

absl::StatusOr<std::map<std::string, int64_t>> ParseGpuMemoryFlag(absl::string_view flag) {
  constexpr absl::string_view kForm = "write TYPE=SIZE,... with the GPU types of the nodes' Gres, e.g. "
                                      "--slurm_gpu_memory=a100=80GiB,t4=16GiB (untyped GPUs: gpu=16GiB)";
  std::map<std::string, int64_t> table;
  for (absl::string_view entry : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t equals = entry.find('=');
    const absl::string_view type =
        absl::StripAsciiWhitespace(entry.substr(0, equals == absl::string_view::npos ? entry.size() : equals));
    if (equals == absl::string_view::npos || type.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slurm_gpu_memory: ", Quote(entry), " is not TYPE=SIZE; ", kForm));
    }
    absl::StatusOr<int64_t> bytes = ParseByteSize(absl::StripAsciiWhitespace(entry.substr(equals + 1)));
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slurm_gpu_memory: GPU type '", type, "': ", bytes.status().message()));
    }
    if (!table.emplace(std::string(type), *bytes).second) {
      return absl::InvalidArgumentError(absl::StrCat("--slurm_gpu_memory: GPU type '", type, "' is given twice"));
    }
  }
  return table;
}

std::string GpuMemoryKey(const SlurmGpus& gpus) { return gpus.type.empty() ? "gpu" : gpus.type; }

absl::StatusOr<std::pair<int, int64_t>> ParseVirtualDevicesFlag(absl::string_view flag) {
  flag = absl::StripAsciiWhitespace(flag);
  const size_t x = flag.find('x');
  int count = 0;
  if (x == absl::string_view::npos || !absl::SimpleAtoi(flag.substr(0, x), &count) || count < 1 || count > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm_virtual_devices: ", Quote(flag),
                                                   " is not COUNTxSIZE with COUNT from 1 to 1024 (e.g. 2x4GiB)"));
  }
  absl::StatusOr<int64_t> bytes = ParseByteSize(flag.substr(x + 1));
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm_virtual_devices: ", bytes.status().message()));
  }
  return std::make_pair(count, *bytes);
}

}  // namespace fitrun::server::slurm
