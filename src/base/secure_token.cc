#include "base/secure_token.h"

#include <openssl/rand.h>

#include <vector>

#include "base/hex.h"

namespace waystone {

std::string SecureRandomHex(int bytes) {
  std::vector<unsigned char> buffer(static_cast<size_t>(bytes));
  if (RAND_bytes(buffer.data(), bytes) != 1) return "";
  return HexOf(std::string_view(reinterpret_cast<const char*>(buffer.data()), buffer.size()));
}

}  // namespace waystone
