#include "base/secure_token.h"

#include <openssl/rand.h>

#include <vector>

namespace waystone {

std::string SecureRandomHex(int bytes) {
  std::vector<unsigned char> buffer(static_cast<size_t>(bytes));
  if (RAND_bytes(buffer.data(), bytes) != 1) return "";
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : buffer) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

}  // namespace waystone
