#include <memory>
#include <optional>
#include <string_view>

#include "base/mutex.h"
#include "messaging/sink.h"
#include "messaging/webhook_signature.h"

namespace waystone {
namespace {

class WebhookSink final : public Sink {
 public:
  WebhookSink(const SinkConfig& config, HttpClient* http, const Clock* clock)
      : config_(config), http_(http), clock_(clock) {}

  const std::string& name() const override { return config_.name; }
  Millis longest_attempt() const override { return config_.timeout; }

  DeliveryOutcome Deliver(const EventRecord& event, const std::string& body) override {
    absl::StatusOr<HttpRequest> request = RequestFor(event, body);
    if (!request.ok()) return Unsigned(request.status());
    return OutcomeOf(http_->Send(*request));
  }

  bool delivers_batches() const override { return true; }

  // The batch's events go one after another, each sent from the answer to the one
  // before (on the HTTP client's thread): the relay's thread waits once for the batch,
  // not once per request, and its `parallel` batches keep that many requests out.
  std::vector<DeliveryOutcome> DeliverBatch(const std::vector<const EventRecord*>& events,
                                            const std::vector<std::string>& bodies,
                                            const MayStart& may_start) override;

  // The signed POST of `event`'s CloudEvent `body`.
  absl::StatusOr<HttpRequest> RequestFor(const EventRecord& event, const std::string& body) const {
    const long long timestamp = clock_->NowMillis() / 1000;
    auto signature = SignStandardWebhook(config_.secret, event.event_id, timestamp, body);
    if (!signature.ok()) return signature.status();
    HttpRequest request;
    request.method = "POST";
    request.url = config_.url;
    request.body = body;
    request.timeout = config_.timeout;
    request.reuse = config_.keep_alive ? ConnectionReuse::kReuse : ConnectionReuse::kFresh;
    request.headers = {{"Content-Type", "application/cloudevents+json"},
                       {"webhook-id", event.event_id},
                       {"webhook-timestamp", std::to_string(timestamp)},
                       {"webhook-signature", *std::move(signature)}};
    return request;
  }

  static DeliveryOutcome Unsigned(const absl::Status& status) {
    return {DeliveryOutcome::Result::kRetry, std::string(status.message()), {}};
  }

  static DeliveryOutcome OutcomeOf(const HttpResponse& response) {
    if (response.outcome.kind != CallOutcome::Kind::kResponse) {
      return {DeliveryOutcome::Result::kRetry, response.error, {}};
    }
    const int status = response.outcome.status;
    if (status >= 200 && status < 300) return {DeliveryOutcome::Result::kDelivered, "", {}};
    const std::string detail = "HTTP " + std::to_string(status);
    if (status == 410) return {DeliveryOutcome::Result::kEndpointGone, detail, {}};
    return {DeliveryOutcome::Result::kRetry, detail, response.outcome.retry_after};
  }

  HttpClient* http() const { return http_; }

 private:
  SinkConfig config_;
  HttpClient* http_;
  const Clock* clock_;
};

// One batch on its way: whoever holds the turn (the relay's thread at first, then the
// thread of each answer) starts the next event. An answer that comes while its request
// is still being handed over (or at once, from a client that answers inline) leaves the
// turn with the thread handing it over, so the batch never recurses or forks.
class Chain : public std::enable_shared_from_this<Chain> {
 public:
  Chain(const WebhookSink& sink, const std::vector<const EventRecord*>& events,
        const std::vector<std::string>& bodies, const Sink::MayStart& may_start)
      : sink_(sink),
        events_(events),
        bodies_(bodies),
        may_start_(may_start),
        outcomes_(events.size()) {}

  // Sends every event the lease leaves room for; returns their outcomes, in order.
  std::vector<DeliveryOutcome> Run() {
    TakeTurn();
    MutexLock lock(mu_);
    while (!finished_) finished_changed_.wait(lock.native());
    outcomes_.resize(started_);
    return std::move(outcomes_);
  }

 private:
  // Starts the next event, and the one after whenever an answer comes during its
  // hand-over; returns once a request is under way or the batch is finished. Runs on
  // the client's thread too, so nothing may escape it.
  void TakeTurn() {
    try {
      while (true) {
        size_t i = 0;
        {
          MutexLock lock(mu_);
          i = started_;
        }
        // Only the turn's holder changes `started_`, so `i` is still the next one.
        if (i == events_.size() || !may_start_()) return Finish(std::nullopt);
        absl::StatusOr<HttpRequest> request = sink_.RequestFor(*events_[i], bodies_[i]);
        {
          MutexLock lock(mu_);
          started_ = i + 1;
          if (!request.ok()) {
            outcomes_[i] = WebhookSink::Unsigned(request.status());
            continue;
          }
          out_ = true;
          handing_over_ = true;
          answered_meanwhile_ = false;
        }
        sink_.http()->SendAsync(
            *std::move(request),
            [self = shared_from_this(), i](HttpResponse response) { self->Answered(i, response); });
        MutexLock lock(mu_);
        handing_over_ = false;
        if (!answered_meanwhile_) return;  // the answer takes the turn when it comes
      }
    } catch (const std::exception& e) {
      Finish(e.what());
    }
  }

  void Answered(size_t i, const HttpResponse& response) {
    try {
      DeliveryOutcome outcome = WebhookSink::OutcomeOf(response);
      MutexLock lock(mu_);
      if (finished_) return;  // the batch gave up on it
      outcomes_[i] = std::move(outcome);
      out_ = false;
      if (handing_over_) {
        answered_meanwhile_ = true;  // the thread handing it over goes on
        return;
      }
    } catch (const std::exception& e) {
      return Finish(e.what());
    }
    TakeTurn();
  }

  // Ends the batch; when sending or answering threw (`thrown`), the request out, if
  // any, is a retry. After this the batch's caller may go: touch nothing of it.
  void Finish(std::optional<std::string_view> thrown) {
    MutexLock lock(mu_);
    if (finished_) return;
    if (thrown && out_) {
      outcomes_[started_ - 1] = {
          DeliveryOutcome::Result::kRetry, "delivery threw: " + std::string(*thrown), {}};
    }
    finished_ = true;
    finished_changed_.notify_all();
  }

  const WebhookSink& sink_;
  const std::vector<const EventRecord*>& events_;
  const std::vector<std::string>& bodies_;
  const Sink::MayStart& may_start_;
  Mutex mu_;
  std::vector<DeliveryOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  size_t started_ ABSL_GUARDED_BY(mu_) = 0;
  bool out_ ABSL_GUARDED_BY(mu_) = false;  // the last one started waits for its answer
  bool handing_over_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_meanwhile_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::condition_variable finished_changed_;
};

std::vector<DeliveryOutcome> WebhookSink::DeliverBatch(
    const std::vector<const EventRecord*>& events, const std::vector<std::string>& bodies,
    const MayStart& may_start) {
  return std::make_shared<Chain>(*this, events, bodies, may_start)->Run();
}

}  // namespace

std::unique_ptr<Sink> NewWebhookSink(const SinkConfig& config, HttpClient* http,
                                     const Clock* clock) {
  return std::make_unique<WebhookSink>(config, http, clock);
}

}  // namespace waystone
