#include <nats/nats.h>

#include <memory>

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

 private:
  static constexpr Millis kConnectTimeout = 2000;
  static constexpr Millis kAckWait = 5000;  // JetStream's publish acknowledgement

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
      if (natsConnection_JetStream(&fresh->js, fresh->connection, nullptr) != NATS_OK) {
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
  Mutex mu_;
  std::shared_ptr<NatsConnection> connection_ ABSL_GUARDED_BY(mu_);
  bool stream_ready_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<Sink> NewNatsSink(const SinkConfig& config) {
  return std::make_unique<NatsSink>(config);
}

}  // namespace waystone
