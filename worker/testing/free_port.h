// Test support: a TCP port on 127.0.0.1 that nobody listens on right now (bind port 0, read it,
// close), for tests that start servers or rendezvous on ports the OS picks.
#ifndef FITRUN_WORKER_TESTING_FREE_PORT_H_
#define FITRUN_WORKER_TESTING_FREE_PORT_H_

namespace fitrun::worker {

int FreeLoopbackPort();

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TESTING_FREE_PORT_H_
