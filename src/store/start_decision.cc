#include "store/start_decision.h"

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
    return absl::FailedPreconditionError(
        held + " '" + start.key + "' already exists with input hash " +
        held_input_hash.substr(0, 16) + "; this start has input hash " +
        start.input_hash.substr(0, 16) + " (same business key, different input)");
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
