#include "server/metrics.h"

#include <cstdio>
#include <sstream>

#include "base/status_macros.h"
#include "engine/drive/call_metrics.h"

namespace waystone {
namespace {

std::string Label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// Writes one line per enum value from `first` to `last`, with the count of `counts`
// (0 when absent) and the value's name as label `label`.
template <typename Enum>
void CountsByEnum(std::ostringstream& out, const char* name, const char* label, int first, int last,
                  const std::vector<std::pair<Enum, int64_t>>& counts) {
  for (int i = first; i <= last; ++i) {
    const auto value = static_cast<Enum>(i);
    int64_t count = 0;
    for (const auto& [v, n] : counts) {
      if (v == value) count = n;
    }
    out << name << "{" << label << "=\"" << ToString(value) << "\"} " << count << "\n";
  }
}

void Header(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

}  // namespace

absl::StatusOr<std::string> RenderMetrics(Store& store, Millis now, const CallMetrics* calls) {
  static const CallMetrics kNoCalls;
  if (calls == nullptr) calls = &kNoCalls;
  WS_ASSIGN_OR_RETURN(StoreSummary summary, store.Summary());
  WS_ASSIGN_OR_RETURN(std::vector<SinkStats> sinks, store.DeliveryStats());
  std::ostringstream out;
  Header(out, "waystone_instances", "gauge", "Workflow instances by state.");
  CountsByEnum(out, "waystone_instances", "state", 1, 7, summary.instances_by_state);
  Header(out, "waystone_open_alerts", "gauge", "Alerts not yet acknowledged or resolved.");
  out << "waystone_open_alerts " << summary.open_alerts << "\n";
  Header(out, "waystone_step_retries_total", "counter", "Step attempts beyond the first.");
  out << "waystone_step_retries_total " << summary.retries << "\n";
  Header(out, "waystone_unknown_outcomes_total", "counter",
         "Step attempts whose outcome was not known.");
  out << "waystone_unknown_outcomes_total " << summary.unknown_outcomes << "\n";
  Header(out, "waystone_outbox_events_total", "counter", "Events written to the outbox.");
  out << "waystone_outbox_events_total " << summary.outbox_events << "\n";
  Header(out, "waystone_step_attempts_total", "counter", "Step submissions, over all steps.");
  out << "waystone_step_attempts_total " << summary.attempts << "\n";
  Header(out, "waystone_steps", "gauge", "Steps by state.");
  CountsByEnum(out, "waystone_steps", "state", 1, 10, summary.steps_by_state);
  Header(out, "waystone_step_outcomes", "gauge",
         "Steps whose last failed attempt had this error class (transient, rejected, unknown).");
  CountsByEnum(out, "waystone_step_outcomes", "class", 1, 3, summary.steps_by_error_class);
  Header(
      out, "waystone_unknown_resolutions_total", "counter",
      "Unknown outcomes settled, by how: found by lookup, resubmitted, confirmed by an operator.");
  out << "waystone_unknown_resolutions_total{how=\"lookup_found\"} " << summary.resolved_by_lookup
      << "\n";
  out << "waystone_unknown_resolutions_total{how=\"resubmitted\"} "
      << summary.resubmitted_after_lookup << "\n";
  out << "waystone_unknown_resolutions_total{how=\"operator\"} " << summary.resolved_by_operator
      << "\n";
  Header(out, "waystone_compensations_total", "counter", "Steps compensated.");
  out << "waystone_compensations_total " << summary.compensations << "\n";
  Header(out, "waystone_compensation_attempts_total", "counter", "Compensation calls made.");
  out << "waystone_compensation_attempts_total " << summary.compensation_attempts << "\n";
  Header(out, "waystone_compensation_failures", "gauge", "Steps whose compensation failed.");
  out << "waystone_compensation_failures " << summary.compensation_failures << "\n";
  Header(out, "waystone_lease_takeovers_total", "counter",
         "Instances claimed after another owner's lease ran out unreleased.");
  out << "waystone_lease_takeovers_total " << summary.lease_takeovers << "\n";
  Header(out, "waystone_inbox_duplicates_total", "counter",
         "Events received again and acknowledged without a second effect.");
  out << "waystone_inbox_duplicates_total " << summary.inbox_duplicates << "\n";
  Header(out, "waystone_step_calls_total", "counter",
         "External calls made by this process, by phase and outcome class (none = success).");
  for (size_t p = 0; p < kCallPhaseNames.size(); ++p) {
    for (int c = 0; c <= 3; ++c) {
      const auto error_class = static_cast<ErrorClass>(c);
      out << "waystone_step_calls_total{phase=\"" << kCallPhaseNames[p] << "\",class=\""
          << ToString(error_class) << "\"} "
          << calls->OutcomeCount(static_cast<CallPhase>(p), error_class) << "\n";
    }
  }
  Header(out, "waystone_step_duration_seconds", "histogram",
         "Duration of the external calls made by this process, by phase.");
  for (size_t p = 0; p < kCallPhaseNames.size(); ++p) {
    const CallLatency latency = calls->LatencySnapshot(static_cast<CallPhase>(p));
    const std::string phase(kCallPhaseNames[p]);
    for (size_t i = 0; i < kCallLatencyBuckets.size(); ++i) {
      char bound[32];
      std::snprintf(bound, sizeof(bound), "%g", kCallLatencyBuckets[i]);
      out << "waystone_step_duration_seconds_bucket{phase=\"" << phase << "\",le=\"" << bound
          << "\"} " << latency.buckets[i] << "\n";
    }
    out << "waystone_step_duration_seconds_bucket{phase=\"" << phase << "\",le=\"+Inf\"} "
        << latency.count << "\n";
    char sum[32];
    std::snprintf(sum, sizeof(sum), "%.6f", latency.sum_seconds);
    out << "waystone_step_duration_seconds_sum{phase=\"" << phase << "\"} " << sum << "\n";
    out << "waystone_step_duration_seconds_count{phase=\"" << phase << "\"} " << latency.count
        << "\n";
  }

  Header(out, "waystone_relay_delivered_total", "counter", "Events delivered, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_delivered_total{sink=\"" << Label(s.sink) << "\"} " << s.delivered
        << "\n";
  }
  Header(out, "waystone_relay_failed_attempts_total", "counter",
         "Delivery attempts that were not acknowledged, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_failed_attempts_total{sink=\"" << Label(s.sink) << "\"} "
        << s.failed_attempts << "\n";
  }
  Header(out, "waystone_relay_pending_deliveries", "gauge",
         "Events waiting for delivery, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_pending_deliveries{sink=\"" << Label(s.sink) << "\"} " << s.pending
        << "\n";
  }
  Header(out, "waystone_relay_parked_deliveries", "gauge",
         "Events parked after too many failed attempts, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_parked_deliveries{sink=\"" << Label(s.sink) << "\"} " << s.parked
        << "\n";
  }
  Header(out, "waystone_relay_lag_seconds", "gauge",
         "Age of the oldest event waiting for delivery, by sink.");
  for (const auto& s : sinks) {
    const double lag = s.oldest_pending_at == 0 ? 0.0 : (now - s.oldest_pending_at) / 1000.0;
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f", lag < 0 ? 0.0 : lag);
    out << "waystone_relay_lag_seconds{sink=\"" << Label(s.sink) << "\"} " << text << "\n";
  }
  Header(out, "waystone_relay_sink_disabled", "gauge",
         "1 when a sink was disabled after HTTP 410.");
  for (const auto& s : sinks) {
    out << "waystone_relay_sink_disabled{sink=\"" << Label(s.sink) << "\"} " << (s.disabled ? 1 : 0)
        << "\n";
  }
  return out.str();
}

}  // namespace waystone
