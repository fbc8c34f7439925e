#include "base/public_id.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/hex.h"

namespace waystone {

uint32_t PublicIds::Round(int round, uint32_t half) const {
  unsigned char message[5] = {
      static_cast<unsigned char>(round), static_cast<unsigned char>(half >> 24),
      static_cast<unsigned char>(half >> 16), static_cast<unsigned char>(half >> 8),
      static_cast<unsigned char>(half)};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), message, sizeof(message), digest,
       &length);
  return (static_cast<uint32_t>(digest[0]) << 24) | (static_cast<uint32_t>(digest[1]) << 16) |
         (static_cast<uint32_t>(digest[2]) << 8) | digest[3];
}

std::string PublicIds::Encode(int64_t id) const {
  const uint64_t value = static_cast<uint64_t>(id);
  uint32_t left = static_cast<uint32_t>(value >> 32);
  uint32_t right = static_cast<uint32_t>(value);
  for (int round = 0; round < 4; ++round) {
    const uint32_t next = left ^ Round(round, right);
    left = right;
    right = next;
  }
  const uint64_t out = (static_cast<uint64_t>(left) << 32) | right;
  std::string bytes(8, '\0');  // big-endian: the hex reads as the number
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>(out >> (56 - 8 * i));
  return HexOf(bytes);
}

std::optional<int64_t> PublicIds::Decode(std::string_view text) const {
  if (text.size() != 16) return std::nullopt;
  const std::optional<std::string> bytes = FromHex(text);  // lower case only, as Encode writes
  if (!bytes) return std::nullopt;
  uint64_t value = 0;
  for (char byte : *bytes) value = (value << 8) | static_cast<unsigned char>(byte);
  uint32_t left = static_cast<uint32_t>(value >> 32);
  uint32_t right = static_cast<uint32_t>(value);
  for (int round = 3; round >= 0; --round) {
    const uint32_t previous = right ^ Round(round, left);
    right = left;
    left = previous;
  }
  const int64_t id = static_cast<int64_t>((static_cast<uint64_t>(left) << 32) | right);
  // Ids are positive and far below 2^53: anything else was not made by Encode.
  if (id <= 0 || id > (int64_t{1} << 53)) return std::nullopt;
  return id;
}

}  // namespace waystone
