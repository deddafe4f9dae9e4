// The fakes of the core's edges, now one header each in server/core/testing/. This header only gathers
// them for the tests not yet moved to those headers (server/web's); include the one you need instead.
#ifndef FITRUN_SERVER_CORE_FAKES_H_
#define FITRUN_SERVER_CORE_FAKES_H_

#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_memory_probe.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/testing/recording_metrics.h"

#endif  // FITRUN_SERVER_CORE_FAKES_H_
