#include "sim/lost_response.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

namespace waystone {
namespace {

bool SamePeer(const sockaddr_storage& peer, const std::string& addr, int port) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (peer.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&peer);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return ntohs(in->sin_port) == port && addr == text;
  }
  if (peer.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&peer);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return ntohs(in6->sin6_port) == port && addr == text;
  }
  return false;
}

int LocalPort(int fd) {
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return -1;
  if (local.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  if (local.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  return -1;
}

void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

int FindConnectionSocket(const std::string& peer_addr, int peer_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat info {};
    if (fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &length) != 0) {
      continue;
    }
    if (SamePeer(peer, peer_addr, peer_port) && LocalPort(static_cast<int>(fd)) == local_port) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

uint64_t ConnectionId(int fd) {
  struct stat info {};
  if (fd < 0 || fstat(fd, &info) != 0) return 0;
  return static_cast<uint64_t>(info.st_ino);
}

bool LoseResponse(int fd, LostResponse how) {
  // Close-on-exec throughout: a child started meanwhile must not keep the connection.
  const int connection = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (connection < 0) return false;
  const int placeholder = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (placeholder < 0 || dup3(placeholder, fd, O_CLOEXEC) < 0) {
    if (placeholder >= 0) close(placeholder);
    close(connection);
    return false;
  }
  close(placeholder);
  switch (how) {
    case LostResponse::kCloseBeforeBytes:
      break;
    case LostResponse::kReset: {
      const linger abort_on_close{1, 0};
      setsockopt(connection, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
      close(connection);  // with linger 0: RST, not FIN
      return true;
    }
    case LostResponse::kPartialStatus:
      SendAll(connection, "HTTP/1.1 20");
      break;
    case LostResponse::kPartialHeaders:
      SendAll(connection, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n");
      break;
  }
  shutdown(connection, SHUT_RDWR);
  close(connection);
  return true;
}

}  // namespace waystone
