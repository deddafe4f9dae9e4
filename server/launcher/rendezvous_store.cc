#include "server/launcher/rendezvous_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "proto/contract/log.h"

namespace fitrun::server {
namespace {

// What a LibTorch 2.x client sends first: VALIDATE and this number.
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// Keys or values one command may name at once.
constexpr uint64_t kMaxArguments = 100000;
// Replies a connection has not read yet, past which it is closed.
constexpr size_t kMaxUnsent = 64 << 20;

enum class Op {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey, kDelete, kAppend, kMultiGet,
  kMultiSet, kCancelWait, kPing, kQueuePush, kQueuePop, kQueueLen, kListKeys, kUnknown,
};

// The command bytes of LibTorch 1.13 (c10d::detail::QueryType there) and of 2.x (2.11's, which only
// appended to it since VALIDATE came first).
Op V1Op(uint8_t byte) {
  static constexpr Op kOps[] = {Op::kSet, Op::kCompareSet, Op::kGet, Op::kAdd, Op::kCheck,
                                Op::kWait, Op::kNumKeys, Op::kWatchKey, Op::kDelete};
  return byte < sizeof(kOps) / sizeof(kOps[0]) ? kOps[byte] : Op::kUnknown;
}
Op V2Op(uint8_t byte) {
  static constexpr Op kOps[] = {Op::kValidate, Op::kSet, Op::kCompareSet, Op::kGet, Op::kAdd, Op::kCheck,
                                Op::kWait, Op::kNumKeys, Op::kDelete, Op::kAppend, Op::kMultiGet, Op::kMultiSet,
                                Op::kCancelWait, Op::kPing, Op::kQueuePush, Op::kQueuePop, Op::kQueueLen,
                                Op::kListKeys};
  return byte < sizeof(kOps) / sizeof(kOps[0]) ? kOps[byte] : Op::kUnknown;
}

// Reads a command's little-endian fields off what a connection sent; a read past the end means the
// command has not all arrived yet (incomplete()), a field past the bounds that it never may (bad()).
class Reader {
 public:
  Reader(const std::string& bytes, int64_t max_value_bytes) : bytes_(bytes), max_value_bytes_(max_value_bytes) {}
  template <typename T>
  bool Value(T* value) {
    if (!Need(sizeof(T))) return false;
    std::memcpy(value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(std::string* out) {
    uint64_t size = 0;
    if (!Value(&size)) return false;
    if (size > static_cast<uint64_t>(max_value_bytes_)) {
      bad_ = true;
      return false;
    }
    if (!Need(size)) return false;
    out->assign(bytes_, at_, size);
    at_ += size;
    return true;
  }
  bool Count(uint64_t* count) {
    if (!Value(count)) return false;
    if (*count > kMaxArguments) bad_ = true;
    return !bad_;
  }
  bool Keys(std::vector<std::string>* keys) {
    uint64_t count = 0;
    if (!Count(&count)) return false;
    keys->resize(count);
    for (std::string& key : *keys) {
      if (!Bytes(&key)) return false;
    }
    return true;
  }
  size_t consumed() const { return at_; }
  bool bad() const { return bad_; }

 private:
  bool Need(size_t n) { return !bad_ && bytes_.size() - at_ >= n; }
  const std::string& bytes_;
  const int64_t max_value_bytes_;
  size_t at_ = 0;
  bool bad_ = false;
};

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}
void PutBytes(std::string* out, const std::string& bytes) {
  Put<uint64_t>(out, bytes.size());
  out->append(bytes);
}

std::string Address(const sockaddr_in& address) {
  return absl::StrFormat("%08X:%04X", address.sin_addr.s_addr, ntohs(address.sin_port));
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

int64_t SocketOwnerUid(const std::string& tcp_text, const std::string& tcp6_text, const sockaddr_in& local,
                       const sockaddr_in& remote) {
  // tcp6 prints an IPv4-mapped address as its four words in host order: ::ffff:a.b.c.d.
  constexpr char kMapped[] = "0000000000000000FFFF0000";
  const std::pair<const std::string*, std::string> tables[] = {{&tcp_text, ""}, {&tcp6_text, kMapped}};
  for (const auto& [text, prefix] : tables) {
    const std::string want_local = prefix + Address(local);
    const std::string want_remote = prefix + Address(remote);
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 8 || fields[1] != want_local || fields[2] != want_remote) continue;
      int64_t uid = -1;
      if (absl::SimpleAtoi(fields[7], &uid)) return uid;
    }
  }
  return -1;
}

class RendezvousStore::Server {
 public:
  Server(Options options, int listen_fd, int wake_fd, std::atomic<int64_t>* refused)
      : options_(std::move(options)), listen_fd_(listen_fd), wake_fd_(wake_fd), refused_(refused) {}
  ~Server() {
    for (auto& [fd, connection] : connections_) close(fd);
    close(listen_fd_);
    close(wake_fd_);
  }

  void Stop() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  void Run() {
    while (true) {
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      for (const auto& [fd, connection] : connections_) {
        fds.push_back({fd, static_cast<short>(POLLIN | (connection.out.empty() ? 0 : POLLOUT)), 0});
      }
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        contract::LogError("rendezvous of %s: poll: %s", options_.name, std::strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents & POLLIN) Accept();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = connections_.find(fds[i].fd);
        if (it == connections_.end()) continue;
        if (!Serve(it->second, fds[i].revents)) {
          close(it->first);
          connections_.erase(it);
        }
      }
      // A command of one connection may be what another's wait waited for.
      for (auto it = connections_.begin(); it != connections_.end();) {
        if (AnswerWait(it->second) && Flush(it->second)) {
          ++it;
        } else {
          close(it->first);
          it = connections_.erase(it);
        }
      }
    }
  }

 private:
  enum class Dialect { kUnknown, kV1, kV2 };
  struct Connection {
    int fd = -1;
    Dialect dialect = Dialect::kUnknown;
    std::string in;
    std::string out;
    // The keys a WAIT waits for; empty when it waits for nothing.
    std::vector<std::string> waiting;
  };

  void Accept() {
    sockaddr_in peer{};
    socklen_t length = sizeof(peer);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    sockaddr_in local{};
    length = sizeof(local);
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
    // The client's socket: its local address is the peer's, its remote one ours. c10d's clients
    // connect from IPv6 sockets (127.0.0.1 mapped), which the kernel lists in tcp6.
    const int64_t uid = SocketOwnerUid(ReadAll(options_.proc_net + "/tcp"), ReadAll(options_.proc_net + "/tcp6"), peer, local);
    if (uid != static_cast<int64_t>(options_.uid) || static_cast<int>(connections_.size()) >= options_.max_connections) {
      if (refused_->fetch_add(1) < 3) {
        contract::LogError("rendezvous of %s: refused a connection from %s:%d (%s)", options_.name,
                           inet_ntoa(peer.sin_addr), ntohs(peer.sin_port),
                           uid != static_cast<int64_t>(options_.uid)
                               ? absl::StrCat("its socket is uid ", uid, "'s, not the job's account's, ", options_.uid)
                               : std::string("too many connections"));
      }
      close(fd);
      return;
    }
    connections_[fd].fd = fd;
  }

  // Reads what arrived, runs every whole command, sends the replies; false: close it.
  bool Serve(Connection& connection, short events) {
    if (events & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[65536];
      const ssize_t got = recv(connection.fd, buffer, sizeof(buffer), 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return false;
      if (got > 0) connection.in.append(buffer, static_cast<size_t>(got));
      if (connection.in.size() > static_cast<size_t>(options_.max_value_bytes) * 2 + 4096) return false;
    }
    return Drain(connection) && Flush(connection);
  }

  // Runs every whole command that arrived; while a WAIT waits, only its cancellation (a 2.x client
  // sends it when its own timeout passes). False: a command no client sends, or past the bounds.
  bool Drain(Connection& connection) {
    while (!connection.in.empty()) {
      if (!connection.waiting.empty() &&
          !(connection.dialect == Dialect::kV2 && V2Op(static_cast<uint8_t>(connection.in[0])) == Op::kCancelWait)) {
        break;
      }
      const std::optional<bool> ran = RunOne(connection);
      if (!ran.has_value()) return false;
      if (!*ran) break;  // the rest has not arrived yet
    }
    return true;
  }

  bool Flush(Connection& connection) {
    if (connection.out.empty()) return true;
    const ssize_t sent = send(connection.fd, connection.out.data(), connection.out.size(), MSG_NOSIGNAL);
    if (sent < 0) return errno == EAGAIN || errno == EINTR;
    connection.out.erase(0, static_cast<size_t>(sent));
    return connection.out.size() <= kMaxUnsent;
  }

  bool Present(const std::string& key) const {
    if (values_.count(key) > 0) return true;
    auto queue = queues_.find(key);
    return queue != queues_.end() && !queue->second.empty();
  }

  // A WAIT whose keys are all there now is answered.
  bool AnswerWait(Connection& connection) {
    if (connection.waiting.empty()) return true;
    for (const std::string& key : connection.waiting) {
      if (!Present(key)) return true;
    }
    connection.waiting.clear();
    Put<uint8_t>(&connection.out, 0);  // STOP_WAITING
    return Drain(connection);  // what was sent behind the wait
  }

  bool Store(const std::string& key, std::string value) {
    auto it = values_.find(key);
    const int64_t before = it == values_.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
    const int64_t after = static_cast<int64_t>(key.size() + value.size());
    if (stored_bytes_ - before + after > options_.max_stored_bytes) return false;
    stored_bytes_ += after - before;
    values_[key] = std::move(value);
    return true;
  }

  // One whole command off the front of `connection.in`: true when it ran, false when it has not all
  // arrived, nullopt when it is one no client sends (or past the bounds).
  std::optional<bool> RunOne(Connection& connection) {
    std::string& in = connection.in;
    if (connection.dialect == Dialect::kUnknown) {
      if (static_cast<uint8_t>(in[0]) != 0) {
        connection.dialect = Dialect::kV1;
      } else if (in.size() < 5) {
        return false;
      } else {
        uint32_t magic = 0;
        std::memcpy(&magic, in.data() + 1, sizeof(magic));
        // A 1.13 SET starts with the same 0, then its key's length: never this large.
        connection.dialect = magic == kValidationMagic ? Dialect::kV2 : Dialect::kV1;
      }
    }
    Reader r(in, options_.max_value_bytes);
    uint8_t byte = 0;
    if (!r.Value(&byte)) return false;
    const Op op = connection.dialect == Dialect::kV2 ? V2Op(byte) : V1Op(byte);
    std::string& out = connection.out;
    std::string key, value, other;
    std::vector<std::string> keys;
    bool whole = true;
    switch (op) {
      case Op::kValidate: {
        uint32_t magic = 0;
        whole = r.Value(&magic);
        if (whole && magic != kValidationMagic) return std::nullopt;
        break;
      }
      case Op::kPing: {
        uint32_t nonce = 0;
        if ((whole = r.Value(&nonce))) Put(&out, nonce);
        break;
      }
      case Op::kSet:
        if ((whole = r.Bytes(&key) && r.Bytes(&value)) && !Store(key, std::move(value))) return std::nullopt;
        break;
      case Op::kCompareSet:
        if ((whole = r.Bytes(&key) && r.Bytes(&value) && r.Bytes(&other))) {
          auto it = values_.find(key);
          if (it == values_.end() && value.empty()) {
            if (!Store(key, other)) return std::nullopt;
            PutBytes(&out, other);
          } else if (it == values_.end()) {
            PutBytes(&out, value);  // as c10d's own server answers: the expected value
          } else {
            if (it->second == value && !Store(key, other)) return std::nullopt;
            PutBytes(&out, values_[key]);
          }
        }
        break;
      case Op::kGet:
        if ((whole = r.Bytes(&key))) {
          auto it = values_.find(key);
          PutBytes(&out, it == values_.end() ? std::string() : it->second);
        }
        break;
      case Op::kAdd: {
        int64_t delta = 0;
        if ((whole = r.Bytes(&key) && r.Value(&delta))) {
          int64_t current = 0;
          if (auto it = values_.find(key); it != values_.end()) (void)absl::SimpleAtoi(it->second, &current);
          current += delta;
          if (!Store(key, absl::StrCat(current))) return std::nullopt;
          Put<int64_t>(&out, current);
        }
        break;
      }
      case Op::kCheck:
        if ((whole = r.Keys(&keys))) {
          bool all = true;
          for (const std::string& k : keys) all = all && Present(k);
          Put<uint8_t>(&out, all ? 0 : 1);  // READY, NOT_READY
        }
        break;
      case Op::kWait:
        if ((whole = r.Keys(&keys))) {
          connection.waiting = keys;
          if (connection.waiting.empty()) Put<uint8_t>(&out, 0);
        }
        break;
      case Op::kNumKeys:
        Put<int64_t>(&out, static_cast<int64_t>(values_.size()));
        break;
      case Op::kDelete:
        if ((whole = r.Bytes(&key))) {
          auto it = values_.find(key);
          if (it != values_.end()) {
            stored_bytes_ -= static_cast<int64_t>(key.size() + it->second.size());
            values_.erase(it);
          }
          Put<int64_t>(&out, it != values_.end() ? 1 : 0);
        }
        break;
      case Op::kAppend:
        if ((whole = r.Bytes(&key) && r.Bytes(&value))) {
          auto it = values_.find(key);
          if (!Store(key, (it == values_.end() ? std::string() : it->second) + value)) return std::nullopt;
        }
        break;
      case Op::kMultiGet:
        if ((whole = r.Keys(&keys))) {
          for (const std::string& k : keys) {
            auto it = values_.find(k);
            PutBytes(&out, it == values_.end() ? std::string() : it->second);
          }
        }
        break;
      case Op::kMultiSet: {
        uint64_t count = 0;
        if (!(whole = r.Count(&count))) break;
        std::vector<std::pair<std::string, std::string>> pairs(count);
        for (auto& [k, v] : pairs) {
          if (!(whole = r.Bytes(&k) && r.Bytes(&v))) break;
        }
        if (!whole) break;
        for (auto& [k, v] : pairs) {
          if (!Store(k, std::move(v))) return std::nullopt;
        }
        break;
      }
      case Op::kCancelWait:
        connection.waiting.clear();
        Put<uint8_t>(&out, 1);  // WAIT_CANCELED
        break;
      case Op::kQueuePush:
        if ((whole = r.Bytes(&key) && r.Bytes(&value))) {
          if (stored_bytes_ + static_cast<int64_t>(value.size()) > options_.max_stored_bytes) return std::nullopt;
          stored_bytes_ += static_cast<int64_t>(value.size());
          queues_[key].push_back(std::move(value));
        }
        break;
      case Op::kQueuePop:
        if ((whole = r.Bytes(&key))) {
          auto it = queues_.find(key);
          if (it == queues_.end() || it->second.empty()) {
            Put<int64_t>(&out, 0);
          } else {
            Put<int64_t>(&out, 1);
            stored_bytes_ -= static_cast<int64_t>(it->second.front().size());
            PutBytes(&out, it->second.front());
            it->second.pop_front();
          }
        }
        break;
      case Op::kQueueLen:
        if ((whole = r.Bytes(&key))) {
          auto it = queues_.find(key);
          Put<int64_t>(&out, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
        }
        break;
      case Op::kListKeys:
        Put<uint64_t>(&out, values_.size());
        for (const auto& [k, v] : values_) PutBytes(&out, k);
        break;
      case Op::kWatchKey:
      case Op::kUnknown:
        return std::nullopt;
    }
    if (r.bad()) return std::nullopt;
    if (!whole) return false;
    in.erase(0, r.consumed());
    return true;
  }

  const Options options_;
  const int listen_fd_;
  const int wake_fd_;
  std::atomic<int64_t>* const refused_;
  std::map<int, Connection> connections_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::deque<std::string>> queues_;
  int64_t stored_bytes_ = 0;
};

absl::StatusOr<std::unique_ptr<RendezvousStore>> RendezvousStore::Start(Options options) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("the attempt's rendezvous: socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("the attempt's rendezvous: binding 127.0.0.1: ", std::strerror(error)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("the attempt's rendezvous: eventfd: ", std::strerror(errno)));
  }
  const int port = ntohs(address.sin_port);
  std::unique_ptr<RendezvousStore> store(new RendezvousStore(port, nullptr));
  store->server_ = std::make_unique<Server>(std::move(options), fd, wake, &store->refused_);
  store->thread_ = std::thread([server = store->server_.get()] { server->Run(); });
  return store;
}

RendezvousStore::RendezvousStore(int port, std::unique_ptr<Server> server) : port_(port), server_(std::move(server)) {}

RendezvousStore::~RendezvousStore() {
  if (server_ != nullptr) server_->Stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace fitrun::server
