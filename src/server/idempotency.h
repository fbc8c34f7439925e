#pragma once

// Idempotency-Key on the API's write routes (draft-ietf-httpapi-idempotency-key-header).
// Inside the API server.

#include <functional>
#include <string>

#include "server/api_handlers.h"

namespace waystone {

// 1 to 255 visible ASCII characters.
bool ValidIdempotencyKey(const std::string& key);

// Runs `handle` under the request's Idempotency-Key, if it has one: a repeated key
// replays the stored response, a key in flight is 409, a key reused for another
// request is 422. A key held by a server of this host that died is taken over. An
// answer of 500 or more is not stored: a retry with the key tries again.
void RunIdempotent(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res, const std::function<void()>& handle);

}  // namespace waystone
