#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "connectors/http/http_client.h"
#include "messaging/relay_config.h"
#include "store/store.h"

namespace waystone {

// What one delivery attempt achieved.
struct DeliveryOutcome {
  enum class Result : uint8_t {
    kDelivered = 1,     // the sink acknowledged the event
    kRetry = 2,         // not acknowledged; try again later
    kEndpointGone = 3,  // the endpoint says it will never accept (HTTP 410)
  };
  Result result = Result::kRetry;
  std::string detail;
  std::optional<Millis> retry_after;
};

// A destination for outbox events. The relay calls Deliver from several threads at
// once (for different instances or sinks); implementations are thread-safe.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual const std::string& name() const = 0;
  // The longest one Deliver may take (its timeouts); the relay attempts a delivery
  // only while this fits in the delivery's lease. 0: no bound known.
  virtual Millis longest_attempt() const { return 0; }
  // Delivers one CloudEvent (`cloudevent_json`, structured mode) of `event`.
  virtual DeliveryOutcome Deliver(const EventRecord& event, const std::string& cloudevent_json) = 0;
  // Whether DeliverBatch does better than Deliver one event at a time: the relay then
  // hands it a round's events (each the next of its instance) in batches.
  virtual bool delivers_batches() const { return false; }
  // Whether one more attempt may begin now: the relay's lease on the batch still has
  // room for the sink's longest attempt.
  using MayStart = std::function<bool()>;
  // Delivers `events` (their CloudEvents in `bodies`) each as Deliver would, but
  // together; returns one outcome per event attempted, in order. An event past the last
  // outcome was not attempted (a sink starts none once `may_start` says no) and waits
  // for its lease to end. A sink that delivers_batches() keeps every attempt within
  // longest_attempt() of its start.
  virtual std::vector<DeliveryOutcome> DeliverBatch(const std::vector<const EventRecord*>& events,
                                                    const std::vector<std::string>& bodies,
                                                    const MayStart& may_start) {
    std::vector<DeliveryOutcome> outcomes;
    for (size_t i = 0; i < events.size() && may_start(); ++i) {
      outcomes.push_back(Deliver(*events[i], bodies[i]));
    }
    return outcomes;
  }
};

// Returns a webhook sink: POST in CloudEvents structured mode, signed per the
// Standard Webhooks spec (webhook-id, webhook-timestamp, webhook-signature).
std::unique_ptr<Sink> NewWebhookSink(const SinkConfig& config, HttpClient* http,
                                     const Clock* clock);

// Returns a NATS JetStream sink: publishes on the event's type as subject with
// Nats-Msg-Id = event id and waits for the stream's acknowledgement; a batch is
// published without waiting in between, and its acknowledgements gathered. Connects
// lazily and reconnects; creates the stream (subjects "waystone.>") if missing.
std::unique_ptr<Sink> NewNatsSink(const SinkConfig& config);

}  // namespace waystone
