#include "sim/faults.h"

#include <nlohmann/json.hpp>

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr FaultKind kAllFaults[] = {FaultKind::kDropResponse,
                                    FaultKind::kDelay,
                                    FaultKind::kUnavailable,
                                    FaultKind::kRateLimit,
                                    FaultKind::kFail,
                                    FaultKind::kError,
                                    FaultKind::kCloseBeforeBytes,
                                    FaultKind::kCloseBeforeBytesReused,
                                    FaultKind::kReset,
                                    FaultKind::kPartialStatus,
                                    FaultKind::kPartialHeaders,
                                    FaultKind::kStatus500,
                                    FaultKind::kStatus502,
                                    FaultKind::kStatus504,
                                    FaultKind::kNone};

}  // namespace

std::optional<LostResponse> LossOf(FaultKind kind) {
  switch (kind) {
    case FaultKind::kCloseBeforeBytes:
    case FaultKind::kCloseBeforeBytesReused:
      return LostResponse::kCloseBeforeBytes;
    case FaultKind::kReset:
      return LostResponse::kReset;
    case FaultKind::kPartialStatus:
      return LostResponse::kPartialStatus;
    case FaultKind::kPartialHeaders:
      return LostResponse::kPartialHeaders;
    case FaultKind::kNone:
    case FaultKind::kDropResponse:
    case FaultKind::kDelay:
    case FaultKind::kUnavailable:
    case FaultKind::kRateLimit:
    case FaultKind::kFail:
    case FaultKind::kError:
    case FaultKind::kStatus500:
    case FaultKind::kStatus502:
    case FaultKind::kStatus504:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<int> StatusAfterCommit(FaultKind kind) {
  if (kind == FaultKind::kStatus500) return 500;
  if (kind == FaultKind::kStatus502) return 502;
  if (kind == FaultKind::kStatus504) return 504;
  return std::nullopt;
}

std::string_view FaultName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNone:
      return "none";
    case FaultKind::kDropResponse:
      return "drop_response";
    case FaultKind::kDelay:
      return "delay";
    case FaultKind::kUnavailable:
      return "unavailable";
    case FaultKind::kRateLimit:
      return "rate_limit";
    case FaultKind::kFail:
      return "fail";
    case FaultKind::kError:
      return "error";
    case FaultKind::kCloseBeforeBytes:
      return "close_before_bytes";
    case FaultKind::kCloseBeforeBytesReused:
      return "close_before_bytes_reused";
    case FaultKind::kReset:
      return "reset";
    case FaultKind::kPartialStatus:
      return "partial_status";
    case FaultKind::kPartialHeaders:
      return "partial_headers";
    case FaultKind::kStatus500:
      return "status_500";
    case FaultKind::kStatus502:
      return "status_502";
    case FaultKind::kStatus504:
      return "status_504";
  }
  return "none";
}

absl::StatusOr<std::map<std::string, Fault>> ParseFaults(const std::string& text,
                                                         const std::set<std::string>& routes) {
  Json doc = Json::parse(text.empty() ? "{}" : text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("faults must be a JSON object of route -> knobs");
  }
  std::map<std::string, Fault> faults;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (!routes.contains(it.key())) {
      return absl::InvalidArgumentError("unknown simulator route '" + it.key() + "'");
    }
    if (!it->is_object()) {
      return absl::InvalidArgumentError("faults for '" + it.key() + "' must be an object");
    }
    Fault fault;
    for (auto knob = it->begin(); knob != it->end(); ++knob) {
      const std::string& name = knob.key();
      if (name == "next") {
        if (!knob->is_array()) return absl::InvalidArgumentError("'next' must be a list");
        for (const auto& kind : *knob) {
          const std::string k = kind.is_string() ? kind.get<std::string>() : "";
          FaultKind parsed = FaultKind::kNone;
          for (FaultKind f : kAllFaults) {
            if (FaultName(f) == k) parsed = f;
          }
          if (FaultName(parsed) != k) {
            return absl::InvalidArgumentError("unknown fault '" + k + "' in " + it.key());
          }
          fault.next.push_back(parsed);
        }
        continue;
      }
      if (!knob->is_number()) {
        return absl::InvalidArgumentError(it.key() + "." + name + " must be a number");
      }
      const double value = knob->get<double>();
      if (name == "drop_response")
        fault.drop_response = value;
      else if (name == "delay")
        fault.delay = value;
      else if (name == "unavailable")
        fault.unavailable = value;
      else if (name == "rate_limit")
        fault.rate_limit = value;
      else if (name == "fail")
        fault.fail = value;
      else if (name == "error")
        fault.error = value;
      else if (name == "delay_ms")
        fault.delay_ms = static_cast<int>(value);
      else if (name == "retry_after_s")
        fault.retry_after_s = static_cast<int>(value);
      else {
        bool shape = false;
        for (FaultKind f : kAllFaults) {
          if ((LossOf(f) || StatusAfterCommit(f)) && FaultName(f) == name) {
            fault.shapes[f] = value;
            shape = true;
          }
        }
        if (!shape)
          return absl::InvalidArgumentError("unknown knob '" + name + "' for " + it.key());
      }
    }
    faults[it.key()] = std::move(fault);
  }
  return faults;
}

FaultKind DrawFault(Fault& fault, std::mt19937_64& random, bool reused_connection) {
  FaultKind kind = FaultKind::kNone;
  if (!fault.next.empty()) {
    if (fault.next.front() == FaultKind::kCloseBeforeBytesReused && !reused_connection) {
      return FaultKind::kNone;
    }
    kind = fault.next.front();
    fault.next.pop_front();
  } else {
    std::uniform_real_distribution<double> roll(0.0, 1.0);
    const std::pair<double, FaultKind> table[] = {{fault.drop_response, FaultKind::kDropResponse},
                                                  {fault.delay, FaultKind::kDelay},
                                                  {fault.unavailable, FaultKind::kUnavailable},
                                                  {fault.rate_limit, FaultKind::kRateLimit},
                                                  {fault.fail, FaultKind::kFail},
                                                  {fault.error, FaultKind::kError}};
    for (const auto& [p, k] : table) {
      if (p > 0 && roll(random) < p) {
        kind = k;
        break;
      }
    }
    for (const auto& [k, p] : fault.shapes) {
      if (kind != FaultKind::kNone) break;
      if (k == FaultKind::kCloseBeforeBytesReused && !reused_connection) continue;
      if (p > 0 && roll(random) < p) kind = k;
    }
  }
  return kind;
}

}  // namespace waystone
