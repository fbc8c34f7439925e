// What "one request on the wire per attempt" costs: the engine sends every call on a
// fresh connection (no library resend is possible), against the baseline of the same
// calls on kept-alive connections, measured in the same run against the simulator on
// loopback. Prints calls/s and the median latency for each, and their ratio.
//
//   build/bench/connection_bench [--calls N]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "connectors/http/http_client.h"
#include "flags.h"
#include "sim/simulator.h"

namespace waystone {
namespace {

struct Figures {
  double calls_per_second = 0;
  double median_ms = 0;
  int failures = 0;
};

Figures Measure(const std::string& url, ConnectionReuse reuse, int threads, int calls) {
  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  std::vector<std::vector<double>> latencies(threads);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto client = NewCurlHttpClient({});
      while (next.fetch_add(1) < calls) {
        const auto begin = std::chrono::steady_clock::now();
        HttpResponse response = client->Send({"GET", url, {}, "", 5000, reuse});
        latencies[t].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
                .count());
        if (response.outcome.status != 200) failures.fetch_add(1);
      }
    });
  }
  for (auto& w : workers) w.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  return {calls / seconds, all.empty() ? 0 : all[all.size() / 2], failures.load()};
}

}  // namespace
}  // namespace waystone

int main(int argc, char** argv) {
  int calls = 3000;
  if (!waystone::bench::EveryFlagHasAValue(argc, argv)) return 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::atoi(argv[i + 1]);
  }
  auto sim = waystone::Simulator::Start({});
  if (!sim.ok()) {
    std::fprintf(stderr, "simulator: %s\n", sim.status().ToString().c_str());
    return 1;
  }
  const std::string url = (*sim)->base_url() + "/crm/customers/C-1";
  std::printf("GET %s, %d calls each\n\n", url.c_str(), calls);
  std::printf("%-8s %-30s %12s %10s %14s\n", "threads", "connection", "calls/s", "p50 ms",
              "vs kept-alive");
  for (int threads : {1, 8}) {
    const auto kept = waystone::Measure(url, waystone::ConnectionReuse::kReuse, threads, calls);
    const auto fresh = waystone::Measure(url, waystone::ConnectionReuse::kFresh, threads, calls);
    std::printf("%-8d %-30s %12.0f %10.3f %14s\n", threads, "kept-alive (baseline)",
                kept.calls_per_second, kept.median_ms, "1.00");
    std::printf("%-8d %-30s %12.0f %10.3f %14.2f\n", threads, "fresh (what the engine uses)",
                fresh.calls_per_second, fresh.median_ms,
                fresh.calls_per_second / kept.calls_per_second);
    if (kept.failures + fresh.failures > 0) {
      std::fprintf(stderr, "%d calls failed\n", kept.failures + fresh.failures);
      return 1;
    }
  }
  return 0;
}
