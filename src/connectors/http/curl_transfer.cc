#include "connectors/http/curl_transfer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace waystone::curl_transfer {
namespace {

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
  const size_t want =
      static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(size * count), left));
  const size_t got = std::fread(buffer, 1, want, stream->file);
  stream->hash.Add(std::string_view(buffer, got));
  stream->delivered += static_cast<int64_t>(got);
  const bool last = stream->delivered == stream->content->size;
  if (got < want || (last && (std::fgetc(stream->file) != EOF ||
                              stream->hash.Finish() != stream->content->sha256))) {
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
        curl_mime_data_cb(part, static_cast<curl_off_t>(file.size), ReadStream, SeekStream, nullptr,
                          stream_of(file));
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

}  // namespace

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
  response.outcome.connection = new_connections > 0  ? ConnectionUsed::kNew
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
    response.error = "TLS with " +
                     (target.empty() ? std::string("the server") : "target '" + target + "'") +
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

}  // namespace waystone::curl_transfer
