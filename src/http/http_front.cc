#include "http/http_front.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/log.h"
#include "base/mutex.h"
#include "http/http_message.h"
#include "http/stream.h"

namespace waystone {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using beast::error_code;
using namespace http_message;
using http_stream::AnyStream;
using http_stream::TlsContext;
using http_stream::TlsStream;

namespace {

// Connections past the limits that may still ask the health path, at once.
constexpr int kMaxOverflow = 32;

}  // namespace

// One admitted connection as the front counts it.
struct ConnectionSlot {
  std::string address;  // the client's
  uint64_t order = 0;   // of admission: the oldest idle one goes first
  // Waits for a request and has sent none of its bytes yet.
  std::atomic<bool> idle{true};
  // Admitted past the limits: answers the health path, and 503 to anything else.
  bool overflow = false;
  // Closes the connection, on its own strand; set before the next admission.
  std::function<void()> evict;
};

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
      MutexLock lock(busy_mu_);
      idle_.wait_for(lock.native(), std::chrono::seconds(3),
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(busy_mu_) { return busy_ == 0; });
    }
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    pool_.stop();
    pool_.join();
  }

  absl::Status Listen() {
    if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
      auto context = TlsContext(options_.tls_cert_file, options_.tls_key_file);
      if (!context.ok()) return context.status();
      tls_ = std::move(*context);
    }
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
    if (ec)
      return absl::UnavailableError("cannot listen on " + options_.listen + ": " + ec.message());
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

  // A slot for a new connection from `address`, or null when it is to be refused.
  // Past a limit, the oldest idle connection in the way is evicted for it.
  std::shared_ptr<ConnectionSlot> TakeSlot(const std::string& address) {
    std::shared_ptr<ConnectionSlot> victim;
    std::shared_ptr<ConnectionSlot> slot = std::make_shared<ConnectionSlot>();
    slot->address = address;
    {
      MutexLock lock(slots_mu_);
      const int per_client = options_.max_connections_per_client > 0
                                 ? options_.max_connections_per_client
                                 : options_.max_connections;
      const auto mine = per_address_.find(address);
      const bool client_full = mine != per_address_.end() && mine->second >= per_client;
      const bool full = static_cast<int>(slots_.size()) - overflow_ >= options_.max_connections;
      if (client_full || full) {
        for (const auto& [order, held] : slots_) {  // oldest first
          if (held->overflow || !held->idle.load() || (client_full && held->address != address)) {
            continue;
          }
          victim = held;
          break;
        }
        if (victim != nullptr) {
          ForgetLocked(*victim);
        } else if (overflow_ < kMaxOverflow) {
          slot->overflow = true;
        } else {
          return nullptr;
        }
      }
      slot->order = next_order_++;
      slots_.emplace(slot->order, slot);
      if (slot->overflow) {
        ++overflow_;
      } else {
        ++per_address_[address];
      }
    }
    if (victim != nullptr && victim->evict) victim->evict();
    return slot;
  }

  // The connection of `slot` ended (or was evicted: then it is gone already).
  void ReleaseSlot(const ConnectionSlot& slot) {
    MutexLock lock(slots_mu_);
    const auto it = slots_.find(slot.order);
    if (it != slots_.end() && it->second.get() == &slot) ForgetLocked(slot);
  }
  // Counts requests read and not yet answered (+1 / -1); the destructor waits for none.
  void AddBusy(int delta) {
    MutexLock lock(busy_mu_);
    busy_ += delta;
    if (busy_ == 0) idle_.notify_all();
  }
  bool stopping() const { return stopping_.load(); }

 private:
  void Accept();
  // Takes one accepted connection, or answers 503 when there are too many.
  void Admit(tcp::socket socket);

  void ForgetLocked(const ConnectionSlot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slots_mu_) {
    if (slot.overflow) {
      --overflow_;
    } else if (const auto count = per_address_.find(slot.address);
               count != per_address_.end() && --count->second <= 0) {
      per_address_.erase(count);
    }
    slots_.erase(slot.order);
  }

  HttpFrontOptions options_;
  std::unique_ptr<net::ssl::context> tls_;  // null: plain HTTP
  ScreenFn screen_;
  HandleFn handle_;
  // Admission (TakeSlot): the open connections by age, the regular ones per address.
  Mutex slots_mu_;
  std::map<uint64_t, std::shared_ptr<ConnectionSlot>> slots_ ABSL_GUARDED_BY(slots_mu_);
  std::unordered_map<std::string, int> per_address_ ABSL_GUARDED_BY(slots_mu_);
  int overflow_ ABSL_GUARDED_BY(slots_mu_) = 0;
  uint64_t next_order_ ABSL_GUARDED_BY(slots_mu_) = 0;
  Mutex busy_mu_;
  std::condition_variable idle_;  // busy_ reached 0
  int busy_ ABSL_GUARDED_BY(busy_mu_) = 0;
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
// Over TLS, the handshake comes first.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(AnyStream stream, HttpFront::Impl* front, std::shared_ptr<ConnectionSlot> slot)
      : stream_(std::move(stream)), front_(front), slot_(std::move(slot)) {}
  ~Connection() {
    Busy(false);
    front_->ReleaseSlot(*slot_);
  }

  void Start() {
    // Evicted (a new connection needs the place of this idle one): closed on its strand.
    slot_->evict = [weak = this->weak_from_this(), executor = stream_.get_executor()] {
      net::post(executor, [weak] {
        if (auto self = weak.lock()) self->Close();
      });
    };
    if (stream_.tls()) {
      // The handshake is within the first request's deadline; a client that
      // speaks plain HTTP fails it and is closed unanswered.
      Lowest().expires_after(std::chrono::seconds(options().request_deadline_seconds));
      stream_.async_handshake([self = this->shared_from_this()](error_code ec) {
        if (ec) return self->Close();
        self->ReadNextHead();
      });
    } else {
      ReadNextHead();
    }
  }

 private:
  beast::tcp_stream& Lowest() { return stream_.lowest(); }

  const HttpFrontOptions& options() const { return front_->options(); }

  // Waits, idle, for the first bytes of the next request (a client that sends none
  // within the request deadline is closed unanswered, and an idle connection is the
  // first to give its place to a new one), then reads its head.
  void ReadNextHead() {
    parser_.emplace();
    ConfigureParser(*parser_, options());
    head_only_ = false;                                // until this request's method is known
    if (buffer_.size() > 0) return ReadRequestHead();  // sent already, after the last request
    slot_->idle = true;
    Lowest().expires_after(std::chrono::seconds(options().request_deadline_seconds));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (ec) return self->Close();
                              self->buffer_.commit(n);
                              self->ReadRequestHead();
                            });
  }

  void ReadRequestHead() {
    slot_->idle = false;
    // One deadline for the whole request, head and body, from its first byte (time
    // the request waits for a handler thread of ours is added back: it is not the
    // client's).
    deadline_ =
        std::chrono::steady_clock::now() + std::chrono::seconds(options().request_deadline_seconds);
    Lowest().expires_at(deadline_);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](error_code ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(const error_code& ec) {
    if (ec) return OnReadError(ec);
    version_ = parser_->get().version();
    head_only_ = parser_->get().method() == bhttp::verb::head;
    if (auto refused = ReadHead(*parser_, options(), &request_)) {
      return Write(std::move(*refused), false);
    }
    request_.earlier_requests = requests_++;
    request_.socket_fd = Lowest().socket().native_handle();
    if (front_->stopping()) {
      // Draining: nothing new is started, not even a health check that would say "ok".
      return Write(ProblemResponse(ProblemKind::kUnavailable,
                                   "the server is stopping; retry on another", request_.path),
                   false);
    }
    if (!options().health_path.empty() && request_.path == options().health_path &&
        (request_.method == "GET" || head_only_) && request_.query.empty() && parser_->is_done()) {
      // Answered here, on the I/O thread: busy handlers never delay it.
      ServerResponse ok;
      ok.SetContent("ok\n", "text/plain");
      return Write(std::move(ok), parser_->get().keep_alive() && !slot_->overflow);
    }
    if (slot_->overflow) {
      // Admitted past the limits for the health check only.
      ServerResponse busy = ProblemResponse(ProblemKind::kUnavailable,
                                            "too many connections; retry shortly", request_.path);
      busy.SetHeader("Retry-After", "1");
      return Write(std::move(busy), false);
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
        self->Lowest().expires_at(self->deadline_);
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
      auto go_on =
          std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, version_);
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
      net::post(self->stream_.get_executor(),
                [self, res, keep_alive] { self->Write(std::move(*res), keep_alive); });
    });
  }

  void OnReadError(const error_code& ec) {
    auto answer = ReadFailure(ec, options());
    if (!answer) return Close();
    Write(std::move(*answer), false);
  }

  void Write(ServerResponse res, bool keep_alive) {
    response_ = ToBeast(std::move(res), version_, keep_alive && !front_->stopping(), head_only_);
    Lowest().expires_after(std::chrono::seconds(options().write_deadline_seconds));
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
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Lowest().expires_after(std::chrono::seconds(1));
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
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().close();
  }

  AnyStream stream_;
  HttpFront::Impl* front_;
  std::shared_ptr<ConnectionSlot> slot_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  ServerRequest request_;
  BeastResponse response_;
  unsigned version_ = 11;
  size_t requests_ = 0;  // heads read on this connection
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
    const tcp::endpoint peer = socket.remote_endpoint(ignored);
    std::shared_ptr<ConnectionSlot> slot = TakeSlot(peer.address().to_string());
    if (slot == nullptr) {
      static const std::string kBusy = [] {
        ServerResponse busy =
            ProblemResponse(ProblemKind::kUnavailable, "too many connections; retry shortly", "");
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
      try {
        AnyStream stream = tls_ != nullptr ? AnyStream(TlsStream(std::move(socket), *tls_))
                                           : AnyStream(beast::tcp_stream(std::move(socket)));
        std::make_shared<Connection>(std::move(stream), this, slot)->Start();
      } catch (...) {
        ReleaseSlot(*slot);  // no connection holds it
        throw;
      }
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

}  // namespace waystone
