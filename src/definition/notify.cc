#include "definition/notify.h"

#include <nlohmann/json.hpp>

#include "model/json_text.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// The request that sends `message` over `channel`, identified by `identity`.
RequestSpec ChannelRequest(const NotifySpec& spec, const NotifyChannel& channel,
                           const MessageTemplate& message, const std::string& identity) {
  RequestSpec request;
  request.method = "POST";
  switch (channel.kind) {
    case NotifyChannel::Kind::kLine:
      // LINE Messaging API, push message: the retry key makes a resend within 24 h
      // a 409 instead of a second message.
      request.url = channel.url + "/v2/bot/message/push";
      request.headers = {{"Authorization", "Bearer " + channel.token},
                         {"X-Line-Retry-Key", "{{step.key_uuid}}"}};
      request.body_json =
          JsonText(Json{{"to", channel.to},
                        {"messages", Json::array({{{"type", "text"}, {"text", message.text}}})}});
      break;
    case NotifyChannel::Kind::kWebhook:
      // The receiver deduplicates on Webhook-Id (the identity's UUID); the body says
      // what the delivery is.
      request.url = channel.url;
      request.headers = {{"Webhook-Id", "{{step.key_uuid}}"}};
      request.body_json = JsonText(Json{{"id", "{{step.key_uuid}}"},
                                        {"delivery", identity},
                                        {"recipient", spec.recipient},
                                        {"template", message.name},
                                        {"version", message.version},
                                        {"event", spec.event},
                                        {"text", message.text}});
      break;
    case NotifyChannel::Kind::kEmail:
      request.method = "MAIL";
      request.url = channel.url;
      // A server may take minutes to answer the end of DATA (RFC 5321 §4.5.3.2.6 allows
      // ten): waiting longer leaves fewer delivered emails `unknown`.
      request.timeout = channel.timeout > 0 ? channel.timeout : kEmailTimeout;
      request.body_kind = BodyKind::kMail;
      request.body_json.clear();
      request.mail = MailSpec{.from = channel.from,
                              .to = channel.to,
                              .subject = message.subject,
                              .text = message.text,
                              .message_id = "{{step.key_uuid}}",
                              .delivery = identity,
                              .user = channel.user,
                              .password = channel.password};
      break;
  }
  return request;
}

}  // namespace

std::string ChannelName(NotifyChannel::Kind kind) {
  switch (kind) {
    case NotifyChannel::Kind::kLine:
      return "line";
    case NotifyChannel::Kind::kWebhook:
      return "webhook";
    case NotifyChannel::Kind::kEmail:
      return "email";
  }
  return "line";
}

std::string DeliveryIdentity(const NotifySpec& spec, const MessageTemplate& message,
                             NotifyChannel::Kind channel) {
  return "notify:" + spec.recipient + ":" + message.name + "@" + std::to_string(message.version) +
         ":" + spec.event + ":" + ChannelName(channel);
}

std::vector<StepDefinition> ExpandNotify(const NotifySpec& spec, const MessageTemplate& message,
                                         const MessageTemplate* correction) {
  std::vector<StepDefinition> steps;
  for (const NotifyChannel& channel : spec.channels) {
    StepDefinition step;
    step.name = spec.name + "-" + ChannelName(channel.kind);
    step.line = spec.line;
    step.kind = StepKind::kHttp;
    step.notify = spec.name;
    step.reports = spec.reports;
    step.when = spec.when;
    step.optional = !spec.critical;
    step.retry = spec.retry;
    step.idempotency_key = DeliveryIdentity(spec, message, channel.kind);
    // LINE and webhook receivers deduplicate on the key; an SMTP server does not.
    const bool email = channel.kind == NotifyChannel::Kind::kEmail;
    step.idempotency_honored = !email;
    step.request = ChannelRequest(spec, channel, message, step.idempotency_key);
    step.store_response = ResponseKeep::kNone;
    if (channel.kind == NotifyChannel::Kind::kLine) {
      step.key_window = kLineRetryKeyWindow;
      step.accepted_statuses = {409};  // the retry key was accepted before
      step.external_id_headers = {"x-line-accepted-request-id", "x-line-request-id"};
    }
    step.recovery = email ? RecoveryClass::kManual : RecoveryClass::kRepeatable;
    if (correction != nullptr) {
      // Sent only where the original was accepted (the channel's step completed),
      // under an identity of its own. Over email at most once: an unknown outcome
      // waits for an operator, as the original's does.
      CompensationSpec compensate;
      compensate.idempotency_key = DeliveryIdentity(spec, *correction, channel.kind);
      compensate.request = ChannelRequest(spec, channel, *correction, compensate.idempotency_key);
      compensate.retry = spec.retry;
      compensate.at_most_once = email;
      step.compensate = std::move(compensate);
      if (!email) step.recovery = RecoveryClass::kCompensable;
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

}  // namespace waystone
