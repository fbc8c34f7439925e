#pragma once

// The HTTP/1.1 server Waystone faces other systems with, and the one listener
// of every server it runs (the API, the metrics listener, the simulator). Lean on
// purpose: the server library (Boost.Beast) stays inside http_front.cc (the
// connections) and http_message.cc (reading a request, its limits, the bytes of
// an answer).

#include <any>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace waystone {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// One request as the handlers see it. Path and query are percent-decoded and
// valid UTF-8 (the front refuses anything else with 400).
struct ServerRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;
  HeaderList query;    // in the order sent; a name may repeat
  HeaderList headers;  // names lower-cased, in the order sent
  std::string body;    // empty until the body is read
  std::any screened;   // what the screen found out (e.g. who is asking), for the handler
  // How many requests this connection carried before this one (0 on a fresh one).
  size_t earlier_requests = 0;
  // The connection's socket, for a handler that must end the connection itself
  // (the simulator's lost responses, sim/lost_response.h): the front then writes
  // its answer to whatever the descriptor has become. -1 in ServeBytes.
  int socket_fd = -1;

  // The first header of that (lower-case) name, or nullptr.
  const std::string* Header(std::string_view name) const;
  // How often the query names `name`.
  size_t QueryCount(std::string_view name) const;
  // The first value of `name` in the query, or nullptr.
  const std::string* Query(std::string_view name) const;
};

struct ServerResponse {
  int status = 200;
  HeaderList headers;
  std::string body;

  void SetHeader(std::string name, std::string value);
  void SetContent(std::string content, std::string content_type);
  // The value of a header set on the response, or "".
  std::string Header(std::string_view name) const;
};

struct HttpFrontOptions {
  std::string listen = "127.0.0.1:8080";  // host:port; port 0 picks one
  // Bodies beyond this are refused with 413 as they arrive, chunked or not.
  size_t max_body_bytes = 1 << 20;
  // The request line and headers together; beyond it 431.
  size_t max_header_bytes = 16 * 1024;
  size_t max_headers = 100;
  // For the whole request, head and body, from its first byte (or from the end of
  // the previous response on a kept-alive connection). Past it the connection closes.
  int request_deadline_seconds = 10;
  int write_deadline_seconds = 10;
  // Open connections, and those of one client address (0: max_connections). A new
  // connection past either limit takes the place of the oldest connection that waits
  // for a request and has sent none of it yet (of that address, for the second),
  // which is closed: idle connections never keep a client out. When none waits, the
  // new one may still ask the health path (a few such at once); anything else it
  // asks is answered 503, and past those few it gets 503 at once.
  int max_connections = 1024;
  int max_connections_per_client = 0;
  // Threads that run handlers (they may wait on the database). Reading and
  // writing never wait on them: a slow client holds a socket, not a thread.
  int handler_threads = 8;
  int io_threads = 2;
  // GET (or HEAD) of this path, without a query, is answered "ok" on the I/O
  // thread itself, never queued behind handlers; "" = none.
  std::string health_path;
  // HTTPS: a PEM certificate (chain) and its private key; both "" = plain HTTP.
  // A file that cannot be read or used fails Start, naming it.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Runs after the head is read and before the body is: returns true when it
// answered `res` itself (a missing token, an unknown route), and the body is then
// never read. May set `head.screened` for the handler.
using ScreenFn = std::function<bool(ServerRequest& head, ServerResponse& res)>;
using HandleFn = std::function<void(const ServerRequest& req, ServerResponse& res)>;

// HttpFront accepts HTTP/1.1 connections and hands complete requests to the
// handler, on a thread pool of its own. It protects itself: a deadline for each
// whole request, limits on header count and size, the body limit enforced while a
// chunked body arrives, connection limits (overall and per client address) that idle
// connections cannot fill, no ranges. Failures of the front
// (unreadable request, too large) are answered as RFC 9457 problems. A handler that
// throws answers 500. Stops and joins its threads when destroyed.
class HttpFront {
 public:
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const HttpFrontOptions& options,
                                                          ScreenFn screen, HandleFn handle);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;
  int port() const;

  class Impl;

 private:
  explicit HttpFront(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads `raw` as the bytes a client sent on one connection, with the same parser,
// limits, screen and handler as a served connection, and returns the bytes the
// server would answer. For the fuzzer and for tests of the parser's edges.
std::string ServeBytes(std::string_view raw, const HttpFrontOptions& options,
                       const ScreenFn& screen, const HandleFn& handle);

}  // namespace waystone
