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
    const long long timestamp = clock_->NowMillis() / 1000;
    auto signature = SignStandardWebhook(config_.secret, event.event_id, timestamp, body);
    if (!signature.ok()) {
      return {DeliveryOutcome::Result::kRetry, std::string(signature.status().message()), {}};
    }
    HttpRequest request;
    request.method = "POST";
    request.url = config_.url;
    request.body = body;
    request.timeout = config_.timeout;
    request.reuse = config_.keep_alive ? ConnectionReuse::kReuse : ConnectionReuse::kFresh;
    request.headers = {{"Content-Type", "application/cloudevents+json"},
                       {"webhook-id", event.event_id},
                       {"webhook-timestamp", std::to_string(timestamp)},
                       {"webhook-signature", *signature}};
    const HttpResponse response = http_->Send(request);
    if (response.outcome.kind != CallOutcome::Kind::kResponse) {
      return {DeliveryOutcome::Result::kRetry, response.error, {}};
    }
    const int status = response.outcome.status;
    if (status >= 200 && status < 300) return {DeliveryOutcome::Result::kDelivered, "", {}};
    const std::string detail = "HTTP " + std::to_string(status);
    if (status == 410) return {DeliveryOutcome::Result::kEndpointGone, detail, {}};
    return {DeliveryOutcome::Result::kRetry, detail, response.outcome.retry_after};
  }

 private:
  SinkConfig config_;
  HttpClient* http_;
  const Clock* clock_;
};

}  // namespace

std::unique_ptr<Sink> NewWebhookSink(const SinkConfig& config, HttpClient* http,
                                     const Clock* clock) {
  return std::make_unique<WebhookSink>(config, http, clock);
}

}  // namespace waystone
