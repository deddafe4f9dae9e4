// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read the port, close), the one
// picker of fitrund, the worker and their tests: for a listener that must be named before it binds
// (fitrund's --listen=HOST:0, a script probe's one-rank store, a test's server). Another process may
// take the port in between, so never use it for what another account must not take: an attempt's
// rendezvous is a RendezvousStore, held from bind to use.
#ifndef FITRUN_PROTO_CONTRACT_FREE_PORT_H_
#define FITRUN_PROTO_CONTRACT_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace fitrun::contract {

absl::StatusOr<int> PickFreeLoopbackPort();

}  // namespace fitrun::contract

#endif  // FITRUN_PROTO_CONTRACT_FREE_PORT_H_
