#include "engine/drive/call_metrics.h"
#include "engine/engine.h"
#include "http/problem.h"
#include "server/api_handlers.h"
#include "server/metrics.h"
#include "server/request_helpers.h"

// The routes for load balancers, scrapers and clients' tooling: /healthz (also
// answered by the front on its I/O thread), /readyz (the store answers), /metrics
// (Prometheus text, admin) and the OpenAPI document.

namespace waystone {

void HandleHealth(const ApiContext& ctx, const Principal& principal, RouteId route,
                  const ServerRequest& req, ServerResponse& res) {
  switch (route) {
    case RouteId::kReady: {
      // One indexed read (probes come often; the metrics' Summary scans whole tables).
      auto due = ctx.store->NextDueTime();
      if (!due.ok()) return Send(res, ProblemFromStatus(due.status()), req.path);
      return res.SetContent("ready\n", "text/plain");
    }
    case RouteId::kMetrics: {
      // The figures count every tenant's instances, calls and alerts: an admin of one
      // tenant would read the others' (the metrics listener, metrics.listen, serves
      // scrapers without a token).
      if (principal.tenant != "*") {
        return Send(res,
                    Forbidden("/metrics covers every tenant; it needs an admin token of "
                              "tenant '*' (or scrape the metrics listener)"),
                    req.path);
      }
      auto text = RenderMetrics(*ctx.store, ctx.clock->NowMillis(),
                                ctx.engine != nullptr ? &ctx.engine->call_metrics() : nullptr);
      if (!text.ok()) return Send(res, ProblemFromStatus(text.status()), req.path);
      return res.SetContent(*text, kMetricsContentType);
    }
    case RouteId::kOpenApi:
      return res.SetContent(std::string(OpenApiDocument()), "application/json");
    default:
      return res.SetContent("ok\n", "text/plain");
  }
}

}  // namespace waystone
