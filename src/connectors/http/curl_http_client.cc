#include <curl/curl.h>

#include <algorithm>
#include <charconv>
#include <mutex>

#include "connectors/http/http_client.h"

namespace waystone {
namespace {

struct EasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};

// One easy handle per thread keeps connections alive between calls of that thread.
CURL* ThreadHandle() {
  thread_local std::unique_ptr<CURL, EasyDeleter> handle(curl_easy_init());
  curl_easy_reset(handle.get());
  return handle.get();
}

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
};

size_t ReadHeader(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<HeaderState*>(user);
  std::string_view line(data, size * count);
  constexpr std::string_view kName = "retry-after:";
  if (line.size() > kName.size()) {
    std::string lower(line.substr(0, kName.size()));
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower == kName) {
      std::string value(line.substr(kName.size()));
      value.erase(0, value.find_first_not_of(" \t"));
      value.erase(value.find_last_not_of(" \t\r\n") + 1);
      long long seconds = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
      if (ec == std::errc() && end == value.data() + value.size() && seconds >= 0) {
        state->retry_after = seconds * 1000;
      } else {
        const time_t at = curl_getdate(value.c_str(), nullptr);
        if (at > 0) {
          const time_t now = time(nullptr);
          state->retry_after = std::max<Millis>(0, static_cast<Millis>(at - now) * 1000);
        }
      }
    }
  }
  return size * count;
}

class CurlHttpClient final : public HttpClient {
 public:
  explicit CurlHttpClient(const HttpClientOptions& options) : options_(options) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }

  HttpResponse Send(const HttpRequest& request) override {
    HttpResponse response;
    CURL* curl = ThreadHandle();
    if (curl == nullptr) {
      response.outcome.kind = CallOutcome::Kind::kNotSent;
      response.error = "curl_easy_init failed";
      return response;
    }
    curl_slist* headers = nullptr;
    bool has_content_type = false;
    for (const auto& [name, value] : request.headers) {
      std::string lower = name;
      std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
      has_content_type = has_content_type || lower == "content-type";
      headers = curl_slist_append(headers, (name + ": " + value).c_str());
    }
    if (!request.body.empty() && !has_content_type) {
      headers = curl_slist_append(headers, "Content-Type: application/json");
    }
    headers = curl_slist_append(headers, "Expect:");
    HeaderState header_state;
    curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    if (request.method == "HEAD") curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
        request.method == "PATCH") {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min(request.timeout, options_.connect_timeout)));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, ReadHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &header_state);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L);
    // HTTP/1.1 only: an HTTP/2 REFUSED_STREAM makes libcurl send the request again.
    curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    if (request.reuse == ConnectionReuse::kFresh) {
      // libcurl resends a request by itself only on a reused connection that died
      // before the first response byte; a connection of its own rules that out.
      curl_easy_setopt(curl, CURLOPT_FRESH_CONNECT, 1L);
      curl_easy_setopt(curl, CURLOPT_FORBID_REUSE, 1L);
    }

    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    long request_size = 0;
    curl_easy_getinfo(curl, CURLINFO_REQUEST_SIZE, &request_size);
    long new_connections = 0;
    curl_easy_getinfo(curl, CURLINFO_NUM_CONNECTS, &new_connections);
    long connected_port = 0;
    curl_easy_getinfo(curl, CURLINFO_PRIMARY_PORT, &connected_port);
    response.outcome.sent = request_size > 0;
    response.outcome.connection = new_connections > 0    ? ConnectionUsed::kNew
                          : connected_port > 0 ? ConnectionUsed::kReused
                                               : ConnectionUsed::kNone;
    if (rc == CURLE_OK) {
      long status = 0;
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
      response.outcome.kind = CallOutcome::Kind::kResponse;
      response.outcome.status = static_cast<int>(status);
      response.outcome.retry_after = header_state.retry_after;
      return response;
    }
    // Whether the request left decides transient (nothing happened) vs unknown.
    const bool invalid = rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT;
    const bool not_sent = request_size == 0 || rc == CURLE_COULDNT_CONNECT ||
                          rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY ||
                          rc == CURLE_SSL_CONNECT_ERROR;
    response.outcome.kind = invalid    ? CallOutcome::Kind::kInvalid
                            : not_sent ? CallOutcome::Kind::kNotSent
                                       : CallOutcome::Kind::kLostAfterSend;
    response.error = curl_easy_strerror(rc);
    response.body.clear();
    return response;
  }

 private:
  HttpClientOptions options_;
};

}  // namespace

std::unique_ptr<HttpClient> NewCurlHttpClient(const HttpClientOptions& options) {
  return std::make_unique<CurlHttpClient>(options);
}

}  // namespace waystone
