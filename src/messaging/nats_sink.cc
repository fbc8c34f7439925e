#include <nats/nats.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "base/mutex.h"
#include "messaging/sink.h"

namespace waystone {
namespace {

// A NATS connection with its JetStream context. Shared (std::shared_ptr) by the
// sink and each publish in flight on it, so that a reconnect never frees one that
// another delivery thread still publishes on.
struct NatsConnection {
  ~NatsConnection() {
    if (js != nullptr) jsCtx_Destroy(js);
    if (connection != nullptr) natsConnection_Destroy(connection);
  }
  natsConnection* connection = nullptr;
  jsCtx* js = nullptr;
};

class NatsSink final : public Sink {
 public:
  explicit NatsSink(const SinkConfig& config) : config_(config) {}

  const std::string& name() const override { return config_.name; }
  Millis longest_attempt() const override { return kConnectTimeout + kAckWait; }

  DeliveryOutcome Deliver(const EventRecord& event, const std::string& body) override {
    std::shared_ptr<NatsConnection> connection;
    if (auto error = Connect(connection); !error.empty()) {
      return {DeliveryOutcome::Result::kRetry, error, {}};
    }
    jsPubOptions options;
    jsPubOptions_Init(&options);
    options.MsgId = event.event_id.c_str();
    options.MaxWait = kAckWait;
    jsPubAck* ack = nullptr;
    jsErrCode js_error = static_cast<jsErrCode>(0);
    const natsStatus status = js_Publish(&ack, connection->js, event.type.c_str(), body.data(),
                                         static_cast<int>(body.size()), &options, &js_error);
    if (status != NATS_OK) {
      std::string detail = std::string("publish: ") + natsStatus_GetText(status);
      if (status == NATS_CONNECTION_CLOSED || status == NATS_NO_SERVER) Disconnect(connection);
      return {DeliveryOutcome::Result::kRetry, detail, {}};
    }
    // A duplicate ack means JetStream already holds this id: delivered all the same.
    jsPubAck_Destroy(ack);
    return {DeliveryOutcome::Result::kDelivered, "", {}};
  }

  bool delivers_batches() const override { return true; }

  // Publishes each event without waiting for the one before's acknowledgement; the
  // acknowledgements come back on the connection's thread (OnAck), each found by its
  // message. All within longest_attempt(), as Deliver: one not back by then is a retry.
  // The relay asked may_start before the batch; every event starts at once.
  std::vector<DeliveryOutcome> DeliverBatch(const std::vector<const EventRecord*>& events,
                                            const std::vector<std::string>& bodies,
                                            const MayStart& /*may_start*/) override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(longest_attempt());
    std::vector<DeliveryOutcome> outcomes(events.size());
    std::shared_ptr<NatsConnection> connection;
    if (auto error = Connect(connection); !error.empty()) {
      for (DeliveryOutcome& outcome : outcomes) {
        outcome = {DeliveryOutcome::Result::kRetry, error, {}};
      }
      return outcomes;
    }
    Awaited awaited;
    awaited.outcomes.resize(events.size());
    // However this ends, no acknowledgement finds `awaited` afterwards.
    absl::Cleanup forget = [&] {
      MutexLock lock(acks_mu_);
      std::erase_if(awaiting_, [&](const auto& entry) { return entry.second.awaited == &awaited; });
    };
    std::string failed;  // the connection's error, once publishing on it failed
    for (size_t i = 0; i < events.size(); ++i) {
      const Millis left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
      natsMsg* message = nullptr;
      natsStatus status = NATS_TIMEOUT;
      if (failed.empty() && left > 0) {
        status = natsMsg_Create(&message, events[i]->type.c_str(), nullptr, bodies[i].data(),
                                static_cast<int>(bodies[i].size()));
      }
      if (status == NATS_OK) {
        {
          MutexLock lock(acks_mu_);
          awaiting_[message] = {&awaited, i};
          ++awaited.left;
        }
        jsPubOptions options;
        jsPubOptions_Init(&options);
        options.MsgId = events[i]->event_id.c_str();
        // Then the library answers OnAck with a timeout. The same for every message:
        // nats.c 3.4 handles varying ones slowly (a quarter of the rate on loopback);
        // the wait below keeps the batch within longest_attempt().
        options.MaxWait = kAckWait;
        natsMsg* kept = message;  // the key; the library clears `message` once it owns it
        status = js_PublishMsgAsync(connection->js, &message, &options);
        if (status != NATS_OK) {
          MutexLock lock(acks_mu_);
          if (awaiting_.erase(kept) > 0) --awaited.left;
        }
        natsMsg_Destroy(message);  // no effect once the library took it
      }
      if (status == NATS_OK) continue;
      if (status == NATS_CONNECTION_CLOSED || status == NATS_NO_SERVER) {
        failed = std::string("publish: ") + natsStatus_GetText(status);
        Disconnect(connection);
      }
      const std::string detail = !failed.empty() ? failed
                                 : left <= 0
                                     ? "publish: no time left in the attempt"
                                     : std::string("publish: ") + natsStatus_GetText(status);
      MutexLock lock(acks_mu_);
      awaited.outcomes[i] = DeliveryOutcome{DeliveryOutcome::Result::kRetry, detail, {}};
    }
    MutexLock lock(acks_mu_);
    while (awaited.left > 0 &&
           acks_done_.wait_until(lock.native(), deadline) != std::cv_status::timeout) {
    }
    for (size_t i = 0; i < events.size(); ++i) {
      outcomes[i] = awaited.outcomes[i].value_or(DeliveryOutcome{
          DeliveryOutcome::Result::kRetry, "no acknowledgement from JetStream in time", {}});
    }
    return outcomes;
  }

  ~NatsSink() override {
    // Acknowledgements still out (of batches that stopped waiting) come to OnAck,
    // which uses this sink: they are let come, or time out, before it goes.
    std::shared_ptr<NatsConnection> connection;
    {
      MutexLock lock(mu_);
      connection = connection_;
    }
    if (connection != nullptr && connection->js != nullptr) {
      jsPubOptions options;
      jsPubOptions_Init(&options);
      options.MaxWait = kAckWait + 1000;
      js_PublishAsyncComplete(connection->js, &options);
    }
  }

 private:
  static constexpr Millis kConnectTimeout = 2000;
  static constexpr Millis kAckWait = 5000;  // JetStream's publish acknowledgement

  // A batch's publishes whose acknowledgement is still out.
  struct Awaited {
    size_t left = 0;
    std::vector<std::optional<DeliveryOutcome>> outcomes;
  };
  struct Slot {
    Awaited* awaited;
    size_t index;
  };

  // The library's answer to an asynchronous publish: acknowledged (a duplicate too:
  // JetStream holds the id), refused, or not in time. Runs on the connection's thread.
  static void OnAck(jsCtx*, natsMsg* message, jsPubAck* ack, jsPubAckErr* error, void* closure) {
    try {
      DeliveryOutcome outcome{DeliveryOutcome::Result::kDelivered, "", {}};
      if (ack == nullptr) {
        const char* text = error != nullptr && error->ErrText != nullptr
                               ? error->ErrText
                               : natsStatus_GetText(error != nullptr ? error->Err : NATS_ERR);
        outcome = {DeliveryOutcome::Result::kRetry, std::string("publish: ") + text, {}};
      }
      static_cast<NatsSink*>(closure)->Settle(message, std::move(outcome));
    } catch (...) {
      // Nothing may unwind into the library's C frames: the batch times it out.
    }
    natsMsg_Destroy(message);
  }

  void Settle(natsMsg* message, DeliveryOutcome outcome) {
    MutexLock lock(acks_mu_);
    auto it = awaiting_.find(message);
    if (it == awaiting_.end()) return;  // its batch stopped waiting
    const Slot slot = it->second;
    awaiting_.erase(it);
    slot.awaited->outcomes[slot.index] = std::move(outcome);
    if (--slot.awaited->left == 0) acks_done_.notify_all();
  }

  // Sets `out` to a connection whose stream exists; returns "" then, else why not.
  // One thread at a time connects; the others wait for it.
  std::string Connect(std::shared_ptr<NatsConnection>& out) {
    MutexLock lock(mu_);
    if (connection_ != nullptr && natsConnection_IsClosed(connection_->connection)) {
      connection_.reset();
      stream_ready_ = false;
    }
    if (connection_ == nullptr) {
      auto fresh = std::make_shared<NatsConnection>();
      natsOptions* options = nullptr;
      natsOptions_Create(&options);
      natsOptions_SetURL(options, config_.nats_url.c_str());
      natsOptions_SetTimeout(options, kConnectTimeout);
      natsOptions_SetMaxReconnect(options, -1);
      natsOptions_SetReconnectWait(options, 200);
      natsOptions_SetRetryOnFailedConnect(options, false, nullptr, nullptr);
      const natsStatus status = natsConnection_Connect(&fresh->connection, options);
      natsOptions_Destroy(options);
      if (status != NATS_OK) {
        fresh->connection = nullptr;
        return std::string("connect ") + config_.nats_url + ": " + natsStatus_GetText(status);
      }
      jsOptions js_options;
      jsOptions_Init(&js_options);
      js_options.PublishAsync.AckHandler = &NatsSink::OnAck;
      js_options.PublishAsync.AckHandlerClosure = this;
      if (natsConnection_JetStream(&fresh->js, fresh->connection, &js_options) != NATS_OK) {
        return "JetStream is not available on " + config_.nats_url;
      }
      connection_ = std::move(fresh);
    }
    if (!stream_ready_) {
      if (auto error = EnsureStream(connection_->js); !error.empty()) return error;
      stream_ready_ = true;
    }
    out = connection_;
    return "";
  }

  // Creates the stream when missing; returns "" when it exists.
  std::string EnsureStream(jsCtx* js) {
    jsStreamInfo* info = nullptr;
    jsErrCode js_error = static_cast<jsErrCode>(0);
    natsStatus status = js_GetStreamInfo(&info, js, config_.stream.c_str(), nullptr, &js_error);
    if (status == NATS_NOT_FOUND) {
      jsStreamConfig stream;
      jsStreamConfig_Init(&stream);
      stream.Name = config_.stream.c_str();
      const char* subjects[] = {"waystone.>"};
      stream.Subjects = subjects;
      stream.SubjectsLen = 1;
      stream.Storage = js_FileStorage;
      status = js_AddStream(&info, js, &stream, nullptr, &js_error);
    }
    if (info != nullptr) jsStreamInfo_Destroy(info);
    if (status != NATS_OK) return "stream " + config_.stream + ": " + natsStatus_GetText(status);
    return "";
  }

  // Drops `failed` so that the next delivery connects afresh; it is freed once no
  // publish uses it any more.
  void Disconnect(const std::shared_ptr<NatsConnection>& failed) {
    MutexLock lock(mu_);
    if (connection_ == failed) {
      connection_.reset();
      stream_ready_ = false;
    }
  }

  const SinkConfig config_;
  // Declared before the connection, so they outlive it (OnAck uses them).
  Mutex acks_mu_;
  std::condition_variable acks_done_;  // a batch's last acknowledgement came
  // Publishes of batches under way, by their message (unique while it is out).
  std::unordered_map<natsMsg*, Slot> awaiting_ ABSL_GUARDED_BY(acks_mu_);
  Mutex mu_;
  std::shared_ptr<NatsConnection> connection_ ABSL_GUARDED_BY(mu_);
  bool stream_ready_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<Sink> NewNatsSink(const SinkConfig& config) {
  return std::make_unique<NatsSink>(config);
}

}  // namespace waystone
