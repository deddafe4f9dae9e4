// What a spec gets for a field it leaves unset: each default once, here. ApplyJobSpecDefaults
// (spec_rules.cc) sets them; docs/job-specs.md's table "Defaults" lists them, checked against this
// table by //tests:spec_defaults_doc_test.
#ifndef FITRUN_SERVER_CORE_SPECS_SPEC_DEFAULTS_H_
#define FITRUN_SERVER_CORE_SPECS_SPEC_DEFAULTS_H_

namespace fitrun::server::spec_defaults {

inline constexpr int kMinDevices = 1;
inline constexpr double kMemoryHeadroom = 0.1;
// Tasks per rank, threads included (resources.max_processes).
inline constexpr int kMaxProcessesPerRank = 512;
inline constexpr int kKeepLastCheckpoints = 2;
// PyTorch's DDP default bucket size.
inline constexpr int kBucketCapMb = 25;
inline constexpr int kCollectiveTimeoutSeconds = 60;
// PyTorch's PowerSGDState defaults.
inline constexpr int kPowerSgdRank = 1;
inline constexpr int kPowerSgdStartIter = 1000;
inline constexpr int kMaxRestarts = 3;
inline constexpr int kMaxOomRetries = 3;
inline constexpr int kHeartbeatTimeoutSeconds = 60;
inline constexpr int kStopGraceSeconds = 2;

// The table docs/job-specs.md shows: each spec field and its default.
struct Default {
  const char* field;
  double value;
};
inline constexpr Default kTable[] = {
    {"resources.min_devices", kMinDevices},
    {"resources.memory_headroom", kMemoryHeadroom},
    {"resources.max_processes", kMaxProcessesPerRank},
    {"checkpoint.keep_last", kKeepLastCheckpoints},
    {"ddp.bucket_cap_mb", kBucketCapMb},
    {"ddp.collective_timeout_seconds", kCollectiveTimeoutSeconds},
    {"ddp.powersgd_rank", kPowerSgdRank},
    {"ddp.powersgd_start_iter", kPowerSgdStartIter},
    {"fault_tolerance.max_restarts", kMaxRestarts},
    {"fault_tolerance.max_oom_retries", kMaxOomRetries},
    {"fault_tolerance.heartbeat_timeout_seconds", kHeartbeatTimeoutSeconds},
    {"fault_tolerance.stop_grace_seconds", kStopGraceSeconds},
};

}  // namespace fitrun::server::spec_defaults

#endif  // FITRUN_SERVER_CORE_SPECS_SPEC_DEFAULTS_H_
