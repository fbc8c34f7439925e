#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace waystone {

enum class Role : uint8_t { kViewer = 1, kOperator = 2, kAdmin = 3 };

// Who is calling: from a token. A value type.
struct Principal {
  std::string token_name;
  std::string tenant;  // "*" = every tenant
  Role role = Role::kViewer;

  // Returns true when this principal may see `tenant`'s data.
  bool Sees(const std::string& tenant_name) const { return tenant == "*" || tenant == tenant_name; }
};

std::optional<Role> ParseRole(std::string_view text);

// Creates a token named `name` (unique) for `tenant` and `role`, valid until
// `expires_at` (0 = until revoked); stores only its SHA-256 and returns the token
// itself, which is shown once ("wst_" + 64 hex characters). Only an admin token
// may be for every tenant ("*"): viewers and operators belong to one tenant.
absl::StatusOr<std::string> CreateToken(AccessStore& store, const std::string& name,
                                        const std::string& tenant, Role role, Millis now,
                                        Millis expires_at = 0);

// Returns the principal of an "Authorization: Bearer <token>" header value at
// `now`; Unauthenticated for a missing, unknown, revoked or expired token.
absl::StatusOr<Principal> Authenticate(AccessStore& store, const std::string& authorization,
                                       Millis now);

}  // namespace waystone
