#include "server/http_front.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/log.h"
#include "base/utf8.h"
#include "server/problem.h"

namespace waystone {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using beast::error_code;

const std::string* ServerRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return &v;
  }
  return nullptr;
}

size_t ServerRequest::QueryCount(std::string_view name) const {
  size_t count = 0;
  for (const auto& [n, v] : query) count += n == name;
  return count;
}

const std::string* ServerRequest::Query(std::string_view name) const {
  for (const auto& [n, v] : query) {
    if (n == name) return &v;
  }
  return nullptr;
}

void ServerResponse::SetHeader(std::string name, std::string value) {
  for (auto& [n, v] : headers) {
    if (beast::iequals(n, name)) {
      v = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

void ServerResponse::SetContent(std::string content, std::string content_type) {
  body = std::move(content);
  SetHeader("Content-Type", std::move(content_type));
}

std::string ServerResponse::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (beast::iequals(n, name)) return v;
  }
  return "";
}

namespace {

using Parser = bhttp::request_parser<bhttp::string_body>;
using BeastResponse = bhttp::response<bhttp::string_body>;

ServerResponse ProblemResponse(int status, const std::string& kind, const std::string& title,
                               const std::string& detail, const std::string& path) {
  ServerResponse res;
  res.status = status;
  res.SetContent(Problem{status, "urn:waystone:problem:" + kind, title, detail}.ToJson(path),
                 "application/problem+json");
  return res;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `text` ('+' is a space in a query); nullopt on a broken escape,
// a NUL or text that is not UTF-8 once decoded.
std::optional<std::string> Decode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      const int high = HexDigit(text[i + 1]);
      const int low = HexDigit(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      c = static_cast<char>(high * 16 + low);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    if (c == '\0') return std::nullopt;
    out.push_back(c);
  }
  if (FirstInvalidUtf8(out) != std::string::npos) return std::nullopt;
  return out;
}

// Fills path and query from the target (origin form only); the reason otherwise.
std::optional<std::string> SplitTarget(ServerRequest& req) {
  if (req.target.empty() || req.target[0] != '/') {
    return "the request target must be a path such as /v1/instances";
  }
  const size_t mark = req.target.find('?');
  auto path = Decode(std::string_view(req.target).substr(0, mark), false);
  if (!path) return "the path is not percent-encoded UTF-8";
  req.path = std::move(*path);
  if (mark == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(req.target).substr(mark + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view part = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    auto name = Decode(part.substr(0, eq), true);
    auto value = Decode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1),
                        true);
    if (!name || !value) return "the query is not percent-encoded UTF-8";
    req.query.emplace_back(std::move(*name), std::move(*value));
  }
  return std::nullopt;
}

// Reads the parsed head into `out`; the refusal when it is one we do not serve.
std::optional<ServerResponse> ReadHead(const Parser& parser, const HttpFrontOptions& options,
                                       ServerRequest* out) {
  const auto& message = parser.get();
  *out = ServerRequest{};
  out->method = std::string(message.method_string());
  out->target = std::string(message.target());
  size_t count = 0;
  for (const auto& field : message) {
    if (++count > options.max_headers) {
      return ProblemResponse(431, "header-fields-too-large", "Request header fields too large",
                             "at most " + std::to_string(options.max_headers) + " headers",
                             "");
    }
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out->headers.emplace_back(std::move(name), std::string(field.value()));
  }
  if (message.version() != 11 && message.version() != 10) {
    return ProblemResponse(505, "http-version-not-supported", "HTTP version not supported",
                           "send HTTP/1.1", "");
  }
  if (auto why = SplitTarget(*out)) {
    return ProblemResponse(400, "bad-request", "The request is not valid", *why, "");
  }
  return std::nullopt;
}

// The answer to a request that could not be read; nullopt when the connection
// just ends (the client left, or its time ran out).
std::optional<ServerResponse> ReadFailure(const error_code& ec, const HttpFrontOptions& options) {
  if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
      ec == beast::error::timeout || ec == net::error::operation_aborted ||
      ec == net::error::connection_reset || ec == bhttp::error::partial_message) {
    return std::nullopt;
  }
  if (ec == bhttp::error::header_limit) {
    return ProblemResponse(431, "header-fields-too-large", "Request header fields too large",
                           "the request line and headers may take " +
                               std::to_string(options.max_header_bytes) + " bytes",
                           "");
  }
  if (ec == bhttp::error::body_limit) {
    return ProblemResponse(413, "payload-too-large", "Request body too large",
                           "the body may take " + std::to_string(options.max_body_bytes) +
                               " bytes",
                           "");
  }
  return ProblemResponse(400, "bad-request", "The request is not valid",
                         "the request could not be read as HTTP/1.1: " + ec.message(), "");
}

ServerResponse Internal(const std::string& path) {
  return ProblemResponse(500, "internal", "Internal error", "an internal error occurred", path);
}

// Runs the screen; a screen that throws answers 500.
bool RunScreen(const ScreenFn& screen, ServerRequest& head, ServerResponse& res) {
  try {
    return screen(head, res);
  } catch (const std::exception& e) {
    Log(LogLevel::kError, std::string("request screen threw: ") + e.what());
  } catch (...) {
    Log(LogLevel::kError, "request screen threw");
  }
  res = Internal(head.path);
  return true;
}

void RunHandler(const HandleFn& handle, const ServerRequest& req, ServerResponse& res) {
  try {
    handle(req, res);
    return;
  } catch (const std::exception& e) {
    Log(LogLevel::kError, "handler of " + req.method + " " + req.path + " threw: " + e.what());
  } catch (...) {
    Log(LogLevel::kError, "handler of " + req.method + " " + req.path + " threw");
  }
  res = Internal(req.path);
}

// The message for `res`. Never throws: a header Beast refuses (a line break that
// would let a value write headers of its own, a value over its 64 KiB) is left out
// and logged. For HEAD the length is kept and the body dropped.
BeastResponse ToBeast(ServerResponse&& res, unsigned version, bool keep_alive, bool head) {
  BeastResponse out;
  out.version(version == 10 ? 10 : 11);
  if (res.status < 200 || res.status > 599) {
    Log(LogLevel::kError, "a handler answered status " + std::to_string(res.status));
    res = ProblemResponse(500, "internal", "Internal error", "an internal error occurred", "");
  }
  if (res.status == 204 || res.status == 304) res.body.clear();  // they carry none
  out.result(static_cast<unsigned>(res.status));
  for (auto& [name, value] : res.headers) {
    if (name.find_first_of("\r\n") != std::string::npos ||
        value.find_first_of("\r\n") != std::string::npos || name.size() > 256 ||
        value.size() > 8192) {
      Log(LogLevel::kWarning, "response header '" + name.substr(0, 64) +
                                  "' left out: a line break or too long");
      continue;
    }
    try {
      out.set(name, value);
    } catch (const std::exception& e) {
      Log(LogLevel::kWarning, "response header '" + name.substr(0, 64) + "' left out: " + e.what());
    }
  }
  const size_t length = res.body.size();
  out.body() = head ? std::string() : std::move(res.body);
  out.keep_alive(keep_alive);
  out.prepare_payload();
  if (head) out.content_length(length);
  return out;
}

// The bytes of `res` on the wire, as an async write would send them (ServeBytes,
// and the 503 written before a connection is taken).
std::string WireBytes(ServerResponse&& res, unsigned version, bool keep_alive, bool head) {
  std::ostringstream text;
  text << ToBeast(std::move(res), version, keep_alive, head);
  return text.str();
}

void ConfigureParser(Parser& parser, const HttpFrontOptions& options) {
  parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
  parser.body_limit(options.max_body_bytes);
}

}  // namespace

class HttpFront::Impl {
 public:
  Impl(const HttpFrontOptions& options, ScreenFn screen, HandleFn handle)
      : options_(options),
        screen_(std::move(screen)),
        handle_(std::move(handle)),
        acceptor_(net::make_strand(ioc_)),
        pool_(static_cast<size_t>(std::max(1, options.handler_threads))),
        retry_accept_(acceptor_.get_executor()) {}

  // Stops taking connections, lets the requests under way be answered for a
  // moment, then stops: requests still queued for a handler are dropped unrun
  // (nothing of theirs is committed), running handlers finish.
  ~Impl() {
    stopping_ = true;
    net::post(acceptor_.get_executor(), [this] {
      error_code ignored;
      acceptor_.close(ignored);
    });
    {
      std::unique_lock<std::mutex> lock(busy_mu_);
      idle_.wait_for(lock, std::chrono::seconds(3), [this] { return busy_ == 0; });
    }
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    pool_.stop();
    pool_.join();
  }

  absl::Status Listen() {
    const size_t colon = options_.listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError("--listen '" + options_.listen + "' is not host:port");
    }
    std::string host = options_.listen.substr(0, colon);
    if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    const std::string port = options_.listen.substr(colon + 1);
    error_code ec;
    tcp::resolver resolver(ioc_);
    auto endpoints = resolver.resolve(host, port, tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return absl::InvalidArgumentError("--listen '" + options_.listen + "': " + ec.message());
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return absl::UnavailableError("cannot listen on " + options_.listen + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
      threads_.emplace_back([this] {
        // Nothing a request does may end the process: a handler that threw is
        // logged and the loop goes on.
        while (true) {
          try {
            ioc_.run();
            return;
          } catch (const std::exception& e) {
            Log(LogLevel::kError, std::string("HTTP front: ") + e.what());
          } catch (...) {
            Log(LogLevel::kError, "HTTP front: unknown exception");
          }
        }
      });
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }
  const HttpFrontOptions& options() const { return options_; }
  const ScreenFn& screen() const { return screen_; }
  const HandleFn& handle() const { return handle_; }
  net::thread_pool& pool() { return pool_; }
  std::atomic<int>& connections() { return connections_; }
  // Counts requests read and not yet answered (+1 / -1); the destructor waits for none.
  void AddBusy(int delta) {
    std::lock_guard<std::mutex> lock(busy_mu_);
    busy_ += delta;
    if (busy_ == 0) idle_.notify_all();
  }
  bool stopping() const { return stopping_.load(); }

 private:
  void Accept();
  // Takes one accepted connection, or answers 503 when there are too many.
  void Admit(tcp::socket socket);

  HttpFrontOptions options_;
  ScreenFn screen_;
  HandleFn handle_;
  std::atomic<int> connections_{0};
  std::mutex busy_mu_;
  std::condition_variable idle_;  // busy_ reached 0
  int busy_ = 0;                  // guarded by busy_mu_
  std::atomic<bool> stopping_{false};
  int port_ = -1;
  // Destroyed in reverse: the pool's queued work and the io_context's own hold
  // connections, whose sockets need the io_context.
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::thread_pool pool_;
  net::steady_timer retry_accept_;
  std::vector<std::thread> threads_;
};

namespace {

// One client connection: read a head, screen it, read the body, handle, write,
// and again while the client keeps the connection alive. All of it on the
// connection's strand, except the screen and the handler, which run on the pool.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpFront::Impl* front)
      : stream_(std::move(socket)), front_(front) {
    front_->connections().fetch_add(1);
  }
  ~Connection() {
    Busy(false);
    front_->connections().fetch_sub(1);
  }

  void Start() { ReadNextHead(); }

 private:
  const HttpFrontOptions& options() const { return front_->options(); }

  void ReadNextHead() {
    parser_.emplace();
    ConfigureParser(*parser_, options());
    // One deadline for the whole request, head and body (time the request waits
    // for a handler thread of ours is added back: it is not the client's).
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::seconds(options().request_deadline_seconds);
    stream_.expires_at(deadline_);
    head_only_ = false;  // until this request's method is known
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](error_code ec, size_t) {
                               self->OnHead(ec);
                             });
  }

  void OnHead(const error_code& ec) {
    if (ec) return OnReadError(ec);
    version_ = parser_->get().version();
    head_only_ = parser_->get().method() == bhttp::verb::head;
    if (auto refused = ReadHead(*parser_, options(), &request_)) {
      return Write(std::move(*refused), false);
    }
    if (front_->stopping()) {
      // Draining: nothing new is started, not even a health check that would say "ok".
      return Write(ProblemResponse(503, "unavailable", "Temporarily unavailable",
                                   "the server is stopping; retry on another", request_.path),
                   false);
    }
    if (!options().health_path.empty() && request_.path == options().health_path &&
        (request_.method == "GET" || head_only_) && request_.query.empty() &&
        parser_->is_done()) {
      // Answered here, on the I/O thread: busy handlers never delay it.
      ServerResponse ok;
      ok.SetContent("ok\n", "text/plain");
      return Write(std::move(ok), parser_->get().keep_alive());
    }
    Busy(true);
    const auto queued = std::chrono::steady_clock::now();
    OnPool([self = shared_from_this(), queued] {
      auto res = std::make_shared<ServerResponse>();
      const bool answered = RunScreen(self->front_->screen(), self->request_, *res);
      net::post(self->stream_.get_executor(), [self, res, answered, queued] {
        if (answered) return self->Write(std::move(*res), false);  // the body stays unread
        // Our own time (the queue, the screen, the way back) is not the client's.
        self->deadline_ += std::chrono::steady_clock::now() - queued;
        self->stream_.expires_at(self->deadline_);
        self->ReadBody();
      });
    });
  }

  // Runs `work` on the handler pool; if it throws (out of memory, most likely),
  // the connection is closed instead of the process ending.
  template <typename Work>
  void OnPool(Work work) {
    net::post(front_->pool(), [self = shared_from_this(), work = std::move(work)]() mutable {
      try {
        work();
      } catch (...) {
        net::post(self->stream_.get_executor(), [self] { self->Close(); });
      }
    });
  }

  void Busy(bool now) {
    if (now == busy_) return;
    busy_ = now;
    front_->AddBusy(now ? 1 : -1);
  }

  void ReadBody() {
    if (parser_->is_done()) return Dispatch();
    const auto expect = parser_->get()[bhttp::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      auto go_on = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_,
                                                                        version_);
      bhttp::async_write(stream_, *go_on,
                         [self = shared_from_this(), go_on](error_code ec, size_t) {
                           if (ec) return self->Close();
                           self->ReadRest();
                         });
      return;
    }
    ReadRest();
  }

  void ReadRest() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](error_code ec, size_t) {
                        if (ec) return self->OnReadError(ec);
                        self->Dispatch();
                      });
  }

  void Dispatch() {
    request_.body = std::move(parser_->get().body());
    const bool keep_alive = parser_->get().keep_alive();
    OnPool([self = shared_from_this(), keep_alive] {
      auto res = std::make_shared<ServerResponse>();
      RunHandler(self->front_->handle(), self->request_, *res);
      net::post(self->stream_.get_executor(), [self, res, keep_alive] {
        self->Write(std::move(*res), keep_alive);
      });
    });
  }

  void OnReadError(const error_code& ec) {
    auto answer = ReadFailure(ec, options());
    if (!answer) return Close();
    Write(std::move(*answer), false);
  }

  void Write(ServerResponse res, bool keep_alive) {
    response_ = ToBeast(std::move(res), version_, keep_alive && !front_->stopping(), head_only_);
    stream_.expires_after(std::chrono::seconds(options().write_deadline_seconds));
    bhttp::async_write(stream_, response_, [self = shared_from_this()](error_code ec, size_t) {
      self->Busy(false);  // answered (or the client is gone): the drain need not wait
      if (ec) return self->Close();
      if (self->response_.keep_alive()) return self->ReadNextHead();
      self->Linger();
    });
  }

  // Ends a connection whose request may not have been read to its end: stop
  // sending, then read and drop what the client still sends for a moment, so that
  // closing does not reset the connection before the client read our answer.
  void Linger() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(1));
    Drain();
  }

  void Drain() {
    drained_.resize(64 * 1024);
    stream_.async_read_some(net::buffer(drained_),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              self->drained_total_ += n;
                              if (ec || self->drained_total_ > 4 * self->options().max_body_bytes) {
                                return self->Close();
                              }
                              self->Drain();
                            });
  }

  void Close() {
    Busy(false);
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpFront::Impl* front_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  ServerRequest request_;
  BeastResponse response_;
  unsigned version_ = 11;
  bool head_only_ = false;
  bool busy_ = false;  // counted in front_->AddBusy()
  std::chrono::steady_clock::time_point deadline_;
  std::string drained_;
  size_t drained_total_ = 0;
};

}  // namespace

void HttpFront::Impl::Accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors, most likely: try again shortly rather than spin.
      Log(LogLevel::kWarning, "accept failed: " + ec.message());
      retry_accept_.expires_after(std::chrono::milliseconds(50));
      retry_accept_.async_wait([this](error_code) { Accept(); });
      return;
    }
    try {
      Admit(std::move(socket));
    } catch (const std::exception& e) {
      Log(LogLevel::kError, std::string("admitting a connection: ") + e.what());
    } catch (...) {
      Log(LogLevel::kError, "admitting a connection failed");
    }
    Accept();  // always: a failure with one connection never stops the others
  });
}

void HttpFront::Impl::Admit(tcp::socket socket) {
  {
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    if (connections_.load() >= options_.max_connections) {
      static const std::string kBusy = [] {
        ServerResponse busy = ProblemResponse(503, "unavailable", "Temporarily unavailable",
                                              "too many connections; retry shortly", "");
        busy.SetHeader("Retry-After", "1");
        return WireBytes(std::move(busy), 11, false, false);
      }();
      socket.non_blocking(true, ignored);
      socket.write_some(net::buffer(kBusy.data(), kBusy.size()), ignored);
      socket.shutdown(tcp::socket::shutdown_send, ignored);
      // Read what already arrived: closing with unread bytes would reset the
      // connection, and some clients then drop the 503 they were sent.
      char scratch[4096];
      for (int i = 0; i < 16 && socket.read_some(net::buffer(scratch), ignored) > 0; ++i) {
      }
      socket.close(ignored);
    } else {
      std::make_shared<Connection>(std::move(socket), this)->Start();
    }
  }
}

HttpFront::HttpFront(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpFront::~HttpFront() = default;

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options,
                                                           ScreenFn screen, HandleFn handle) {
  auto impl = std::make_unique<Impl>(options, std::move(screen), std::move(handle));
  if (auto status = impl->Listen(); !status.ok()) return status;
  return std::unique_ptr<HttpFront>(new HttpFront(std::move(impl)));
}

int HttpFront::port() const { return impl_->port(); }

std::string ServeBytes(std::string_view raw, const HttpFrontOptions& options,
                       const ScreenFn& screen, const HandleFn& handle) {
  std::string out;
  bool head = false;
  auto emit = [&out, &head](ServerResponse&& res, unsigned version, bool keep_alive) {
    out += WireBytes(std::move(res), version, keep_alive, head);
  };
  // Feeds the parser until `done` holds; false when the bytes ran out or failed.
  size_t offset = 0;
  error_code ec;
  auto feed = [&](Parser& parser, auto done) {
    while (!done()) {
      const size_t used = parser.put(net::buffer(raw.data() + offset, raw.size() - offset), ec);
      offset += used;
      // All that is left was offered: needing more, or taking none of it, means the
      // client sends no more. A connection would wait for its deadline, then close.
      if (ec == bhttp::error::need_more || (!ec && used == 0)) {
        if (used > 0 && offset < raw.size()) {
          ec = {};
          continue;
        }
        ec = {};
        parser.put_eof(ec);
        if (!ec) ec = bhttp::error::partial_message;
        return false;
      }
      if (ec) return false;
    }
    return true;
  };
  for (int requests = 0; requests < 16 && offset < raw.size(); ++requests) {
    Parser parser;
    ConfigureParser(parser, options);
    ServerRequest request;
    if (!feed(parser, [&] { return parser.is_header_done(); })) {
      if (auto answer = ReadFailure(ec, options)) emit(std::move(*answer), 11, false);
      return out;
    }
    const unsigned version = parser.get().version();
    head = parser.get().method() == bhttp::verb::head;
    if (auto refused = ReadHead(parser, options, &request)) {
      emit(std::move(*refused), version, false);
      return out;
    }
    ServerResponse res;
    if (RunScreen(screen, request, res)) {
      emit(std::move(res), version, false);
      return out;
    }
    if (!feed(parser, [&] { return parser.is_done(); })) {
      if (auto answer = ReadFailure(ec, options)) emit(std::move(*answer), version, false);
      return out;
    }
    request.body = std::move(parser.get().body());
    const bool keep_alive = parser.get().keep_alive();
    RunHandler(handle, request, res);
    emit(std::move(res), version, keep_alive);
    if (!keep_alive) return out;
  }
  return out;
}

}  // namespace waystone
