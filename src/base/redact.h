#pragma once

#include <string>
#include <string_view>

namespace waystone {

// Secret values this process renders into requests. A downstream may echo them
// back (an error that quotes the request); every text we keep or show about a call
// goes through RedactSecrets first: error messages, status reasons, alerts, audit,
// outbox events, stored answers, previews, logs.

inline constexpr std::string_view kRedacted = "***";

// Adds `value` (and its JSON-escaped form) to the values replaced; register the
// other forms a value travels in (percent-encoded in a URL) as values of their own. Values shorter than kMinRedactedSecret characters are not added (they
// would blank out ordinary words); TemplateEnvironment refuses such secrets.
// Thread-safe.
inline constexpr size_t kMinRedactedSecret = 4;
void RegisterSecretValue(const std::string& value);

// `text` with every registered secret value replaced by "***". Thread-safe.
std::string RedactSecrets(std::string_view text);

}  // namespace waystone
