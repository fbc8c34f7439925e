#include "server/auth.h"

#include "base/secure_token.h"
#include "base/sha256.h"
#include "base/utf8.h"
#include "model/keys.h"

namespace waystone {

std::optional<Role> ParseRole(std::string_view text) {
  if (text == "viewer") return Role::kViewer;
  if (text == "operator") return Role::kOperator;
  if (text == "admin") return Role::kAdmin;
  return std::nullopt;
}

absl::StatusOr<std::string> CreateToken(AccessStore& store, const std::string& name,
                                        const std::string& tenant, Role role, Millis now,
                                        Millis expires_at) {
  if (tenant != "*" && !ValidTenantName(tenant)) {
    return absl::InvalidArgumentError(
        "a token needs a tenant (1 to 64 letters, digits, '.', '_' "
        "or '-') or '*'");
  }
  if (tenant == "*" && role != Role::kAdmin) {
    return absl::InvalidArgumentError(
        "only an admin token may be for every tenant ('*'); give a "
        "viewer or operator token one tenant");
  }
  if (name.empty() || name.size() > 128 || FirstInvalidUtf8(name) != std::string::npos ||
      HasInvisibleCharacter(name)) {
    return absl::InvalidArgumentError(
        "a token needs a name of 1 to 128 characters, with no control, bidirectional or "
        "zero-width character");
  }
  if (HasLookAlikeMix(name)) {
    // A name is who the audit log says acted: "аdmin" with a Cyrillic а reads as admin.
    return absl::InvalidArgumentError(
        "a token name may not mix Latin letters with Greek or Cyrillic ones, nor hold "
        "fullwidth forms: it could pass for another name in the audit log");
  }
  if (expires_at != 0 && expires_at <= now) {
    return absl::InvalidArgumentError("the token would expire before it is made");
  }
  const std::string secret = SecureRandomHex(32);
  if (secret.empty()) return absl::InternalError("no randomness for a token");
  const std::string token = "wst_" + secret;
  const char* role_name = role == Role::kAdmin      ? "admin"
                          : role == Role::kOperator ? "operator"
                                                    : "viewer";
  auto status = store.PutToken({Sha256Hex(token), name, tenant, role_name, now, 0, expires_at});
  if (!status.ok()) return status;
  return token;
}

absl::StatusOr<Principal> Authenticate(AccessStore& store, const std::string& authorization,
                                       Millis now) {
  constexpr std::string_view kBearer = "Bearer ";
  if (!authorization.starts_with(kBearer) || authorization.size() == kBearer.size()) {
    return absl::UnauthenticatedError("send 'Authorization: Bearer <token>'");
  }
  auto token = store.FindToken(Sha256Hex(authorization.substr(kBearer.size())));
  if (absl::IsNotFound(token.status())) return absl::UnauthenticatedError("unknown token");
  if (!token.ok()) return token.status();
  if (token->revoked_at != 0) return absl::UnauthenticatedError("revoked token");
  if (token->expires_at != 0 && token->expires_at <= now) {
    return absl::UnauthenticatedError("expired token");
  }
  auto role = ParseRole(token->role);
  if (!role) return absl::UnauthenticatedError("token has an unknown role");
  if (token->tenant == "*" && *role != Role::kAdmin) {
    // Made before only admins could span tenants: no longer honoured.
    return absl::UnauthenticatedError("a " + token->role +
                                      " token for every tenant is no longer "
                                      "accepted; create one per tenant");
  }
  return Principal{token->name, token->tenant, *role};
}

}  // namespace waystone
