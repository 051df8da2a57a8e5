// server/connection_probe.cpp: finding a request's socket by its addresses, and peeking at it.
#include "server/connection_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

namespace k3::server {

namespace {

// The numeric host and port of an address, formatted as httplib formats them (getnameinfo with
// NI_NUMERICHOST), so strings compare equal.
bool host_port(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  host = buf;
  if (a.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  else if (a.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  else return false;
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string host;
  int port = -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;  // not a socket
  if (!host_port(a, len, host, port) || port != local_port || host != local_addr) return false;
  len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  return host_port(a, len, host, port) && port == remote_port && host == remote_addr;
}

}  // namespace

ConnectionProbe::ConnectionProbe(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                 int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == dirfd(dir)) continue;
    if (matches(fd, local_addr, local_port, remote_addr, remote_port)) {
      fd_ = fd;
      break;
    }
  }
  closedir(dir);
}

bool ConnectionProbe::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  if (p.revents & POLLRDHUP) return true;
  if (p.revents & POLLIN) {
    char c;
    return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

}  // namespace k3::server
