#include "model/keys.h"

#include "base/sha256.h"

namespace waystone {

std::string DefaultIdempotencyKey(std::string_view instance_key, std::string_view step) {
  std::string key(instance_key);
  key.append(":").append(step);
  return key;
}

std::string CompensationKey(std::string_view step_key) {
  std::string key(step_key);
  key.append(":compensate");
  return key;
}

std::string RequestHash(std::string_view method, std::string_view url, std::string_view body) {
  std::string material;
  material.reserve(method.size() + url.size() + body.size() + 2);
  material.append(method).push_back('\n');
  material.append(url).push_back('\n');
  material.append(body);
  return Sha256Hex(material);
}

}  // namespace waystone
