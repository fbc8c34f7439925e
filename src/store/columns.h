#pragma once

// Store-internal: the column lists both dialects select, and the readers that turn
// one result row into a record, written once. `Row` is a dialect's row view with
// `int64_t Int(int column)` and `std::string Text(int column)`; the column order is
// the list's.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/records.h"

namespace waystone {

inline constexpr char kInstanceColumns[] =
    "id, tenant, business_key, workflow, definition_hash, input_json, input_hash, state, "
    "status_reason, next_run_at, lease_owner, lease_expires_at, lease_epoch, trace_id, "
    "source_event, created_at, updated_at, started_by";

inline constexpr char kStepColumns[] =
    "instance_id, step_index, name, state, attempts, error_class, error_message, external_id, "
    "response_json, idempotency_key, request_hash, resolution, unknowns, lookups, "
    "compensation_attempts, next_attempt_at, started_at, finished_at, span_id, unknown_since";

inline constexpr char kEventColumns[] =
    "seq, event_id, instance_id, tenant, type, payload, created_at";

inline constexpr char kTombstoneColumns[] =
    "tenant, workflow, business_key, input_hash, final_state, external_ids, instance_id, "
    "finished_at, collected_at";

inline constexpr char kTargetControlColumns[] =
    "tenant, target, paused, paused_by, pause_reason, paused_at, next_slot_us, failures, "
    "open_until, probe_until, updated_at";

inline constexpr char kAlertColumns[] =
    "id, instance_id, tenant, step_name, kind, state, message, created_at";

inline constexpr char kAuditColumns[] =
    "seq, at, actor, tenant, instance_id, action, reason, detail";

inline constexpr char kTokenColumns[] =
    "token_hash, name, tenant, role, created_at, revoked_at, expires_at";

// Deliveries `d` joined with their outbox rows `o`.
inline constexpr char kDeliveryColumns[] =
    "d.id, d.outbox_seq, d.sink, d.state, d.attempts, d.next_attempt_at, d.last_error, "
    "d.created_at, d.delivered_at, o.event_id, o.type";

template <typename Row>
InstanceRecord ReadInstance(const Row& r) {
  InstanceRecord i;
  i.id = r.Int(0);
  i.tenant = r.Text(1);
  i.key = r.Text(2);
  i.workflow = r.Text(3);
  i.definition_hash = r.Text(4);
  i.input_json = r.Text(5);
  i.input_hash = r.Text(6);
  i.state = static_cast<InstanceState>(r.Int(7));
  i.status_reason = r.Text(8);
  i.next_run_at = r.Int(9);
  i.lease_owner = r.Text(10);
  i.lease_expires_at = r.Int(11);
  i.lease_epoch = r.Int(12);
  i.trace_id = r.Text(13);
  i.source_event = r.Text(14);
  i.created_at = r.Int(15);
  i.updated_at = r.Int(16);
  i.started_by = r.Text(17);
  return i;
}

template <typename Row>
StepRecord ReadStep(const Row& r) {
  StepRecord s;
  s.instance_id = r.Int(0);
  s.index = static_cast<int>(r.Int(1));
  s.name = r.Text(2);
  s.state = static_cast<StepState>(r.Int(3));
  s.attempts = static_cast<int>(r.Int(4));
  s.error_class = static_cast<ErrorClass>(r.Int(5));
  s.error_message = r.Text(6);
  s.external_id = r.Text(7);
  s.response_json = r.Text(8);
  s.idempotency_key = r.Text(9);
  s.request_hash = r.Text(10);
  s.resolution = static_cast<Resolution>(r.Int(11));
  s.unknowns = static_cast<int>(r.Int(12));
  s.lookups = static_cast<int>(r.Int(13));
  s.compensation_attempts = static_cast<int>(r.Int(14));
  s.next_attempt_at = r.Int(15);
  s.started_at = r.Int(16);
  s.finished_at = r.Int(17);
  s.span_id = r.Text(18);
  s.unknown_since = r.Int(19);
  return s;
}

template <typename Row>
EventRecord ReadEvent(const Row& r) {
  return {r.Int(0), r.Text(1), r.Int(2), r.Text(3), r.Text(4), r.Text(5), r.Int(6)};
}

template <typename Row>
TombstoneRecord ReadTombstone(const Row& r) {
  return {r.Text(0), r.Text(1), r.Text(2), r.Text(3), static_cast<InstanceState>(r.Int(4)),
          r.Text(5), r.Int(6),  r.Int(7),  r.Int(8)};
}

template <typename Row>
AlertRecord ReadAlert(const Row& r) {
  return {r.Int(0),
          r.Int(1),
          r.Text(2),
          r.Text(3),
          static_cast<AlertKind>(r.Int(4)),
          static_cast<AlertState>(r.Int(5)),
          r.Text(6),
          r.Int(7)};
}

// Reads kTargetControlColumns (the calls under way are counted apart).
template <typename Row>
TargetControl ReadTargetControl(const Row& r) {
  TargetControl control;
  control.tenant = r.Text(0);
  control.target = r.Text(1);
  control.paused = r.Int(2) != 0;
  control.paused_by = r.Text(3);
  control.pause_reason = r.Text(4);
  control.paused_at = r.Int(5);
  control.next_slot_us = r.Int(6);
  control.failures = static_cast<int>(r.Int(7));
  control.open_until = r.Int(8);
  control.probe_until = r.Int(9);
  control.updated_at = r.Int(10);
  return control;
}

// Reads kTargetControlColumns followed by the count of the calls under way.
template <typename Row>
TargetControl ReadCountedTargetControl(const Row& r) {
  TargetControl control = ReadTargetControl(r);
  control.calls = static_cast<int>(r.Int(11));
  return control;
}

template <typename Row>
AuditRecord ReadAudit(const Row& r) {
  return {r.Int(0), r.Int(1), r.Text(2), r.Text(3), r.Int(4), r.Text(5), r.Text(6), r.Text(7)};
}

template <typename Row>
TokenRecord ReadToken(const Row& r) {
  return {r.Text(0), r.Text(1), r.Text(2), r.Text(3), r.Int(4), r.Int(5), r.Int(6)};
}

inline constexpr char kAttemptColumns[] =
    "step_index, seq, phase, sent, connection, status, error_class, detail, started_at, "
    "finished_at, worker, lease_epoch";
// PostgreSQL's `sent` is a boolean, read as an integer.
inline constexpr char kPgAttemptColumns[] =
    "step_index, seq, phase, sent::int, connection, status, error_class, detail, started_at, "
    "finished_at, worker, lease_epoch";

// Before every attempt: where a first page starts.
inline constexpr AttemptCursor kNewestAttempt = {INT64_MAX, INT32_MAX, INT32_MAX};

// Per step of an instance ($1): its newest and oldest attempt seq, each by the
// primary key (one index probe, not a scan of the step's rows); 0 when none.
inline constexpr char kCountAttempts[] =
    "SELECT s.step_index, COALESCE((SELECT MAX(a.seq) FROM attempts a WHERE a.instance_id = "
    "s.instance_id AND a.step_index = s.step_index), 0), COALESCE((SELECT MIN(a.seq) FROM "
    "attempts a WHERE a.instance_id = s.instance_id AND a.step_index = s.step_index), 0) FROM "
    "steps s WHERE s.instance_id = $1 ORDER BY s.step_index";

// Returns the counts of the steps that recorded a request.
inline std::vector<StepAttemptCounts> WithAttempts(std::vector<StepAttemptCounts> counts) {
  std::erase_if(counts, [](const StepAttemptCounts& c) { return c.recorded == 0; });
  return counts;
}

// Columns: step_index, seq, phase, sent (as an integer), connection, status,
// error_class, detail, started_at, finished_at, worker, lease_epoch.
template <typename Row>
AttemptRecord ReadAttempt(const Row& r) {
  return {static_cast<int>(r.Int(0)),
          static_cast<int>(r.Int(1)),
          static_cast<AttemptPhase>(r.Int(2)),
          r.Int(3) != 0,
          static_cast<ConnectionUsed>(r.Int(4)),
          static_cast<int>(r.Int(5)),
          static_cast<ErrorClass>(r.Int(6)),
          r.Text(7),
          r.Int(8),
          r.Int(9),
          r.Text(10),
          r.Int(11)};
}

// Columns: seq, event_type, source, event_id, data_json, received_at.
template <typename Row>
KeptEvent ReadKeptEvent(const Row& r) {
  return {r.Int(0), r.Text(1), r.Text(2), r.Text(3), r.Text(4), r.Int(5)};
}

// Columns: step_index, the step's newest attempt seq, its oldest kept seq (both 0
// when it has none). A step's seqs are 1, 2, ... and the bound deletes only the
// oldest, so the newest seq counts every request recorded and the kept ones are
// the seqs from the oldest kept to the newest.
template <typename Row>
StepAttemptCounts ReadAttemptCounts(const Row& r) {
  const int64_t newest = r.Int(1);
  return {static_cast<int>(r.Int(0)), newest, newest == 0 ? 0 : newest - r.Int(2) + 1};
}

template <typename Row>
DeliveryRecord ReadDelivery(const Row& r) {
  return {r.Int(0),
          r.Int(1),
          r.Text(2),
          static_cast<DeliveryState>(r.Int(3)),
          static_cast<int>(r.Int(4)),
          r.Int(5),
          r.Text(6),
          r.Int(7),
          r.Int(8),
          r.Text(9),
          r.Text(10)};
}

// Columns: sink, pending, delivered, parked, failed attempts, oldest pending, disabled.
template <typename Row>
SinkStats ReadSinkStats(const Row& r) {
  return {r.Text(0), r.Int(1), r.Int(2), r.Int(3), r.Int(4), r.Int(5), r.Int(6) != 0};
}

template <typename Row>
StaleUnknown ReadStaleUnknown(const Row& r) {
  return {r.Int(0), r.Text(1), r.Text(2), r.Int(3)};
}

// Reads the summary's counts from one row of the dialect's summary query, whose
// columns are in this order: retries, unknown outcomes, resolved by lookup,
// resubmitted after lookup, compensations, open alerts, outbox events, attempts,
// resolved by operator, compensation attempts, compensation failures, lease
// takeovers, inbox duplicates.
template <typename Row>
void ReadSummaryCounts(const Row& r, StoreSummary* summary) {
  summary->retries = r.Int(0);
  summary->unknown_outcomes = r.Int(1);
  summary->resolved_by_lookup = r.Int(2);
  summary->resubmitted_after_lookup = r.Int(3);
  summary->compensations = r.Int(4);
  summary->open_alerts = r.Int(5);
  summary->outbox_events = r.Int(6);
  summary->attempts = r.Int(7);
  summary->resolved_by_operator = r.Int(8);
  summary->compensation_attempts = r.Int(9);
  summary->compensation_failures = r.Int(10);
  summary->lease_takeovers = r.Int(11);
  summary->inbox_duplicates = r.Int(12);
}

inline constexpr char kBatchColumns[] =
    "id, public_id, tenant, actor, reason, action, action_json, filter_json, state, created_at, "
    "updated_at";

inline constexpr char kBatchItemColumns[] =
    "id, batch_id, instance_id, instance_key, state, result_state, message, owner, "
    "claim_expires_at, tries, applied_at, finished_at, updated_at";

template <typename Row>
BatchRecord ReadBatch(const Row& r) {
  BatchRecord b;
  b.id = r.Int(0);
  b.public_id = r.Text(1);
  b.tenant = r.Text(2);
  b.actor = r.Text(3);
  b.reason = r.Text(4);
  b.action = r.Text(5);
  b.action_json = r.Text(6);
  b.filter_json = r.Text(7);
  b.state = static_cast<BatchState>(r.Int(8));
  b.created_at = r.Int(9);
  b.updated_at = r.Int(10);
  return b;
}

template <typename Row>
BatchItemRecord ReadBatchItem(const Row& r) {
  BatchItemRecord i;
  i.id = r.Int(0);
  i.batch_id = r.Int(1);
  i.instance_id = r.Int(2);
  i.instance_key = r.Text(3);
  i.state = static_cast<BatchItemState>(r.Int(4));
  i.result_state = r.Text(5);
  i.message = r.Text(6);
  i.owner = r.Text(7);
  i.claim_expires_at = r.Int(8);
  i.tries = static_cast<int>(r.Int(9));
  i.applied_at = r.Int(10);
  i.finished_at = r.Int(11);
  i.updated_at = r.Int(12);
  return i;
}

// Sets a batch's counts (every item state, zeros included) and total from the
// (state, count) rows of a GROUP BY over its items.
inline void SetBatchCounts(BatchRecord& batch,
                           const std::vector<std::pair<BatchItemState, int64_t>>& rows) {
  batch.counts.clear();
  batch.total = 0;
  for (int i = 1; i <= 9; ++i) batch.counts.push_back({static_cast<BatchItemState>(i), 0});
  for (const auto& [state, count] : rows) {
    const int index = static_cast<int>(state) - 1;
    if (index >= 0 && index < 9) batch.counts[index].second = count;
    batch.total += count;
  }
}

// Reads a (value, count) row of a GROUP BY over an enum column.
template <typename Enum, typename Row>
std::pair<Enum, int64_t> ReadCountOf(const Row& r) {
  return {static_cast<Enum>(r.Int(0)), r.Int(1)};
}

template <typename Row>
std::string ReadText0(const Row& r) {
  return r.Text(0);
}

}  // namespace waystone
