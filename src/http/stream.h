#pragma once

// A connection's stream for the HTTP front (http_front.cc alone includes this: it
// brings Boost.Beast): plain TCP or TLS over it as one type, and the TLS context a
// listener serves with.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/status/statusor.h"

namespace waystone::http_stream {

namespace beast = boost::beast;
namespace net = boost::asio;
using beast::error_code;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// The TLS context of `cert_file` and `key_file`: TLS 1.2 and later only. Errors
// name the file that could not be read or used.
absl::StatusOr<std::unique_ptr<net::ssl::context>> TlsContext(const std::string& cert_file,
                                                              const std::string& key_file);

// One read's or one write's completion, whatever Beast operation waits for it: the
// streams below are compiled against this one handler type, not once per operation.
class IoCompletion {
 public:
  template <typename Handler>
  explicit IoCompletion(Handler handler)
      : call_(std::make_unique<Holder<Handler>>(std::move(handler))) {}

  void operator()(error_code ec, size_t bytes) {
    std::unique_ptr<Base> call = std::move(call_);  // called once
    call->Call(ec, bytes);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void Call(error_code ec, size_t bytes) = 0;
  };
  template <typename Handler>
  struct Holder final : Base {
    explicit Holder(Handler h) : handler(std::move(h)) {}
    void Call(error_code ec, size_t bytes) override { std::move(handler)(ec, bytes); }
    Handler handler;
  };
  std::unique_ptr<Base> call_;
};

// A connection's stream, plain TCP or TLS over it, as one type: Beast's composed
// operations (read a head, read a body, write an answer) are compiled once for it
// rather than once for each stream, and each stream's own reads and writes once for
// IoCompletion: this file's compile with gcc -O3 went from 68 to 35 s. A read fills
// the first buffer it is given, a write sends up to 16 (a stream may always do less
// than asked).
class AnyStream {
 public:
  using executor_type = net::any_io_executor;

  explicit AnyStream(beast::tcp_stream plain) : impl_(std::make_unique<Plain>(std::move(plain))) {}
  explicit AnyStream(TlsStream tls) : impl_(std::make_unique<Tls>(std::move(tls))) {}

  executor_type get_executor() { return impl_->lowest().get_executor(); }
  beast::tcp_stream& lowest() { return impl_->lowest(); }
  bool tls() const { return impl_->tls(); }

  // TLS: the server's side of the handshake; plain: nothing to do (never called).
  void async_handshake(std::function<void(error_code)> done) { impl_->Handshake(std::move(done)); }

  template <typename MutableBuffers, typename Handler>
  void async_read_some(const MutableBuffers& buffers, Handler&& handler) {
    net::mutable_buffer first;
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers);
         ++it) {
      first = net::mutable_buffer(*it);
      if (first.size() > 0) break;
    }
    impl_->Read(first, IoCompletion(std::forward<Handler>(handler)));
  }

  template <typename ConstBuffers, typename Handler>
  void async_write_some(const ConstBuffers& buffers, Handler&& handler) {
    std::vector<net::const_buffer> pieces;
    for (auto it = net::buffer_sequence_begin(buffers);
         it != net::buffer_sequence_end(buffers) && pieces.size() < 16; ++it) {
      pieces.emplace_back(*it);
    }
    impl_->Write(std::move(pieces), IoCompletion(std::forward<Handler>(handler)));
  }

 private:
  struct Impl {
    virtual ~Impl() = default;
    virtual beast::tcp_stream& lowest() = 0;
    virtual bool tls() const = 0;
    virtual void Handshake(std::function<void(error_code)> done) = 0;
    virtual void Read(net::mutable_buffer buffer, IoCompletion done) = 0;
    virtual void Write(std::vector<net::const_buffer> buffers, IoCompletion done) = 0;
  };
  struct Plain final : Impl {
    explicit Plain(beast::tcp_stream s) : stream(std::move(s)) {}
    beast::tcp_stream& lowest() override { return stream; }
    bool tls() const override { return false; }
    void Handshake(std::function<void(error_code)> done) override { done({}); }
    void Read(net::mutable_buffer buffer, IoCompletion done) override {
      stream.async_read_some(buffer, std::move(done));
    }
    void Write(std::vector<net::const_buffer> buffers, IoCompletion done) override {
      stream.async_write_some(buffers, std::move(done));
    }
    beast::tcp_stream stream;
  };
  struct Tls final : Impl {
    explicit Tls(TlsStream s) : stream(std::move(s)) {}
    beast::tcp_stream& lowest() override { return beast::get_lowest_layer(stream); }
    bool tls() const override { return true; }
    void Handshake(std::function<void(error_code)> done) override {
      stream.async_handshake(net::ssl::stream_base::server, std::move(done));
    }
    void Read(net::mutable_buffer buffer, IoCompletion done) override {
      stream.async_read_some(buffer, std::move(done));
    }
    void Write(std::vector<net::const_buffer> buffers, IoCompletion done) override {
      stream.async_write_some(buffers, std::move(done));
    }
    TlsStream stream;
  };
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone::http_stream
