#include "server/metrics.h"

#include <cstdio>
#include <sstream>

#include "base/status_macros.h"

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

void Header(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

}  // namespace

absl::StatusOr<std::string> RenderMetrics(Store& store, Millis now) {
  WS_ASSIGN_OR_RETURN(StoreSummary summary, store.Summary());
  WS_ASSIGN_OR_RETURN(std::vector<SinkStats> sinks, store.DeliveryStats());
  std::ostringstream out;
  Header(out, "waystone_instances", "gauge", "Workflow instances by state.");
  for (int i = 1; i <= 7; ++i) {
    const auto state = static_cast<InstanceState>(i);
    int64_t count = 0;
    for (const auto& [s, n] : summary.instances_by_state) {
      if (s == state) count = n;
    }
    out << "waystone_instances{state=\"" << ToString(state) << "\"} " << count << "\n";
  }
  Header(out, "waystone_open_alerts", "gauge", "Alerts not yet acknowledged or resolved.");
  out << "waystone_open_alerts " << summary.open_alerts << "\n";
  Header(out, "waystone_step_retries_total", "counter", "Step attempts beyond the first.");
  out << "waystone_step_retries_total " << summary.retries << "\n";
  Header(out, "waystone_unknown_outcomes_total", "counter",
         "Step attempts whose outcome was not known.");
  out << "waystone_unknown_outcomes_total " << summary.unknown_outcomes << "\n";
  Header(out, "waystone_outbox_events_total", "counter", "Events written to the outbox.");
  out << "waystone_outbox_events_total " << summary.outbox_events << "\n";

  Header(out, "waystone_relay_delivered_total", "counter", "Events delivered, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_delivered_total{sink=\"" << Label(s.sink) << "\"} " << s.delivered << "\n";
  }
  Header(out, "waystone_relay_failed_attempts_total", "counter",
         "Delivery attempts that were not acknowledged, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_failed_attempts_total{sink=\"" << Label(s.sink) << "\"} "
        << s.failed_attempts << "\n";
  }
  Header(out, "waystone_relay_pending_deliveries", "gauge", "Events waiting for delivery, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_pending_deliveries{sink=\"" << Label(s.sink) << "\"} " << s.pending << "\n";
  }
  Header(out, "waystone_relay_parked_deliveries", "gauge",
         "Events parked after too many failed attempts, by sink.");
  for (const auto& s : sinks) {
    out << "waystone_relay_parked_deliveries{sink=\"" << Label(s.sink) << "\"} " << s.parked << "\n";
  }
  Header(out, "waystone_relay_lag_seconds", "gauge",
         "Age of the oldest event waiting for delivery, by sink.");
  for (const auto& s : sinks) {
    const double lag = s.oldest_pending_at == 0 ? 0.0 : (now - s.oldest_pending_at) / 1000.0;
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f", lag < 0 ? 0.0 : lag);
    out << "waystone_relay_lag_seconds{sink=\"" << Label(s.sink) << "\"} " << text << "\n";
  }
  Header(out, "waystone_relay_sink_disabled", "gauge", "1 when a sink was disabled after HTTP 410.");
  for (const auto& s : sinks) {
    out << "waystone_relay_sink_disabled{sink=\"" << Label(s.sink) << "\"} " << (s.disabled ? 1 : 0)
        << "\n";
  }
  return out.str();
}

}  // namespace waystone
