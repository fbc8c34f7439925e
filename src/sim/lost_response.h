#pragma once

#include <cstdint>
#include <string>

namespace waystone {

// Raw-socket ways a server loses a response after it committed the effect, for the
// simulator's handlers: the HTTP library would always answer, so the handler takes
// the connection away from it first. Linux only (reads /proc/self/fd).

enum class LostResponse : uint8_t {
  kCloseBeforeBytes = 1,  // FIN without a single response byte
  kReset = 2,             // TCP RST without a byte
  kPartialStatus = 3,     // "HTTP/1.1 20" and FIN
  kPartialHeaders = 4,    // the status line and one header, no blank line, and FIN
};

// Returns the fd of this process's TCP socket whose local port is `local_port` and
// whose peer is `peer_addr`:`peer_port`, or -1.
int FindConnectionSocket(const std::string& peer_addr, int peer_port, int local_port);

// Returns an id of the connection on `fd` that stays the same while it is open
// (the socket's inode), or 0.
uint64_t ConnectionId(int fd);

// Ends the connection on `fd` as `how` says. The fd itself is replaced by an
// unconnected socket, so whatever the HTTP library then writes goes nowhere and it
// closes that one as usual. Returns false when the connection could not be taken.
bool LoseResponse(int fd, LostResponse how);

}  // namespace waystone
