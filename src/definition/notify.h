#pragma once

// A `notify` step, read: one message from a versioned template to one recipient over
// one or more channels. It runs as one HTTP step per channel ("<name>-<channel>"),
// each with its own attempts, backoff and end, keyed by the delivery's identity.
// Pure: no I/O, no YAML (the loader reads the text into a NotifySpec).

#include <string>
#include <vector>

#include "model/definition.h"

namespace waystone {

// One channel of a notify step. Every string is a template.
struct NotifyChannel {
  enum class Kind : uint8_t { kLine = 1, kWebhook = 2, kEmail = 3 };
  Kind kind = Kind::kLine;
  std::string url;       // LINE: the API's base URL; webhook: the receiver's URL;
                         // email: the SMTP server (smtp://host:port or smtps://host:port)
  std::string token;     // LINE: the channel access token ({{secret.NAME}} or {{env.NAME}})
  std::string to;        // LINE: the user, group or room id; email: the address
  std::string from;      // email: the sender's address
  std::string user;      // email: SMTP AUTH user ("" = no AUTH)
  std::string password;  // email: SMTP AUTH password ({{secret.NAME}} or {{env.NAME}})
  Millis timeout = 0;    // email: how long to wait for the server (0 = kEmailTimeout)
};

struct NotifySpec {
  std::string name;
  int line = 0;
  std::string reports;    // the step whose committed outcome it announces
  std::string recipient;  // template: who the delivery is for (part of its identity)
  std::string event;      // template: the business event; "" = "{{instance.ref}}/<reports>"
  bool critical = false;  // false (default): a failed channel alerts, the workflow goes on
  std::vector<NotifyChannel> channels;
  RetryPolicy retry;
  Condition when;
};

// The name a channel's step and its identity carry: "line", "webhook", "email".
std::string ChannelName(NotifyChannel::Kind kind);

// How long an email's SMTP exchange may take, its final reply included.
inline constexpr Millis kEmailTimeout = 120'000;

// How long LINE keeps an X-Line-Retry-Key: a resend after this may deliver twice.
inline constexpr Millis kLineRetryKeyWindow = 24LL * 3600 * 1000;

// Returns the template of a delivery's identity, its idempotency key:
// "notify:<recipient>:<template>@<version>:<event>:<channel>" (the tenant is the
// key's own scope). Providers get keys derived from it (DESIGN: {{step.key_uuid}}).
std::string DeliveryIdentity(const NotifySpec& spec, const MessageTemplate& message,
                             NotifyChannel::Kind channel);

// Returns the steps `spec` runs as, one per channel in its order: `message` is sent;
// `correction` (null: none) is each channel's compensation, sent with its own
// identity and only where the original was accepted (a compensation runs only for a
// completed step). Over email a correction is sent at most once
// (CompensationSpec::at_most_once).
//
// LINE and webhook receivers deduplicate on the key derived from the identity, so an
// unknown outcome is resent under it. SMTP has no such key: an email whose server's
// answer was lost after the whole message (DATA) is `unknown` and waits for an
// operator (recovery manual); its Message-ID, derived from the identity, lets a
// mailbox that deduplicates on it drop a copy an operator chose to resend.
std::vector<StepDefinition> ExpandNotify(const NotifySpec& spec, const MessageTemplate& message,
                                         const MessageTemplate* correction);

}  // namespace waystone
