// The attempt's rendezvous against real c10d clients: Debian's torch 1.13 (every command its
// TCPStore sends, and two Gloo ranks meeting through it as torchrun's ranks meet at an agent's
// store), the GPU machines' torch 2.x when FITRUN_TORCH2_PYTHON names its python (tools/test.sh's
// full tier sets it; skipped otherwise), and a socket of another account refused (as root).
#include "server/launcher/rendezvous_store.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

// Runs `python` on `program` with `env` added; its exit status and output.
std::pair<int, std::string> RunPython(const std::string& python, const std::string& program,
                                      const std::string& env = "") {
  const std::string path = absl::StrCat(::testing::TempDir(), "/rendezvous-", getpid(), "-", rand(), ".py");
  FILE* file = fopen(path.c_str(), "w");
  fputs(program.c_str(), file);
  fclose(file);
  FILE* pipe = popen(absl::StrCat(env, " timeout 120 ", python, " ", path, " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::unique_ptr<RendezvousStore> Store(uid_t uid = getuid()) {
  RendezvousStore::Options options;
  options.uid = uid;
  options.name = "j-000001 attempt 1";
  absl::StatusOr<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Start(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// Every command of a client's TCPStore, as a script's own code may call them.
std::string StoreCommands(int port) {
  return absl::StrCat(R"(
import datetime, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", )", port, R"(, 2, False, datetime.timedelta(seconds=20))
store.set("key", b"value")
assert store.get("key") == b"value"
assert store.add("counter", 5) == 5 and store.add("counter", 2) == 7
assert store.compare_set("key", b"value", b"swapped") == b"swapped"
assert store.compare_set("missing", b"", b"made") == b"made"
store.wait(["key", "counter"])
assert store.num_keys() >= 3
assert store.delete_key("missing") and not store.delete_key("missing")
if hasattr(store, "list_keys"):  # 2.x: the rest of its commands
    assert "key" in store.list_keys(), store.list_keys()
    assert store.check(["key"]) and not store.check(["nothing"])
    store.append("key", b"+")
    assert store.multi_get(["key", "counter"]) == [b"swapped+", b"7"]
    store.multi_set(["a", "b"], [b"1", b"2"])
    assert store.get("b") == b"2"
    store.queue_push("q", b"x")
    assert store.queue_len("q") == 1 and store.queue_pop("q") == b"x"
    try:
        store.wait(["never"], datetime.timedelta(milliseconds=300))
        raise SystemExit("a wait for a key nobody sets returned")
    except Exception as timed_out:
        assert "imeout" in str(timed_out) or "imed out" in str(timed_out), timed_out
    assert store.get("a") == b"1"
print("commands ok")
)");
}

// Two ranks of a script's `dist.init_process_group("gloo")` (env://), meeting at the store as
// torchrun's ranks meet at their agent's, summing their ranks.
std::string GlooRanks(int port) {
  return absl::StrCat(R"(
import os, subprocess, sys
if len(sys.argv) == 1:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=")", port, R"(", WORLD_SIZE="2",
               TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
    ranks = [subprocess.Popen([sys.executable, __file__, str(r)], env=dict(env, RANK=str(r))) for r in range(2)]
    sys.exit(max(r.wait() for r in ranks))
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
assert total.item() == 3.0, total
dist.barrier()
print(f"rank {dist.get_rank()} summed {total.item()}", flush=True)
dist.destroy_process_group()
)");
}

TEST(RendezvousStoreTest, TheKernelListsTheOwnerOfALoopbackSocket) {
  // /proc/net/tcp as the kernel writes it: the client's socket (uid 1001) and fitrund's accepted one.
  const std::string text =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 0100007F:A1B2 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 4242 1\n"
      "   1: 0100007F:9C40 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 4243 1\n";
  sockaddr_in client{};
  client.sin_family = AF_INET;
  client.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  client.sin_port = htons(0xA1B2);
  sockaddr_in server = client;
  server.sin_port = htons(0x9C40);
  EXPECT_EQ(SocketOwnerUid(text, "", client, server), 1001);
  EXPECT_EQ(SocketOwnerUid(text, "", server, client), 0);
  // c10d's clients connect from IPv6 sockets: 127.0.0.1 mapped, in tcp6.
  const std::string text6 =
      "  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
      "tm->when retrnsmt   uid  timeout inode\n"
      "  17: 0000000000000000FFFF00000100007F:A1B2 0000000000000000FFFF00000100007F:9C40 01 00000000:00000000 "
      "00:00000000 00000000  1002        0 288467 1\n";
  EXPECT_EQ(SocketOwnerUid("", text6, client, server), 1002);
  client.sin_port = htons(1);
  EXPECT_EQ(SocketOwnerUid(text, text6, client, server), -1);
}

TEST(RendezvousStoreTest, ServesEveryCommandOfTorch113sTCPStore) {
  std::unique_ptr<RendezvousStore> store = Store();
  ASSERT_NE(store, nullptr);
  auto [status, output] = RunPython("/usr/bin/python3", StoreCommands(store->port()));
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("commands ok"));
  EXPECT_EQ(store->refused(), 0);
}

TEST(RendezvousStoreTest, TwoGlooRanksOfAnUnchangedScriptMeetThere) {
  std::unique_ptr<RendezvousStore> store = Store();
  ASSERT_NE(store, nullptr);
  auto [status, output] = RunPython("/usr/bin/python3", GlooRanks(store->port()));
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("summed 3.0"));
}

TEST(RendezvousStoreTest, ServesTorch2sTCPStoreAndItsRanks) {
  const char* python = std::getenv("FITRUN_TORCH2_PYTHON");
  if (python == nullptr || access(python, X_OK) != 0) GTEST_SKIP() << "FITRUN_TORCH2_PYTHON names no torch 2.x python";
  std::unique_ptr<RendezvousStore> store = Store();
  ASSERT_NE(store, nullptr);
  auto [status, output] = RunPython(python, StoreCommands(store->port()));
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("commands ok"));
  auto [gloo_status, gloo_output] = RunPython(python, GlooRanks(store->port()));
  EXPECT_EQ(gloo_status, 0) << gloo_output;
  EXPECT_THAT(gloo_output, HasSubstr("summed 3.0"));
}

TEST(RendezvousStoreTest, ASocketOfAnotherAccountIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to connect as another account";
  std::unique_ptr<RendezvousStore> store = Store(/*uid=*/0);
  ASSERT_NE(store, nullptr);
  const pid_t child = fork();
  if (child == 0) {
    // nobody: connects, sends a 1.13 GETNUMKEYS, and exits 0 only if the store never answers.
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(store->port()));
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) _exit(4);
    const char command = 6;
    (void)!write(fd, &command, 1);
    char reply[8];
    _exit(recv(fd, reply, sizeof(reply), MSG_WAITALL) == 8 ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "another account's socket was answered: " << status;
  EXPECT_EQ(store->refused(), 1);
  // The job's own account is served all the while.
  auto [ok, output] = RunPython("/usr/bin/python3", StoreCommands(store->port()));
  EXPECT_EQ(ok, 0) << output;
}

}  // namespace
}  // namespace fitrun::server
