#include "server/auth.h"

#include "base/secure_token.h"
#include "base/sha256.h"
#include "model/keys.h"

namespace waystone {

std::optional<Role> ParseRole(std::string_view text) {
  if (text == "viewer") return Role::kViewer;
  if (text == "operator") return Role::kOperator;
  if (text == "admin") return Role::kAdmin;
  return std::nullopt;
}

absl::StatusOr<std::string> CreateToken(Store& store, const std::string& name,
                                        const std::string& tenant, Role role, Millis now) {
  if (tenant != "*" && !ValidTenantName(tenant)) {
    return absl::InvalidArgumentError("a token needs a tenant (1 to 64 letters, digits, '.', '_' "
                                      "or '-') or '*'");
  }
  const std::string secret = SecureRandomHex(32);
  if (secret.empty()) return absl::InternalError("no randomness for a token");
  const std::string token = "wst_" + secret;
  const char* role_name = role == Role::kAdmin ? "admin" : role == Role::kOperator ? "operator"
                                                                                  : "viewer";
  auto status = store.PutToken({Sha256Hex(token), name, tenant, role_name, now, 0});
  if (!status.ok()) return status;
  return token;
}

absl::StatusOr<Principal> Authenticate(Store& store, const std::string& authorization) {
  constexpr std::string_view kBearer = "Bearer ";
  if (!authorization.starts_with(kBearer) || authorization.size() == kBearer.size()) {
    return absl::UnauthenticatedError("send 'Authorization: Bearer <token>'");
  }
  auto token = store.FindToken(Sha256Hex(authorization.substr(kBearer.size())));
  if (absl::IsNotFound(token.status())) return absl::UnauthenticatedError("unknown token");
  if (!token.ok()) return token.status();
  if (token->revoked_at != 0) return absl::UnauthenticatedError("revoked token");
  auto role = ParseRole(token->role);
  if (!role) return absl::UnauthenticatedError("token has an unknown role");
  return Principal{token->name, token->tenant, *role};
}

}  // namespace waystone
