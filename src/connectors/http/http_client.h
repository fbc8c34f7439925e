#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "base/boxed.h"
#include "base/clock.h"
#include "model/classify.h"
#include "model/http_response.h"

namespace waystone {

// Whether a request may travel on a kept-alive connection. A request on a reused
// connection that the server closes before any response byte is resent by libcurl on
// its own ("connection died, retrying a fresh connect"): one recorded attempt, two
// requests on the wire. Calls made for the engine therefore always take a fresh one.
enum class ConnectionReuse : uint8_t {
  kFresh = 1,  // a new connection, closed after the response: exactly one request is sent
  kReuse = 2,  // a kept-alive connection when one is idle (the library may resend)
};

// The TLS identity a request is made with, from its target (all empty: the system's
// trust store, no client certificate). Files are PEM.
struct TlsIdentity {
  std::string target;        // the target's name, for messages
  std::string ca_file;       // trusted CAs instead of the system's
  std::string cert_file;     // client certificate
  std::string key_file;      // its key
  std::string key_password;  // the key's passphrase

  bool operator==(const TlsIdentity&) const = default;
};

// OAuth2 client credentials (RFC 6749 §4.4) a request is authorised with, from its
// target (token_url empty: none). The client in NewOAuth2HttpClient gets the token;
// the secret lives in memory only.
struct OAuth2Client {
  std::string target;     // the target's name, for messages
  std::string token_url;  // the authorisation server's token endpoint
  std::string client_id;
  std::string client_secret;
  std::string scope;  // space-separated; empty: the server's default
  TlsIdentity tls;    // how the token endpoint is reached

  bool operator==(const OAuth2Client&) const = default;
};

// The content of a file sent in a request, pinned by its SHA-256 and size before the
// first attempt. With `path`, it is streamed from disk as it is sent and checked on
// the way: a file that no longer matches is cut off before its last byte (the target
// never gets a complete request) and the answer is kNotSent with content_changed.
// Without, `bytes` holds it.
struct FileContent {
  std::string path;
  std::string bytes;
  std::string sha256;
  int64_t size = 0;
  // With `path`: the file pinned (what is opened to send must be this very file, not
  // whatever a renamed folder or a swapped link leads to by then).
  uint64_t device = 0;
  uint64_t inode = 0;

  bool operator==(const FileContent&) const = default;
};

// One part of a multipart/form-data body (RFC 7578): a text field, or a file.
struct FormPart {
  std::string name;
  std::string value;  // a field's text
  bool is_file = false;
  std::string filename;      // a file's name, as the receiver sees it
  std::string content_type;  // a file's type
  FileContent file;

  bool operator==(const FormPart&) const = default;
};

// The SMTP envelope of a request that sends an email (RFC 5321) to an smtp:// or
// smtps:// URL; its body is then the message (RFC 5322, lines ending CRLF).
struct MailEnvelope {
  std::string from;             // MAIL FROM
  std::vector<std::string> to;  // RCPT TO, each
  std::string user;             // AUTH, when both are set
  std::string password;

  bool operator==(const MailEnvelope&) const = default;
};

// One request to an external system: HTTP, or an email over SMTP when `mail.from`
// is set (then `method`, `headers` and the other body forms are unused). A value type.
struct HttpRequest {
  std::string method;
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  Millis timeout = 10'000;
  ConnectionReuse reuse = ConnectionReuse::kFresh;
  // Asked at the last moment before the request's first byte leaves (the connection
  // made); false: the request is not sent and the answer is kNotSent. The engine's
  // lease check lives here, so a worker that was paused past its lease after deciding
  // to call sends nothing when it wakes. Empty: always sent. Called on the client's
  // thread; it must be quick and thread-safe.
  std::function<bool()> may_send;
  // The parts below are empty in most requests, and boxed so that an empty one costs
  // a pointer: thousands of requests can be under way at once.
  Boxed<TlsIdentity> tls;
  Boxed<OAuth2Client> oauth2;  // sent with a bearer token when set (NewOAuth2HttpClient)
  // Non-empty: the body is multipart/form-data of these parts (`body` unused; the
  // client sets the Content-Type with its boundary).
  std::vector<FormPart> multipart;
  // `path` set: the body is streamed from this file (`body` unused).
  Boxed<FileContent> body_file;
  Boxed<MailEnvelope> mail;

  bool IsMail() const { return !mail->from.empty(); }
};

// Receives the response of an asynchronous request, once.
using HttpDone = absl::AnyInvocable<void(HttpResponse) &&>;

// HttpClient sends requests to the outside world; the only place that does.
// Implementations are thread-safe.
class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // Sends `request` and waits for the response or the timeout. Never throws.
  virtual HttpResponse Send(const HttpRequest& request) = 0;
  // Sends `request` and returns at once; `done` gets the response (or the transport
  // error) when it comes, on a thread of the client's, or at once on the caller's (a
  // request refused before it left; this default, which sends with Send): it must be
  // quick, and must not Send or wait for another request on the same client (it may
  // SendAsync one). A waiting request holds no thread of the caller's.
  virtual void SendAsync(HttpRequest request, HttpDone done) { std::move(done)(Send(request)); }
};

struct HttpClientOptions {
  // Longest time to establish a connection, within the request's own timeout.
  Millis connect_timeout = 5'000;
  // Verify TLS peers (always on outside tests against self-signed endpoints).
  bool verify_tls = true;
};

// Returns a libcurl-based client. Every request, Send or SendAsync, travels on one
// event-loop thread of the client's (libcurl's multi interface), so thousands may
// wait at once on that one thread. Requests marked kReuse share the kept-alive
// connections of that loop; kFresh requests (the default) never do, and the client
// never sends one request twice (no redirects, no HTTP/2 stream retries).
std::unique_ptr<HttpClient> NewCurlHttpClient(const HttpClientOptions& options);

// Returns a client that sends through `inner` (not owned; it must outlive the result)
// and authorises each request that carries `oauth2` credentials with a bearer token
// from the client credentials grant (RFC 6749 §4.4); other requests pass through.
// - One token per credentials at a time, kept until shortly before it expires; while
//   it is being fetched, every request for it waits: one token request however many
//   callers.
// - A 401 to a request sent with a token drops that token and sends the request once
//   more with a fresh one. The target refused it before acting on it, so the caller
//   sees only the second answer: no business attempt is spent on an expired token.
// - Without a token the request is not sent: kNotSent (transient) when the token
//   endpoint failed or could not be reached; kInvalid with identity_refused when it
//   refused the credentials (400, 401, 403).
// The secret and the tokens never appear in an error text.
std::unique_ptr<HttpClient> NewOAuth2HttpClient(HttpClient* inner, const Clock* clock);

}  // namespace waystone
