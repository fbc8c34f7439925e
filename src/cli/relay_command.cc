#include <cstdio>

#include "base/clock.h"
#include "base/random.h"
#include "cli/common.h"
#include "cli/signals.h"
#include "connectors/http/http_client.h"
#include "messaging/relay.h"
#include "server/metrics_server.h"
#include "store/lease_owners.h"

namespace waystone::cli {

int Relay(const GlobalOptions& global, const RelayOptions& options) {
  std::stop_token stop = StopOnSignals();
  auto config = LoadRelayConfig(options.config);
  if (!config.ok()) return Fail(config.status());
  // With the server's tenants (--config, WAYSTONE_CONFIG), each sink serves its own.
  if (auto status = CheckRelayTenants(global, *config); !status.ok()) return Fail(status);
  auto store =
      options.enable_sink.empty() ? OpenStoreWaiting(global, 60'000) : OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  if (!options.enable_sink.empty()) {
    auto status = (*store)->EnableSink(options.enable_sink, SystemClock::Get()->NowMillis());
    if (!status.ok()) return Fail(status);
    std::printf("sink %s enabled\n", options.enable_sink.c_str());
    return kExitOk;
  }
  auto http = NewCurlHttpClient({});
  SeededRandom random;
  auto relay = waystone::Relay::Create(store->get(), http.get(), SystemClock::Get(), &random,
                                       *config, MakeOwnerName(random.Hex(4)));
  if (!relay.ok()) return Fail(relay.status());
  std::unique_ptr<MetricsServer> metrics;
  if (!options.metrics_listen.empty()) {
    auto started =
        MetricsServer::Start(options.metrics_listen, store->get(), SystemClock::Get(), nullptr);
    if (!started.ok()) return Fail(started.status());
    metrics = std::move(*started);
    std::printf("metrics on http://127.0.0.1:%d/metrics\n", metrics->port());
    std::fflush(stdout);
  }
  std::fprintf(stderr, "waystone: relay delivering to %zu sink(s) from %s\n", config->sinks.size(),
               DatabasePath(global).c_str());
  if (options.until_drained) {
    absl::Status drained = DrainRelay(**relay, **store, config->poll_interval, stop);
    std::fprintf(stderr, "waystone: relay stopped\n");
    // Stopped by a signal before it was drained: a clean stop, as without the flag.
    return drained.ok() || absl::IsCancelled(drained) ? kExitOk : Fail(drained);
  }
  (*relay)->Run(stop);  // until a signal, then what it holds is delivered and recorded
  std::fprintf(stderr, "waystone: relay stopped\n");
  return kExitOk;
}

absl::Status DrainRelay(waystone::Relay& relay, Store& store, Millis poll_interval,
                        std::stop_token stop) {
  while (!stop.stop_requested()) {
    auto attempted = relay.RunOnce();
    if (!attempted.ok()) {
      std::fprintf(stderr, "waystone: relay: %s\n",
                   std::string(attempted.status().message()).c_str());
      SystemClock::Get()->SleepFor(1000, stop);
      continue;
    }
    if (*attempted > 0) continue;
    // Done when nothing waits on an enabled sink (retries included).
    auto stats = store.DeliveryStats();
    bool waiting = !stats.ok();
    for (const auto& sink : stats.ok() ? *stats : std::vector<SinkStats>{}) {
      waiting = waiting || (sink.pending > 0 && !sink.disabled);
    }
    if (!waiting) return absl::OkStatus();
    SystemClock::Get()->SleepFor(poll_interval, stop);
  }
  return absl::CancelledError("stopped before the outbox was drained");
}

}  // namespace waystone::cli
