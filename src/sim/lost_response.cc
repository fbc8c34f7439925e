#include "sim/lost_response.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>

namespace waystone {
namespace {

void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Takes the connection on `fd`: returns a descriptor of its own for it, and `fd`
// becomes an unconnected socket. -1 when it could not.
int TakeConnection(int fd) {
  // Close-on-exec throughout: a child started meanwhile must not keep the connection.
  const int connection = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (connection < 0) return -1;
  const int placeholder = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (placeholder < 0 || dup3(placeholder, fd, O_CLOEXEC) < 0) {
    if (placeholder >= 0) close(placeholder);
    close(connection);
    return -1;
  }
  close(placeholder);
  return connection;
}

void Finish(int connection) {
  shutdown(connection, SHUT_RDWR);
  close(connection);
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    default:
      return "Unknown";
  }
}

}  // namespace

bool LoseResponse(int fd, LostResponse how) {
  const int connection = TakeConnection(fd);
  if (connection < 0) return false;
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
  Finish(connection);
  return true;
}

bool CutBody(int fd, int status, size_t content_length) {
  const int connection = TakeConnection(fd);
  if (connection < 0) return false;
  SendAll(connection, "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
                          "\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(content_length) + "\r\n\r\n");
  Finish(connection);
  return true;
}

}  // namespace waystone
