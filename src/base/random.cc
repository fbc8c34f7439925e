#include "base/random.h"

#include "base/hex.h"
#include "base/mutex.h"

namespace waystone {

int64_t Random::UniformInclusive(int64_t bound) {
  if (bound <= 0) return 0;
  const uint64_t span = static_cast<uint64_t>(bound) + 1;
  return static_cast<int64_t>(Next() % span);
}

std::string Random::Hex(int bytes) {
  std::string raw;
  raw.reserve(static_cast<size_t>(bytes));
  uint64_t word = 0;
  for (int i = 0; i < bytes; ++i) {
    if (i % 8 == 0) word = Next();
    raw.push_back(static_cast<char>(word & 0xff));
    word >>= 8;
  }
  return HexOf(raw);
}

std::string Random::TimeOrderedHex(int64_t unix_ms) {
  const uint64_t ms = static_cast<uint64_t>(unix_ms < 0 ? 0 : unix_ms) & 0xffff'ffff'ffffULL;
  const uint64_t rand_a = Next() & 0xfff;
  const uint64_t high = (ms << 16) | (uint64_t{7} << 12) | rand_a;
  const uint64_t low = (uint64_t{2} << 62) | (Next() >> 2);
  std::string raw(16, '\0');  // big-endian: the millisecond first
  for (int i = 0; i < 8; ++i) {
    raw[static_cast<size_t>(7 - i)] = static_cast<char>((high >> (8 * i)) & 0xff);
    raw[static_cast<size_t>(15 - i)] = static_cast<char>((low >> (8 * i)) & 0xff);
  }
  return HexOf(raw);
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
