#pragma once

#include <string>
#include <string_view>

namespace waystone {

// Secret values this process renders into requests. A downstream may echo them
// back (an error that quotes the request); every text we keep or show about a call
// goes through RedactSecrets first: error messages, status reasons, alerts, audit,
// outbox events, stored answers, previews, logs.

inline constexpr std::string_view kRedacted = "***";

// Adds `value` (and the forms JSON encoders escape it to: \" \\ \/ \u00XX) to the values replaced;
// register the other forms a value travels in (percent-encoded in a URL) as values of their own.
// Values shorter than kMinRedactedSecret characters are not added (they would blank out ordinary
// words); TemplateEnvironment refuses such secrets. Thread-safe.
inline constexpr size_t kMinRedactedSecret = 8;
void RegisterSecretValue(const std::string& value);

// Adds a credential this process obtained at run time and sends (an OAuth2 access
// token), with the same forms: a downstream that echoes it does not get it stored or
// shown. Only the kRecentCredentials newest such are kept (an expired token matters
// less than a redaction that slows down as tokens are renewed for months).
// Thread-safe.
void RegisterSentCredential(const std::string& value);

// True once any secret is registered (nothing to do before). Thread-safe.
bool HaveSecrets();

// `text` with every registered secret value replaced by "***". Thread-safe. For
// JSON, RedactJsonText (model/json_text.h) replaces inside strings only, so the
// text stays JSON whatever the secret looks like.
std::string RedactSecrets(std::string_view text);

}  // namespace waystone
