// An attempt's rendezvous, held by fitrund: the c10d TCPStore every rank of a local attempt meets
// at, served by fitrund itself rather than by rank 0.
//
// Why (docs/security.md, "The rendezvous"): the store c10d ranks meet at has no authentication,
// and rank 0 used to bind it on a port fitrund had picked (bound to port 0, then closed) a moment
// earlier. Any local account could take that port first, or connect to the store and read or
// write the keys the ranks exchange (the Gloo and NCCL addresses, so their gradients). Here the
// port is bound by fitrund from before the first rank starts until the attempt's end, so there is
// no moment to take it; and a connection is served only when the socket at its other end belongs to
// the job's Unix account (the owner of the loopback peer's socket, as the kernel lists it in
// /proc/net/tcp: the TCP counterpart of SO_PEERCRED), so no other account can join.
//
// The ranks are its clients, as torchrun's ranks are clients of its agent's store:
// TORCHELASTIC_USE_AGENT_STORE=True makes every rank of a script's `dist.init_process_group`
// (env://) a client, unchanged, and fitrun-worker reads the same variable. It speaks the wire
// protocol of LibTorch 1.13 and of 2.x's (a 2.x client's first bytes are VALIDATE and its magic
// number), every command either has, except 1.13's WATCH_KEY (no rank uses it; such a connection
// is closed).
//
// Bounded: connections, the bytes one key or value may have, and the bytes the store holds; past
// them the offending connection is closed (the job's own processes are the only clients).
//
// Thread-safety: one thread of its own serves every connection; the public methods may be called
// from any thread. The destructor closes every connection and joins the thread.
#ifndef FITRUN_SERVER_LAUNCHER_RENDEZVOUS_STORE_H_
#define FITRUN_SERVER_LAUNCHER_RENDEZVOUS_STORE_H_

#include <netinet/in.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace fitrun::server {

class RendezvousStore {
 public:
  struct Options {
    // The account whose sockets may connect (the job's, or fitrund's own when jobs run as it).
    uid_t uid = 0;
    // For fitrund's log: whose rendezvous this is ("j-000001 attempt 2").
    std::string name;
    int max_connections = 256;
    int64_t max_value_bytes = 16 << 20;
    int64_t max_stored_bytes = 64 << 20;
    // Where the kernel lists TCP sockets (tcp, tcp6).
    std::string proc_net = "/proc/net";
  };
  // Binds 127.0.0.1:0 and starts serving.
  static absl::StatusOr<std::unique_ptr<RendezvousStore>> Start(Options options);
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  int port() const { return port_; }
  // Connections refused because their socket was another account's.
  int64_t refused() const { return refused_.load(); }

 private:
  class Server;
  RendezvousStore(int port, std::unique_ptr<Server> server);

  const int port_;
  std::unique_ptr<Server> server_;
  std::atomic<int64_t> refused_{0};
  std::thread thread_;
};

// The owner (uid) of the TCP socket with IPv4 addresses `local` and `remote`, an IPv4 socket or an
// IPv6 one on the IPv4-mapped addresses, from the text of /proc/net/tcp and tcp6; -1 when neither
// lists it.
int64_t SocketOwnerUid(const std::string& tcp_text, const std::string& tcp6_text, const sockaddr_in& local,
                       const sockaddr_in& remote);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_RENDEZVOUS_STORE_H_
