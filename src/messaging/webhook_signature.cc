#include "messaging/webhook_signature.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <vector>

namespace waystone {

absl::StatusOr<std::string> SignStandardWebhook(std::string_view secret, std::string_view id,
                                                long long timestamp, std::string_view body) {
  constexpr std::string_view kPrefix = "whsec_";
  if (secret.starts_with(kPrefix)) secret.remove_prefix(kPrefix.size());
  if (secret.empty() || secret.size() % 4 != 0) {
    return absl::InvalidArgumentError("webhook secret must be 'whsec_' followed by base64");
  }
  std::vector<unsigned char> key(secret.size());
  const int decoded =
      EVP_DecodeBlock(key.data(), reinterpret_cast<const unsigned char*>(secret.data()),
                      static_cast<int>(secret.size()));
  if (decoded < 0) return absl::InvalidArgumentError("webhook secret is not valid base64");
  size_t key_size = static_cast<size_t>(decoded);
  // EVP_DecodeBlock counts padding bytes as data; drop them.
  for (size_t i = secret.size(); i > 0 && secret[i - 1] == '='; --i) --key_size;
  std::string message;
  message.reserve(id.size() + body.size() + 24);
  message.append(id).append(".").append(std::to_string(timestamp)).append(".").append(body);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key_size),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_size);
  std::string encoded(4 * ((mac_size + 2) / 3), '\0');
  EVP_EncodeBlock(reinterpret_cast<unsigned char*>(encoded.data()), mac,
                  static_cast<int>(mac_size));
  return "v1," + encoded;
}

}  // namespace waystone
