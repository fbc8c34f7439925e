#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "connectors/http/curl_transfer.h"
#include "connectors/http/http_client.h"

namespace waystone {
namespace {

using curl_transfer::Conclude;
using curl_transfer::Configure;
using curl_transfer::Deliver;
using curl_transfer::Refuse;
using curl_transfer::Transfer;

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
    SendAsync(request,
              [&answered](HttpResponse response) { answered.set_value(std::move(response)); });
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
      const int ready = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), wait_ms);
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
  int wakeup_ = -1;         // eventfd: SendAsync and the destructor wake the loop
  CURLM* multi_ = nullptr;  // the loop thread's alone once it runs
  bool ready_ = false;      // epoll, eventfd and multi handle exist
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
