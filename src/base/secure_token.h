#pragma once

#include <string>

namespace waystone {

// Returns `bytes` bytes from the operating system's CSPRNG (OpenSSL RAND_bytes) as
// lowercase hex; empty if the generator fails.
std::string SecureRandomHex(int bytes);

}  // namespace waystone
