#include "model/keys.h"

#include "base/sha256.h"

namespace waystone {

std::string InstanceRef(std::string_view tenant, std::string_view instance_key) {
  std::string ref(tenant);
  ref.append(":").append(instance_key);
  return ref;
}

bool ValidTenantName(std::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (char c : tenant) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string DefaultIdempotencyKey(std::string_view tenant, std::string_view instance_key,
                                  std::string_view step) {
  std::string key = InstanceRef(tenant, instance_key);
  key.append(":").append(step);
  return key;
}

std::string CompensationKey(std::string_view step_key) {
  std::string key(step_key);
  key.append(":compensate");
  return key;
}

std::string KeyUuid(std::string_view tenant, std::string_view key) {
  std::string material(tenant);
  material.push_back('\n');
  material.append(key);
  std::string hex = Sha256Hex(material).substr(0, 32);
  hex[12] = '8';                              // version 8: custom
  static constexpr char kVariant[] = "89ab";  // variant 10xx
  const int nibble = hex[16] >= 'a' ? hex[16] - 'a' + 10 : hex[16] - '0';
  hex[16] = kVariant[nibble & 3];
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
         hex.substr(16, 4) + "-" + hex.substr(20, 12);
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
