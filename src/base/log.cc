#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/mutex.h"
#include "base/redact.h"

namespace waystone {
namespace {

LogLevel ThresholdFromEnv() {
  const char* value = std::getenv("WAYSTONE_LOG");
  if (value == nullptr) return LogLevel::kWarning;
  if (std::strcmp(value, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(value, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(value, "error") == 0) return LogLevel::kError;
  return LogLevel::kWarning;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{static_cast<int>(ThresholdFromEnv())};
  return threshold;
}

const char* Name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

}  // namespace

void SetLogThreshold(LogLevel level) { Threshold() = static_cast<int>(level); }

void Log(LogLevel level, std::string_view message) {
  if (static_cast<int>(level) < Threshold().load()) return;
  const std::string text = RedactSecrets(message);
  static Mutex mu;
  MutexLock lock(mu);
  std::fprintf(stderr, "waystone %s: %.*s\n", Name(level), static_cast<int>(text.size()),
               text.data());
}

}  // namespace waystone
