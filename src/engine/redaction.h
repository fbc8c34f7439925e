#pragma once

#include "store/store.h"

namespace waystone {

// Replaces every secret value the process renders (base/redact.h) in the texts a
// change stores: status reason, step error messages and answers, alert messages,
// audit reasons and details, outbox event payloads, attempt details. Called on
// every change before it is committed, so nothing stored, served or relayed
// carries a secret a downstream echoed.
void RedactChange(Change& change);

// `text` as RedactChange stores it (a status reason, a message).
std::string Redacted(const std::string& text);

}  // namespace waystone
