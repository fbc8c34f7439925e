#include "store/start_decision.h"

#include "base/status_macros.h"

namespace waystone {

absl::Status CheckStartAgainst(const std::string& held_by_workflow,
                               const std::string& held_input_hash, const NewInstance& start,
                               bool collected) {
  const std::string held = collected ? "collected instance" : "instance";
  if (held_by_workflow != start.workflow) {
    return absl::FailedPreconditionError(
        "business key '" + start.key + "' is held by " + held + " of workflow '" +
        held_by_workflow + "'; workflow '" + start.workflow +
        "' cannot start under it (business keys are unique per tenant)");
  }
  if (held_input_hash != start.input_hash) {
    // Not the hashes themselves: the answer goes to callers who may not see a redacted
    // value, and the plain hash of an input whose other fields they know gives it away.
    return absl::FailedPreconditionError(
        held + " '" + start.key +
        "' already exists with another input (its input hash "
        "differs from this start's: same business key, different input)");
  }
  return absl::OkStatus();
}

StartOutcome DecideClaimedEvent(const InboxEntry& stored, const std::string& data_hash) {
  if (stored.data_hash.empty() || stored.data_hash == data_hash) {
    return StartOutcome::kDuplicateEvent;
  }
  return StartOutcome::kEventConflict;
}

InstanceRecord InstanceFromTombstone(const TombstoneRecord& tombstone) {
  InstanceRecord record;
  record.id = tombstone.instance_id;
  record.tenant = tombstone.tenant;
  record.key = tombstone.key;
  record.workflow = tombstone.workflow;
  record.input_hash = tombstone.input_hash;
  record.state = tombstone.final_state;
  record.status_reason = "collected by gc; only its tombstone is kept";
  record.updated_at = tombstone.finished_at;
  return record;
}

}  // namespace waystone

namespace waystone {
namespace {

bool HasEvent(const NewInstance& start) {
  return !start.event_source.empty() && !start.event_id.empty();
}

// What an event claimed before led to: the instance, or its tombstone when gc
// collected it. Counts a duplicate (not a conflict) as one.
absl::StatusOr<StartResult> AnswerClaimedEvent(StartSql& sql, const NewInstance& in) {
  WS_ASSIGN_OR_RETURN(std::optional<InboxEntry> prior,
                      sql.ReadInbox(in.tenant, in.event_source, in.event_id));
  if (!prior) return absl::UnavailableError("inbox claim not visible yet; retry");
  StartResult result;
  result.outcome = DecideClaimedEvent(*prior, in.event_data_hash);
  result.stored_data_hash = prior->data_hash;
  WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> instance, sql.InstanceById(prior->instance_id));
  if (instance) {
    result.instance = *instance;
  } else {
    WS_ASSIGN_OR_RETURN(result.tombstone, sql.TombstoneOfInstance(prior->instance_id));
    if (result.tombstone) result.instance = InstanceFromTombstone(*result.tombstone);
  }
  if (result.outcome == StartOutcome::kDuplicateEvent) {
    WS_RETURN_IF_ERROR(sql.AddToCounter(kCounterInboxDuplicates, 1));
  }
  return result;
}

}  // namespace

absl::StatusOr<StartResult> StartInstanceWith(StartSql& sql, const NewInstance& in) {
  const bool has_event = HasEvent(in);
  if (has_event) {
    WS_ASSIGN_OR_RETURN(bool claimed, sql.ClaimStartEvent(in));
    if (!claimed) return AnswerClaimedEvent(sql, in);
  }
  StartResult result;
  const std::string source_event = has_event ? in.event_source + " " + in.event_id : "";
  WS_ASSIGN_OR_RETURN(StartSql::Insertion insertion, sql.InsertInstance(in, source_event));
  const std::optional<int64_t> created = insertion.created;
  if (created && insertion.tombstone) {
    return absl::AbortedError(kCollectedMeanwhile);  // the tombstone wins
  }
  result.tombstone = std::move(insertion.tombstone);
  if (created) {
    WS_RETURN_IF_ERROR(sql.InsertPendingSteps(*created, in.step_names));
    WS_RETURN_IF_ERROR(sql.InsertEvent(in.started_event, *created, in.now));
    // Created leased, it has its worker: nobody else is woken for it.
    if (in.lease_owner.empty()) WS_RETURN_IF_ERROR(sql.SignalWork());
    WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> instance, sql.InstanceById(*created));
    if (!instance) return absl::InternalError("instance vanished inside its transaction");
    result.outcome = StartOutcome::kCreated;
    result.instance = *instance;
  } else if (result.tombstone) {
    WS_RETURN_IF_ERROR(
        CheckStartAgainst(result.tombstone->workflow, result.tombstone->input_hash, in, true));
    result.outcome = StartOutcome::kCollected;
    result.instance = InstanceFromTombstone(*result.tombstone);
  } else {
    WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> existing,
                        sql.InstanceByKey(in.tenant, in.key));
    // The insert found the key held, and neither an instance nor a tombstone holds it
    // now: a gc removed one (or its expired tombstone) meanwhile. Start again.
    if (!existing) return absl::AbortedError(kCollectedMeanwhile);
    WS_RETURN_IF_ERROR(CheckStartAgainst(existing->workflow, existing->input_hash, in, false));
    result.outcome = StartOutcome::kExisting;
    result.instance = *existing;
  }
  if (has_event) WS_RETURN_IF_ERROR(sql.LinkInbox(in, result.instance.id));
  return result;
}

absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> StartInstancesWith(
    StartSql& sql, const std::vector<NewInstance>& starts) {
  return EachUnderSavepoint<absl::StatusOr<StartResult>>(
      sql, starts, [&](const NewInstance& start) { return StartInstanceWith(sql, start); },
      [](const absl::Status& status, const NewInstance&) {
        return absl::IsFailedPrecondition(status);  // its business key is taken
      },
      // A start refused for its key has written nothing unless it claimed its event.
      [](const NewInstance& start) { return HasEvent(start); });
}

bool StartAgain(const absl::Status& status) {
  return absl::IsAborted(status) && status.message() == kCollectedMeanwhile;
}

}  // namespace waystone
