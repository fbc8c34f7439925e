#include <nats/nats.h>

#include "messaging/sink.h"

namespace waystone {
namespace {

class NatsSink final : public Sink {
 public:
  explicit NatsSink(const SinkConfig& config) : config_(config) {}
  ~NatsSink() override { Disconnect(); }

  const std::string& name() const override { return config_.name; }

  DeliveryOutcome Deliver(const EventRecord& event, const std::string& body) override {
    if (auto error = Connect(); !error.empty()) {
      return {DeliveryOutcome::Result::kRetry, error, {}};
    }
    jsPubOptions options;
    jsPubOptions_Init(&options);
    options.MsgId = event.event_id.c_str();
    options.MaxWait = 5000;
    jsPubAck* ack = nullptr;
    jsErrCode js_error = static_cast<jsErrCode>(0);
    const natsStatus status = js_Publish(&ack, js_, event.type.c_str(), body.data(),
                                         static_cast<int>(body.size()), &options, &js_error);
    if (status != NATS_OK) {
      std::string detail = std::string("publish: ") + natsStatus_GetText(status);
      if (status == NATS_CONNECTION_CLOSED || status == NATS_NO_SERVER) Disconnect();
      return {DeliveryOutcome::Result::kRetry, detail, {}};
    }
    // A duplicate ack means JetStream already holds this id: delivered all the same.
    jsPubAck_Destroy(ack);
    return {DeliveryOutcome::Result::kDelivered, "", {}};
  }

 private:
  // Returns "" when connected, else why not.
  std::string Connect() {
    if (connection_ != nullptr && !natsConnection_IsClosed(connection_)) {
      if (stream_ready_) return "";
    } else {
      Disconnect();
      natsOptions* options = nullptr;
      natsOptions_Create(&options);
      natsOptions_SetURL(options, config_.nats_url.c_str());
      natsOptions_SetTimeout(options, 2000);
      natsOptions_SetMaxReconnect(options, -1);
      natsOptions_SetReconnectWait(options, 200);
      natsOptions_SetRetryOnFailedConnect(options, false, nullptr, nullptr);
      const natsStatus status = natsConnection_Connect(&connection_, options);
      natsOptions_Destroy(options);
      if (status != NATS_OK) {
        connection_ = nullptr;
        return std::string("connect ") + config_.nats_url + ": " + natsStatus_GetText(status);
      }
      if (natsConnection_JetStream(&js_, connection_, nullptr) != NATS_OK) {
        Disconnect();
        return "JetStream is not available on " + config_.nats_url;
      }
    }
    jsStreamInfo* info = nullptr;
    jsErrCode js_error = static_cast<jsErrCode>(0);
    natsStatus status = js_GetStreamInfo(&info, js_, config_.stream.c_str(), nullptr, &js_error);
    if (status == NATS_NOT_FOUND) {
      jsStreamConfig stream;
      jsStreamConfig_Init(&stream);
      stream.Name = config_.stream.c_str();
      const char* subjects[] = {"waystone.>"};
      stream.Subjects = subjects;
      stream.SubjectsLen = 1;
      stream.Storage = js_FileStorage;
      status = js_AddStream(&info, js_, &stream, nullptr, &js_error);
    }
    if (info != nullptr) jsStreamInfo_Destroy(info);
    if (status != NATS_OK) {
      return "stream " + config_.stream + ": " + natsStatus_GetText(status);
    }
    stream_ready_ = true;
    return "";
  }

  void Disconnect() {
    if (js_ != nullptr) jsCtx_Destroy(js_);
    js_ = nullptr;
    if (connection_ != nullptr) natsConnection_Destroy(connection_);
    connection_ = nullptr;
    stream_ready_ = false;
  }

  SinkConfig config_;
  natsConnection* connection_ = nullptr;
  jsCtx* js_ = nullptr;
  bool stream_ready_ = false;
};

}  // namespace

std::unique_ptr<Sink> NewNatsSink(const SinkConfig& config) {
  return std::make_unique<NatsSink>(config);
}

}  // namespace waystone
