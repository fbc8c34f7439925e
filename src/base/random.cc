#include "base/random.h"
#include "base/mutex.h"

namespace waystone {

int64_t Random::UniformInclusive(int64_t bound) {
  if (bound <= 0) return 0;
  const uint64_t span = static_cast<uint64_t>(bound) + 1;
  return static_cast<int64_t>(Next() % span);
}

std::string Random::Hex(int bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(static_cast<size_t>(bytes) * 2);
  uint64_t word = 0;
  for (int i = 0; i < bytes; ++i) {
    if (i % 8 == 0) word = Next();
    const unsigned byte = static_cast<unsigned>(word & 0xff);
    word >>= 8;
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 0xf]);
  }
  return out;
}

std::string Random::TimeOrderedHex(int64_t unix_ms) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const uint64_t ms = static_cast<uint64_t>(unix_ms < 0 ? 0 : unix_ms) & 0xffff'ffff'ffffULL;
  const uint64_t rand_a = Next() & 0xfff;
  const uint64_t high = (ms << 16) | (uint64_t{7} << 12) | rand_a;
  const uint64_t low = (uint64_t{2} << 62) | (Next() >> 2);
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[static_cast<size_t>(15 - i)] = kDigits[(high >> (4 * i)) & 0xf];
    out[static_cast<size_t>(31 - i)] = kDigits[(low >> (4 * i)) & 0xf];
  }
  return out;
}

SeededRandom::SeededRandom() : engine_(std::random_device{}()) {
  // Mix in a second draw so two processes started in the same instant differ.
  engine_.seed((static_cast<uint64_t>(std::random_device{}()) << 32) ^ engine_());
}

uint64_t SeededRandom::Next() {
  MutexLock lock(mu_);
  return engine_();
}

}  // namespace waystone
