#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <optional>

#include <algorithm>
#include <charconv>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/sha256.h"
#include "connectors/http/curl_mail.h"
#include "connectors/http/http_client.h"

namespace waystone {
namespace {

struct EasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};

// The receive buffer of one request (libcurl's minimum is 1 KiB, its default 16).
constexpr long kReceiveBuffer = 2048;

size_t WriteBody(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  constexpr size_t kMaxBody = 8 << 20;  // a response larger than this is cut off
  const size_t bytes = size * count;
  if (body->size() + bytes > kMaxBody) return 0;
  body->append(data, bytes);
  return bytes;
}

struct HeaderState {
  std::optional<Millis> retry_after;
  std::vector<std::pair<std::string, std::string>> headers;  // of the last response
};

// Returns the Retry-After delay a header value says: delta-seconds or an HTTP date.
std::optional<Millis> ParseRetryAfter(const std::string& value) {
  long long seconds = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (ec == std::errc() && end == value.data() + value.size() && seconds >= 0) {
    return seconds * 1000;
  }
  const time_t at = curl_getdate(value.c_str(), nullptr);
  if (at <= 0) return std::nullopt;
  return std::max<Millis>(0, static_cast<Millis>(at - time(nullptr)) * 1000);
}

// Reads one header line: its name (lower case) and trimmed value are kept, bounded,
// and a Retry-After is parsed. A status line (every response of a redirect or a
// 100 Continue has one) starts the list again.
size_t ReadHeader(char* data, size_t size, size_t count, void* user) {
  constexpr size_t kMaxHeaders = 64;
  constexpr size_t kMaxValue = 1024;
  auto* state = static_cast<HeaderState*>(user);
  const std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) {
    state->headers.clear();
    return size * count;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return size * count;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  std::string_view value = line.substr(colon + 1);
  const size_t first = value.find_first_not_of(" \t");
  const size_t last = value.find_last_not_of(" \t\r\n");
  value = first == std::string_view::npos ? "" : value.substr(first, last - first + 1);
  if (name == "retry-after") {
    if (std::optional<Millis> delay = ParseRetryAfter(std::string(value))) {
      state->retry_after = delay;
    }
  }
  if (state->headers.size() < kMaxHeaders) {
    state->headers.emplace_back(std::move(name), std::string(value.substr(0, kMaxValue)));
  }
  return size * count;
}

// Streams a pinned file to libcurl, checking it on the way (see FileContent): the
// last piece is handed over only once the whole file was read and still has its
// pinned size and SHA-256, so a changed file never reaches the target complete.
struct FileStream {
  explicit FileStream(const FileContent* c) : content(c) {}
  ~FileStream() {
    if (file != nullptr) std::fclose(file);
  }
  FileStream(const FileStream&) = delete;
  FileStream& operator=(const FileStream&) = delete;

  const FileContent* content;
  FILE* file = nullptr;
  int64_t delivered = 0;
  Sha256Stream hash;
  bool changed = false;
};

size_t ReadStream(char* buffer, size_t size, size_t count, void* user) {
  auto* stream = static_cast<FileStream*>(user);
  if (stream->changed) return CURL_READFUNC_ABORT;
  if (stream->file == nullptr) {
    stream->file = OpenPinnable(stream->content->path.c_str());
    struct stat info {};
    const bool same = stream->file != nullptr && fstat(fileno(stream->file), &info) == 0 &&
                      static_cast<uint64_t>(info.st_dev) == stream->content->device &&
                      static_cast<uint64_t>(info.st_ino) == stream->content->inode;
    if (!same) {  // gone, unreadable, or another file in its place
      stream->changed = true;
      return CURL_READFUNC_ABORT;
    }
  }
  const int64_t left = stream->content->size - stream->delivered;
  if (left <= 0) return 0;
  const size_t want = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(size * count),
                                                            left));
  const size_t got = std::fread(buffer, 1, want, stream->file);
  stream->hash.Add(std::string_view(buffer, got));
  stream->delivered += static_cast<int64_t>(got);
  const bool last = stream->delivered == stream->content->size;
  if (got < want ||
      (last && (std::fgetc(stream->file) != EOF || stream->hash.Finish() != stream->content->sha256))) {
    stream->changed = true;
    return CURL_READFUNC_ABORT;
  }
  return got;
}

// libcurl rewinds a body it must send again from the start (never elsewhere).
int SeekStream(void* user, curl_off_t offset, int origin) {
  auto* stream = static_cast<FileStream*>(user);
  if (offset != 0 || origin != SEEK_SET) return CURL_SEEKFUNC_CANTSEEK;
  if (stream->file != nullptr) std::rewind(stream->file);
  stream->delivered = 0;
  stream->hash.Reset();
  return CURL_SEEKFUNC_OK;
}

// One request on its way: the easy handle and everything libcurl points into
// while it runs (the body is sent from `request.body`, not copied).
struct Transfer {
  HttpRequest request;
  HttpDone done;
  std::unique_ptr<CURL, EasyDeleter> easy{curl_easy_init()};
  curl_slist* headers = nullptr;
  HeaderState header_state;
  HttpResponse response;
  bool held_back = false;  // request.may_send said no: nothing left
  char error_detail[CURL_ERROR_SIZE] = {};  // libcurl's own words on a failure
  curl_mime* mime = nullptr;                     // a multipart body
  std::vector<std::unique_ptr<FileStream>> streams;  // files sent from disk
  curl_mail::MailTransfer mail;                      // an email's message and replies

  Transfer(HttpRequest r, HttpDone d) : request(std::move(r)), done(std::move(d)) {}
  ~Transfer() {
    easy.reset();  // before the body it may still point into
    curl_mime_free(mime);
    curl_slist_free_all(headers);
  }

  // The stream of the file that no longer matches its pin, or null.
  const FileStream* Changed() const {
    for (const auto& stream : streams) {
      if (stream->changed) return stream.get();
    }
    return nullptr;
  }
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
};

// libcurl's last call before the request is written (the connection is up): the
// request's may_send decides whether it leaves at all.
int BeforeSending(void* user, char*, char*, int, int) {
  auto* transfer = static_cast<Transfer*>(user);
  if (!transfer->request.may_send || transfer->request.may_send()) return CURL_PREREQFUNC_OK;
  transfer->held_back = true;
  return CURL_PREREQFUNC_ABORT;
}

// Sets up `transfer`'s easy handle for its HTTP request.
void ConfigureHttp(Transfer& transfer) {
  CURL* curl = transfer.easy.get();
  const HttpRequest& request = transfer.request;
  bool has_content_type = false;
  for (const auto& [name, value] : request.headers) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    has_content_type = has_content_type || lower == "content-type";
    transfer.headers = curl_slist_append(transfer.headers, (name + ": " + value).c_str());
  }
  if (!request.body.empty() && !has_content_type) {
    transfer.headers = curl_slist_append(transfer.headers, "Content-Type: application/json");
  }
  transfer.headers = curl_slist_append(transfer.headers, "Expect:");
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  if (request.method == "HEAD") curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  auto stream_of = [&](const FileContent& content) {
    transfer.streams.push_back(std::make_unique<FileStream>(&content));
    return transfer.streams.back().get();
  };
  if (!request.multipart.empty()) {
    transfer.mime = curl_mime_init(curl);
    for (const FormPart& form_part : request.multipart) {
      curl_mimepart* part = curl_mime_addpart(transfer.mime);
      curl_mime_name(part, form_part.name.c_str());
      if (!form_part.is_file) {
        curl_mime_data(part, form_part.value.data(), form_part.value.size());
        continue;
      }
      curl_mime_filename(part, form_part.filename.c_str());
      curl_mime_type(part, form_part.content_type.empty() ? "application/octet-stream"
                                                          : form_part.content_type.c_str());
      const FileContent& file = form_part.file;
      if (file.path.empty()) {
        curl_mime_data(part, file.bytes.data(), file.bytes.size());
      } else {
        curl_mime_data_cb(part, static_cast<curl_off_t>(file.size), ReadStream, SeekStream,
                          nullptr, stream_of(file));
      }
    }
    curl_easy_setopt(curl, CURLOPT_MIMEPOST, transfer.mime);
  } else if (!request.body_file->path.empty()) {
    FileStream* stream = stream_of(*request.body_file);
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadStream);
    curl_easy_setopt(curl, CURLOPT_READDATA, stream);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, SeekStream);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, stream);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body_file->size));
  } else if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
             request.method == "PATCH") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, transfer.headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer.response.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer.header_state);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  // HTTP/1.1 only: an HTTP/2 REFUSED_STREAM makes libcurl send the request again.
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
}

// Sets up `transfer`'s easy handle for its request, HTTP or an email.
void Configure(Transfer& transfer, const HttpClientOptions& options) {
  CURL* curl = transfer.easy.get();
  const HttpRequest& request = transfer.request;
  curl_easy_setopt(curl, CURLOPT_PRIVATE, &transfer);
  if (request.IsMail()) {
    curl_mail::Configure(curl, request, transfer.mail);
  } else {
    ConfigureHttp(transfer);
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min(request.timeout, options.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PREREQFUNCTION, BeforeSending);
  curl_easy_setopt(curl, CURLOPT_PREREQDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, options.verify_tls ? 1L : 0L);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, options.verify_tls ? 2L : 0L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, transfer.error_detail);
  const TlsIdentity& tls = *request.tls;
  if (!tls.ca_file.empty()) {
    // Instead of the system's CAs, not beside them: libcurl would otherwise still
    // trust its built-in CA folder, and so any public CA, for this target.
    curl_easy_setopt(curl, CURLOPT_CAINFO, tls.ca_file.c_str());
    curl_easy_setopt(curl, CURLOPT_CAPATH, nullptr);
  }
  if (!tls.cert_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, tls.cert_file.c_str());
    curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
  }
  if (!tls.key_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLKEY, tls.key_file.c_str());
    curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
  }
  if (!tls.key_password.empty()) {
    curl_easy_setopt(curl, CURLOPT_KEYPASSWD, tls.key_password.c_str());
  }
  // A receive buffer per waiting request: API answers are small, and thousands wait.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, kReceiveBuffer);
  if (request.reuse == ConnectionReuse::kFresh) {
    // libcurl resends a request by itself only on a reused connection that died
    // before the first response byte; a connection of its own rules that out.
    curl_easy_setopt(curl, CURLOPT_FRESH_CONNECT, 1L);
    curl_easy_setopt(curl, CURLOPT_FORBID_REUSE, 1L);
  }
}

// Returns true when a transfer ended because a certificate was refused, ours or the
// server's: a verification failure, a file that cannot be used, or a TLS alert from
// the peer (OpenSSL says "... alert ..."; with TLS 1.3 the server's verdict on our
// certificate can arrive after the request was written, yet it never reached the
// application behind the TLS layer).
bool TlsRefused(CURLcode rc, const char* detail) {
  switch (rc) {
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CRL_BADFILE:
      return true;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR: {
      const std::string_view text(detail);
      return text.find("alert") != std::string_view::npos &&
             (text.find("certificate") != std::string_view::npos ||
              text.find("unknown ca") != std::string_view::npos);
    }
    default:
      return false;
  }
}

// Fills in `transfer.response` from how its transfer ended.
void Conclude(Transfer& transfer, CURLcode rc) {
  CURL* curl = transfer.easy.get();
  HttpResponse& response = transfer.response;
  long request_size = 0;
  curl_easy_getinfo(curl, CURLINFO_REQUEST_SIZE, &request_size);
  long new_connections = 0;
  curl_easy_getinfo(curl, CURLINFO_NUM_CONNECTS, &new_connections);
  long connected_port = 0;
  curl_easy_getinfo(curl, CURLINFO_PRIMARY_PORT, &connected_port);
  response.outcome.sent = request_size > 0 && !transfer.held_back;
  response.outcome.connection = new_connections > 0 ? ConnectionUsed::kNew
                                : connected_port > 0 ? ConnectionUsed::kReused
                                                     : ConnectionUsed::kNone;
  if (rc == CURLE_OK && transfer.request.IsMail()) {
    curl_mail::Conclude(curl, rc, transfer.mail, "", response);
    return;
  }
  if (rc == CURLE_OK) {
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    response.outcome.kind = CallOutcome::Kind::kResponse;
    response.outcome.status = static_cast<int>(status);
    response.outcome.retry_after = transfer.header_state.retry_after;
    response.headers = std::move(transfer.header_state.headers);
    return;
  }
  if (transfer.held_back) {
    response.outcome.kind = CallOutcome::Kind::kNotSent;
    response.outcome.withdrawn = true;
    response.error = "not sent: the caller withdrew it before its first byte left";
    response.body.clear();
    return;
  }
  if (const FileStream* changed = transfer.Changed()) {
    // Cut off before its last byte: no complete request reached the target.
    response.outcome.kind = CallOutcome::Kind::kNotSent;
    response.outcome.content_changed = true;
    response.error = "the file " + changed->content->path + " changed after it was pinned (" +
                     changed->content->sha256.substr(0, 16) + ", " +
                     std::to_string(changed->content->size) +
                     " bytes); the request was cut off before its end";
    response.body.clear();
    return;
  }
  std::string detail = curl_easy_strerror(rc);
  if (transfer.error_detail[0] != '\0') detail += std::string(": ") + transfer.error_detail;
  if (TlsRefused(rc, transfer.error_detail)) {
    // The TLS layer refused the exchange, so no request reached the application: a
    // certificate problem is not retried, and says which target it concerns.
    response.outcome.kind = CallOutcome::Kind::kInvalid;
    response.outcome.identity_refused = true;
    response.outcome.sent = false;
    const std::string& target = transfer.request.tls->target;
    response.error = "TLS with " + (target.empty() ? std::string("the server")
                                                    : "target '" + target + "'") +
                     " failed: " + detail;
    response.body.clear();
    return;
  }
  const std::string& target = transfer.request.tls->target;  // set for any request under a target
  const std::string located = target.empty() ? detail : "target '" + target + "': " + detail;
  if (transfer.request.IsMail()) {
    curl_mail::Conclude(curl, rc, transfer.mail, located, response);
    return;
  }
  // Whether the request left decides transient (nothing happened) vs unknown.
  const bool invalid = rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT;
  const bool not_sent = request_size == 0 || rc == CURLE_COULDNT_CONNECT ||
                        rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY ||
                        rc == CURLE_SSL_CONNECT_ERROR;
  response.outcome.kind = invalid    ? CallOutcome::Kind::kInvalid
                          : not_sent ? CallOutcome::Kind::kNotSent
                                     : CallOutcome::Kind::kLostAfterSend;
  response.error = located;
  response.body.clear();
}

// Hands a finished transfer's response to its caller, after freeing the handle.
void Deliver(std::unique_ptr<Transfer> transfer) {
  HttpResponse response = std::move(transfer->response);
  HttpDone done = std::move(transfer->done);
  transfer.reset();
  std::move(done)(std::move(response));
}

// A response for a request that never left.
void Refuse(std::unique_ptr<Transfer> transfer, std::string why) {
  transfer->response.outcome.kind = CallOutcome::Kind::kNotSent;
  transfer->response.error = std::move(why);
  Deliver(std::move(transfer));
}

// Runs every request on one thread with libcurl's multi interface, driven by epoll
// through curl_multi_socket_action: a waiting request costs its handle and socket,
// not a thread, and each turn of the loop touches only the sockets that are ready
// (curl_multi_poll would look at every socket, every turn).
class CurlHttpClient final : public HttpClient {
 public:
  explicit CurlHttpClient(const HttpClientOptions& options) : options_(options) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    wakeup_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    multi_ = curl_multi_init();
    if (epoll_ < 0 || wakeup_ < 0 || multi_ == nullptr) return;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = wakeup_;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, wakeup_, &event);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &CurlHttpClient::OnSocket);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &CurlHttpClient::OnTimer);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    ready_ = true;
    loop_ = std::jthread([this] { Loop(); });
  }

  ~CurlHttpClient() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    Wake();
    if (loop_.joinable()) loop_.join();
    if (multi_ != nullptr) curl_multi_cleanup(multi_);
    if (wakeup_ >= 0) close(wakeup_);
    if (epoll_ >= 0) close(epoll_);
  }

  HttpResponse Send(const HttpRequest& request) override {
    if (std::this_thread::get_id() == loop_.get_id()) {
      HttpResponse response;
      response.outcome.kind = CallOutcome::Kind::kNotSent;
      response.error = "Send called from a response callback of the same client";
      return response;
    }
    std::promise<HttpResponse> answered;
    std::future<HttpResponse> answer = answered.get_future();
    SendAsync(request, [&answered](HttpResponse response) {
      answered.set_value(std::move(response));
    });
    return answer.get();
  }

  void SendAsync(HttpRequest request, HttpDone done) override {
    auto transfer = std::make_unique<Transfer>(std::move(request), std::move(done));
    if (!ready_ || transfer->easy == nullptr) {
      return Refuse(std::move(transfer), "curl_easy_init, curl_multi_init or epoll failed");
    }
    Configure(*transfer, options_);
    {
      MutexLock lock(mu_);
      if (!stopping_) {
        incoming_.push_back(std::move(transfer));
      }
    }
    if (transfer != nullptr) return Refuse(std::move(transfer), "the HTTP client is shutting down");
    Wake();
  }

 private:
  void Wake() {
    if (wakeup_ < 0) return;
    const uint64_t one = 1;
    ssize_t written = write(wakeup_, &one, sizeof(one));
    (void)written;  // a full counter already wakes the loop
  }

  // libcurl says which events to watch on socket `s`.
  static int OnSocket(CURL*, curl_socket_t s, int what, void* user, void*) {
    auto* self = static_cast<CurlHttpClient*>(user);
    if (what == CURL_POLL_REMOVE) {
      epoll_ctl(self->epoll_, EPOLL_CTL_DEL, s, nullptr);
      return 0;
    }
    epoll_event event{};
    event.data.fd = s;
    event.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    if (epoll_ctl(self->epoll_, EPOLL_CTL_MOD, s, &event) != 0 && errno == ENOENT) {
      epoll_ctl(self->epoll_, EPOLL_CTL_ADD, s, &event);
    }
    return 0;
  }

  // libcurl asks to be called back after `timeout_ms` (-1: never).
  static int OnTimer(CURLM*, long timeout_ms, void* user) {
    auto* self = static_cast<CurlHttpClient*>(user);
    self->timer_due_ = timeout_ms < 0 ? std::nullopt
                                      : std::optional(std::chrono::steady_clock::now() +
                                                      std::chrono::milliseconds(timeout_ms));
    return 0;
  }

  // Hands every finished transfer to its caller.
  void Harvest(std::map<CURL*, std::unique_ptr<Transfer>>& active) {
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(multi_, &queued)) {
      if (message->msg != CURLMSG_DONE) continue;
      // The message does not outlive curl_multi_remove_handle: copy it first.
      CURL* easy = message->easy_handle;
      const CURLcode result = message->data.result;
      curl_multi_remove_handle(multi_, easy);
      auto it = active.find(easy);
      if (it == active.end()) continue;
      std::unique_ptr<Transfer> transfer = std::move(it->second);
      active.erase(it);
      Conclude(*transfer, result);
      Deliver(std::move(transfer));
    }
  }

  void Loop() {
    std::map<CURL*, std::unique_ptr<Transfer>> active;
    std::vector<epoll_event> events(256);
    int running = 0;
    while (true) {
      std::vector<std::unique_ptr<Transfer>> added;
      bool stopping = false;
      {
        MutexLock lock(mu_);
        added.swap(incoming_);
        stopping = stopping_;
      }
      for (auto& transfer : added) {
        CURL* easy = transfer->easy.get();
        if (const CURLMcode rc = curl_multi_add_handle(multi_, easy); rc != CURLM_OK) {
          Refuse(std::move(transfer), curl_multi_strerror(rc));
          continue;
        }
        active.emplace(easy, std::move(transfer));
      }
      if (stopping) break;
      int wait_ms = kIdleMillis;
      if (timer_due_) {
        // Rounded up: a timer less than a millisecond away must not spin the loop.
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
            *timer_due_ - std::chrono::steady_clock::now());
        wait_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, kIdleMillis));
      }
      const int ready = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                                   wait_ms);
      for (int i = 0; i < ready; ++i) {
        if (events[i].data.fd == wakeup_) {
          uint64_t count = 0;
          ssize_t got = read(wakeup_, &count, sizeof(count));
          (void)got;  // drained; the incoming queue is read at the top of the loop
          continue;
        }
        int mask = 0;
        if (events[i].events & (EPOLLIN | EPOLLHUP)) mask |= CURL_CSELECT_IN;
        if (events[i].events & EPOLLOUT) mask |= CURL_CSELECT_OUT;
        if (events[i].events & EPOLLERR) mask |= CURL_CSELECT_ERR;
        curl_multi_socket_action(multi_, events[i].data.fd, mask, &running);
      }
      if (timer_due_ && std::chrono::steady_clock::now() >= *timer_due_) {
        timer_due_.reset();  // libcurl sets the next one from inside the call
        curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
      }
      Harvest(active);
    }
    // Shutting down: what is still under way ends here, sent or not as it stands.
    for (auto& [easy, transfer] : active) {
      curl_multi_remove_handle(multi_, easy);
      Conclude(*transfer, CURLE_ABORTED_BY_CALLBACK);
      transfer->response.error = "the HTTP client shut down during the request";
      Deliver(std::move(transfer));
    }
  }

  static constexpr int kIdleMillis = 1000;

  HttpClientOptions options_;
  int epoll_ = -1;
  int wakeup_ = -1;          // eventfd: SendAsync and the destructor wake the loop
  CURLM* multi_ = nullptr;   // the loop thread's alone once it runs
  bool ready_ = false;       // epoll, eventfd and multi handle exist
  std::optional<std::chrono::steady_clock::time_point> timer_due_;  // loop thread only
  Mutex mu_;
  std::vector<std::unique_ptr<Transfer>> incoming_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::jthread loop_;
};

}  // namespace

std::unique_ptr<HttpClient> NewCurlHttpClient(const HttpClientOptions& options) {
  return std::make_unique<CurlHttpClient>(options);
}

}  // namespace waystone
