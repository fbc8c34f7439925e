#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace waystone {

// Turns database ids into the ids the API shows, and back. A database id is a
// sequence shared by every tenant: shown as is, it would tell one tenant how much
// the others do. A public id is the id through a keyed permutation (a four-round
// Feistel network over 64 bits, HMAC-SHA256 as round function): 16 hex
// characters, unique, reversible only with the key, which lives in the database
// (server_keys). A value type; thread-safe.
class PublicIds {
 public:
  explicit PublicIds(std::string key) : key_(std::move(key)) {}

  std::string Encode(int64_t id) const;
  // The database id of a public id; nullopt for text this key did not make.
  std::optional<int64_t> Decode(std::string_view text) const;

 private:
  uint32_t Round(int round, uint32_t half) const;

  std::string key_;
};

}  // namespace waystone
