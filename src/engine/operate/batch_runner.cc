#include "engine/operate/batch_runner.h"

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "engine/operate/operations.h"
#include "model/json_text.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Applied items judged per round.
constexpr int kJudgedPerRound = 100;

BatchItemUpdate Move(const BatchItemRecord& item, const std::string& owner, BatchItemState to,
                     std::string message, Millis now) {
  BatchItemUpdate update;
  update.item_id = item.id;
  update.from = item.state;
  update.owner = owner;
  update.to = to;
  update.message = std::move(message);
  update.now = now;
  return update;
}

}  // namespace

std::string BatchActionJson(const OperatorRequest& request) {
  Json fields = Json::object();
  if (!request.step.empty()) fields["step"] = request.step;
  if (request.happened) fields["happened"] = *request.happened;
  if (!request.external_id.empty()) fields["external_id"] = request.external_id;
  if (!request.response_json.empty()) fields["response"] = request.response_json;
  return JsonText(fields);
}

absl::StatusOr<OperatorRequest> BatchRequest(const BatchRecord& batch) {
  auto action = ParseOperatorAction(batch.action);
  const Json fields = Json::parse(batch.action_json, nullptr, false);
  if (!action || !fields.is_object()) {
    return absl::InvalidArgumentError("batch " + batch.public_id + " holds no action it can apply");
  }
  OperatorRequest request;
  request.action = *action;
  request.step = fields.value("step", "");
  if (fields.contains("happened") && fields["happened"].is_boolean()) {
    request.happened = fields["happened"].get<bool>();
  }
  request.external_id = fields.value("external_id", "");
  request.response_json = fields.value("response", "");
  request.actor = batch.actor;
  request.reason = batch.reason;
  request.batch = batch.public_id;
  return request;
}

InstanceState AimOf(OperatorAction action) {
  switch (action) {
    case OperatorAction::kCompensate:
      return InstanceState::kCompensated;
    case OperatorAction::kClose:
      return InstanceState::kClosed;
    case OperatorAction::kRetry:
    case OperatorAction::kConfirm:
    case OperatorAction::kSkip:
      return InstanceState::kCompleted;
  }
  return InstanceState::kCompleted;
}

BatchRunner::BatchRunner(BatchStore* batches, InstanceStore* instances, Operations* operations,
                         const Clock* clock, std::string owner, BatchRunnerOptions options)
    : batches_(batches),
      instances_(instances),
      operations_(operations),
      clock_(clock),
      owner_(std::move(owner)),
      options_(options) {}

BatchRunner::~BatchRunner() { Stop(); }

void BatchRunner::Start() {
  if (thread_.joinable()) return;
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

void BatchRunner::Stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
}

void BatchRunner::Loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    auto moved = RunOnce();
    if (!moved.ok()) Log(LogLevel::kWarning, "batch runner: " + moved.status().ToString());
    if (!moved.ok() || *moved == 0) clock_->WaitFor(options_.poll_interval, stop);
  }
}

absl::StatusOr<int> BatchRunner::RunOnce() {
  int moved = 0;
  WS_ASSIGN_OR_RETURN(std::vector<BatchItemRecord> claimed,
                      batches_->ClaimBatchItems(owner_, clock_->NowMillis(),
                                                options_.claim_duration, options_.items_per_round));
  for (const BatchItemRecord& item : claimed) {
    // One item's trouble is its own (recorded on it, or its claim expires and it is
    // taken again): the others go on.
    if (auto applied = ApplyItem(item); !applied.ok()) {
      Log(LogLevel::kWarning, "batch item " + std::to_string(item.id) + ": " + applied.ToString());
    }
    ++moved;
  }
  WS_ASSIGN_OR_RETURN(std::vector<BatchItemRecord> applied,
                      batches_->AppliedBatchItems(kJudgedPerRound));
  for (const BatchItemRecord& item : applied) {
    WS_ASSIGN_OR_RETURN(bool judged, Judge(item));
    if (judged) ++moved;
  }
  return moved;
}

absl::StatusOr<bool> BatchRunner::AppliedBefore(const BatchRecord& batch,
                                                const BatchItemRecord& item) {
  auto audit = instances_->ListAudit(item.instance_id);
  if (!audit.ok()) return audit.status();
  return AuditHoldsBatchAction(*audit, batch.action, batch.public_id);
}

absl::Status BatchRunner::ApplyItem(const BatchItemRecord& item) {
  WS_ASSIGN_OR_RETURN(BatchRecord batch, batches_->GetBatch(item.batch_id));
  auto finish = [&](BatchItemState to, std::string message, std::string result_state = "") {
    BatchItemUpdate update = Move(item, owner_, to, std::move(message), clock_->NowMillis());
    update.result_state = std::move(result_state);
    absl::Status status = batches_->UpdateBatchItem(update);
    // Moved on: its claim expired and another runner has it (and will see the audit).
    return absl::IsFailedPrecondition(status) ? absl::OkStatus() : status;
  };
  auto request = BatchRequest(batch);
  if (!request.ok())
    return finish(BatchItemState::kFailed, std::string(request.status().message()));
  if (item.tries > 1) {
    // Taken again: its last runner may have applied it and died before saying so.
    WS_ASSIGN_OR_RETURN(bool before, AppliedBefore(batch, item));
    if (before) return finish(BatchItemState::kApplied, "");
  }
  if (batch.state == BatchState::kCancelled) {
    return finish(BatchItemState::kCancelled, "the batch was cancelled");
  }
  auto result = operations_->Apply(batch.tenant, item.instance_key, *request);
  if (result.ok()) {
    // A kill here leaves the action committed and the item unsaid: the next runner's
    // audit check must tell (tests crash here).
    CrashPoint("batch-applied", item.instance_key);
    return finish(BatchItemState::kApplied, "", std::string(ToString(result->instance.state)));
  }
  const absl::Status& why = result.status();
  // Another runner of this item applied it while this one waited for the lease:
  // Apply checked the audit under the lease, so the action is in once.
  if (absl::IsAlreadyExists(why)) return finish(BatchItemState::kApplied, "");
  if (absl::IsAborted(why) || absl::IsUnavailable(why)) {
    // A worker holds the instance, or the store is busy: taken again later.
    if (item.tries < options_.max_tries)
      return finish(BatchItemState::kPending, std::string(why.message()));
    return finish(BatchItemState::kFailed, std::string(why.message()));
  }
  // A refusal may come from this batch's own action, applied by a runner whose claim
  // expired mid-action: the audit says so.
  WS_ASSIGN_OR_RETURN(bool before, AppliedBefore(batch, item));
  if (before) return finish(BatchItemState::kApplied, "");
  if (absl::IsFailedPrecondition(why) || absl::IsNotFound(why) || absl::IsInvalidArgument(why)) {
    return finish(BatchItemState::kRefused, std::string(why.message()));
  }
  return finish(BatchItemState::kFailed, std::string(why.message()));
}

absl::StatusOr<bool> BatchRunner::Judge(const BatchItemRecord& item) {
  const Millis now = clock_->NowMillis();
  auto instance = instances_->GetInstance(item.instance_id);
  BatchItemUpdate update = Move(item, "", BatchItemState::kUnsettled, "", now);
  if (absl::IsNotFound(instance.status())) {
    update.message = "the instance is gone (collected)";
  } else if (!instance.ok()) {
    return instance.status();
  } else if (IsTerminal(instance->state)) {
    WS_ASSIGN_OR_RETURN(BatchRecord batch, batches_->GetBatch(item.batch_id));
    auto action = ParseOperatorAction(batch.action);
    const bool aimed = action && instance->state == AimOf(*action);
    update.to = aimed ? BatchItemState::kSucceeded : BatchItemState::kStopped;
    update.result_state = std::string(ToString(instance->state));
    if (!aimed) update.message = instance->status_reason;
  } else if (now - item.applied_at >= options_.settle_patience) {
    update.result_state = std::string(ToString(instance->state));
    update.message =
        "not at rest " + std::to_string(options_.settle_patience / 1000) + " s after the action";
  } else {
    return false;  // still on its way: judged in a later round
  }
  absl::Status status = batches_->UpdateBatchItem(update);
  if (absl::IsFailedPrecondition(status)) return false;  // another runner judged it
  WS_RETURN_IF_ERROR(status);
  return true;
}

}  // namespace waystone
