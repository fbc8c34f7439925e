#include "server/idempotency.h"

#include "base/log.h"
#include "base/sha256.h"
#include "server/request_helpers.h"
#include "store/lease_owners.h"

namespace waystone {

bool ValidIdempotencyKey(const std::string& key) {
  if (key.empty() || key.size() > 255) return false;
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

void RunIdempotent(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res, const std::function<void()>& handle) {
  const std::string* header = req.Header("idempotency-key");
  if (header == nullptr) return handle();
  const std::string key = *header;
  if (!ValidIdempotencyKey(key)) {
    return Send(res, BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters"),
                req.path);
  }
  const Millis now = ctx.clock->NowMillis();
  ApiRequestRecord record;
  record.tenant = principal.tenant;
  record.key = key;
  // The token is part of the request: a stored answer is what its token may see and
  // do (its role, permissions, redaction), never replayed to another token.
  record.request_hash =
      Sha256Hex(req.method + " " + req.path + " dry_run=" + Param(req, "dry_run") + " tenant=" +
                Param(req, "tenant") + " token=" + principal.token_name + "\n" + req.body);
  record.created_at = now;
  record.expires_at = now + ctx.options.idempotency_retention;
  record.owner = ctx.owner;
  auto claim = ctx.store->BeginApiRequest(record, now - ctx.options.idempotency_stale_after, "");
  if (claim.ok() && claim->outcome == ApiRequestOutcome::kInFlight &&
      IsDeadLocalOwner(claim->stored.owner)) {
    // Its server was killed mid-request: this request takes over (the work it
    // did is idempotent under the business key or the event id).
    claim = ctx.store->BeginApiRequest(record, now - ctx.options.idempotency_stale_after,
                                       claim->stored.owner);
  }
  if (!claim.ok()) return Send(res, ProblemFromStatus(claim.status()), req.path);
  switch (claim->outcome) {
    case ApiRequestOutcome::kInFlight:
      res.SetHeader("Retry-After", "1");
      return Send(res, MakeProblem(ProblemKind::kIdempotencyKeyInFlight, "retry after it finished"),
                  req.path);
    case ApiRequestOutcome::kMismatch:
      return Send(res,
                  MakeProblem(ProblemKind::kIdempotencyKeyReused,
                              "key '" + key +
                                  "' was first used with a different request; "
                                  "use a new key for a new request"),
                  req.path);
    case ApiRequestOutcome::kReplay:
      res.status = claim->stored.status;
      res.SetHeader("Idempotent-Replayed", "true");
      res.SetContent(claim->stored.body, claim->stored.content_type);
      return;
    case ApiRequestOutcome::kNew:
      break;
  }
  handle();
  if (res.status >= 500 || res.status == 202) {
    // Not an answer to the request (a failure, or a start whose outcome was not there
    // yet: Prefer: wait): a retry with the same key asks again.
    (void)ctx.store->AbandonApiRequest(record.tenant, record.key);
    return;
  }
  record.status = res.status;
  record.content_type = res.Header("Content-Type");
  record.body = res.body;
  record.done = true;
  if (auto stored = ctx.store->FinishApiRequest(record); !stored.ok()) {
    Log(LogLevel::kWarning, "storing the response for Idempotency-Key: " + stored.ToString());
  }
}

}  // namespace waystone
