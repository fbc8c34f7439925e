#pragma once

#include <cstdint>
#include <string>

namespace waystone {

// Raw-socket ways a server loses a response after it committed the effect, for the
// simulator's handlers: the HTTP front would always answer, so the handler takes
// the connection (ServerRequest::socket_fd) away from it first. Linux (dup3).

enum class LostResponse : uint8_t {
  kCloseBeforeBytes = 1,  // FIN without a single response byte
  kReset = 2,             // TCP RST without a byte
  kPartialStatus = 3,     // "HTTP/1.1 20" and FIN
  kPartialHeaders = 4,    // the status line and one header, no blank line, and FIN
};

// Ends the connection on `fd` as `how` says. The fd itself is replaced by an
// unconnected socket, so whatever the HTTP server then writes goes nowhere and it
// closes that one as usual. Returns false when the connection could not be taken.
bool LoseResponse(int fd, LostResponse how);

// Sends the whole head of a `status` response that declares `content_length`
// bytes of JSON body, then FIN before any of the body: a partial body. Takes the
// connection as LoseResponse does.
bool CutBody(int fd, int status, size_t content_length);

}  // namespace waystone
