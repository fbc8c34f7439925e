#pragma once

#include <string>
#include <string_view>

namespace waystone {

// Returns the reference of an instance outside Waystone, `{{instance.ref}}`:
// "<tenant>:<business key>". Tenants never meet at a shared target under it.
std::string InstanceRef(std::string_view tenant, std::string_view instance_key);

// Returns true for a tenant name: 1 to 64 of letters, digits, '.', '_' and '-'
// (so that "<tenant>:" never runs into the business key).
bool ValidTenantName(std::string_view tenant);

// Returns the default idempotency key of a step: "<tenant>:<instance key>:<step name>".
// The same key is sent on every attempt of that step.
std::string DefaultIdempotencyKey(std::string_view tenant, std::string_view instance_key,
                                  std::string_view step);

// Returns the key of a compensation: "<step key>:compensate".
std::string CompensationKey(std::string_view step_key);

// Returns the UUID a provider that takes UUID keys (LINE's X-Line-Retry-Key) gets for
// an idempotency key, `{{step.key_uuid}}`: the first 16 bytes of
// SHA-256("<tenant>\n<key>") as an RFC 9562 version 8 UUID, lower case. Stable: the
// same key of the same tenant always gives the same UUID, from any worker.
std::string KeyUuid(std::string_view tenant, std::string_view key);

// Returns the hash that pins a request to its idempotency key: SHA-256 over the
// method, URL and body (headers are left out: they carry secrets and trace ids).
std::string RequestHash(std::string_view method, std::string_view url, std::string_view body);

}  // namespace waystone
