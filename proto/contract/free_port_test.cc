#include "proto/contract/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace fitrun::contract {
namespace {

// Binds 127.0.0.1:port and listens; true when both succeed.
bool CanListenOn(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

TEST(FreePortTest, APickedPortCanBeListenedOn) {
  absl::StatusOr<int> port = PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_LT(*port, 65536);
  EXPECT_TRUE(CanListenOn(*port));
}

TEST(FreePortTest, APortSomeoneListensOnIsNotPicked) {
  // The kernel never hands out a bound port for port 0: with one held, no pick returns it.
  const int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(held, 1), 0);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int taken = ntohs(address.sin_port);
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<int> port = PickFreeLoopbackPort();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_NE(*port, taken);
  }
  close(held);
}

}  // namespace
}  // namespace fitrun::contract
