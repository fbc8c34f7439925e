// The dialect-neutral rules of the store, against fakes of their per-dialect
// interfaces (no database): the group commit, takeovers, the gc order, the start,
// and a component that takes one slice of Store.

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "store/business_statement.h"
#include "store/claims.h"
#include "store/gc_order.h"
#include "store/group_commit.h"
#include "store/lease_claims.h"
#include "store/lease_owners.h"
#include "store/relay_rules.h"
#include "store/sql_values.h"
#include "store/start_decision.h"
#include "store/store.h"

namespace waystone {
namespace {

// Records the statements a commit makes; a change to `lost` fails its fence, and
// `broken_step` fails a step update with an I/O error.
class FakeChangeSql final : public ChangeSql {
 public:
  std::vector<std::string> log;
  int64_t lost = -1;
  int broken_step = -1;
  int timed_out_step = -1;  // fails a step update as PostgreSQL's lock timeout does
  std::optional<StoredIdempotencyKey> stored_key;

  absl::Status Savepoint() override { return Note("savepoint"); }
  absl::Status RollbackToSavepoint() override { return Note("rollback"); }
  absl::Status ReleaseSavepoint() override { return Note("release"); }
  absl::StatusOr<bool> Fence(const Change& c) override {
    log.push_back("fence " + std::to_string(c.lease.instance_id));
    return c.lease.instance_id != lost;
  }
  absl::Status SignalWork() override { return Note("signal"); }
  absl::StatusOr<bool> ClaimInbox(const InboxClaim&, int64_t, Millis) override {
    log.push_back("inbox");
    return true;
  }
  absl::Status KeepEvent(int64_t, const KeptEvent&) override { return Note("keep"); }
  absl::StatusOr<bool> TakeKeptEvent(int64_t, const KeptEventTake&, Millis) override {
    log.push_back("take");
    return true;
  }
  absl::Status ResolveAlerts(int64_t, Millis) override { return Note("resolve"); }
  absl::Status ReviseInput(int64_t, const std::string&) override { return Note("revise"); }
  absl::StatusOr<std::optional<StoredIdempotencyKey>> ReadIdempotencyKey(
      const std::string&, const std::string&) override {
    log.push_back("read key");
    return stored_key;
  }
  absl::Status PutIdempotencyKey(const IdempotencyClaim&, Millis) override {
    return Note("put key");
  }
  absl::Status ReserveIdempotencyKey(const IdempotencyClaim&, Millis) override {
    return Note("reserve key");
  }
  absl::StatusOr<std::string> RunStatement(const BusinessStatement& statement) override {
    log.push_back("statement " + statement.sqlite);
    if (statement.sqlite == "bad") return StatementFailure("UNIQUE constraint failed");
    if (statement.sqlite == "busy") return StatementTrouble(absl::AbortedError("lock timeout"));
    return std::string("{\"rows\":[],\"count\":1}");
  }
  absl::Status InsertStep(int64_t, const StepRecord& s) override {
    log.push_back("insert step " + std::to_string(s.index) +
                  (s.response_json.empty() ? "" : " " + s.response_json));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> UpdateStep(int64_t, const StepRecord& s) override {
    log.push_back("step " + std::to_string(s.index) +
                  (s.response_json.empty() ? "" : " " + s.response_json));
    if (s.index == broken_step) return absl::UnavailableError("disk gone");
    if (s.index == timed_out_step) return absl::AbortedError("lock timeout");
    return true;
  }
  absl::Status InsertAttempt(int64_t, const AttemptRecord&) override { return Note("attempt"); }
  absl::Status DropOldAttempts(int64_t, int step_index, int keep) override {
    return Note("drop " + std::to_string(step_index) + " " + std::to_string(keep));
  }
  absl::Status InsertEvent(const EventRecord&, int64_t, Millis) override { return Note("event"); }
  absl::Status InsertAlert(const AlertRecord&, int64_t, Millis) override { return Note("alert"); }
  absl::Status InsertAudit(const AuditRecord&, int64_t, Millis) override { return Note("audit"); }

 private:
  absl::Status Note(const std::string& what) {
    log.push_back(what);
    return absl::OkStatus();
  }
};

Change ChangeOf(int64_t instance_id) {
  Change c;
  c.lease = {instance_id, 1, "w"};
  c.now = 100;
  c.lease_expires_at = 200;
  c.steps.push_back(StepRecord{.index = 0});
  c.events.push_back(EventRecord{});
  return c;
}

TEST(StoreRulesTest, ALostLeaseUndoesOnlyItsOwnChange) {
  FakeChangeSql sql;
  sql.lost = 2;
  auto results = CommitChanges(sql, {ChangeOf(1), ChangeOf(2), ChangeOf(3)}, 1000);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_TRUE((*results)[0].ok());
  EXPECT_TRUE(absl::IsAborted((*results)[1]));
  EXPECT_TRUE((*results)[2].ok());
  // A checkpoint can fail alone only at its fence, before writing: no savepoints.
  const std::vector<std::string> expected = {"fence 1", "step 0", "event", "fence 2",
                                             "fence 3", "step 0", "event"};
  EXPECT_EQ(sql.log, expected);
}

// Without a savepoint, an Aborted that is not the fence's lost lease (PostgreSQL's
// lock timeout answers Aborted too) cannot be undone alone: the whole group fails,
// Unavailable (no lease was lost: its callers reload and go on).
TEST(StoreRulesTest, AnAbortedThatIsNotALostLeaseFailsAGroupWithoutSavepoints) {
  FakeChangeSql sql;
  sql.timed_out_step = 0;
  auto results = CommitChanges(sql, {ChangeOf(1), ChangeOf(2)}, 1000);
  EXPECT_TRUE(absl::IsUnavailable(results.status())) << results.status();
  EXPECT_EQ(sql.log, (std::vector<std::string>{"fence 1", "step 0"}));
  // With a savepoint (an inbox claim) it is rolled back to it, as before.
  FakeChangeSql claimed;
  claimed.timed_out_step = 0;
  Change with_inbox = ChangeOf(1);
  with_inbox.inbox = InboxClaim{"t", "/src", "e-1", "h"};
  auto alone = CommitChanges(claimed, {with_inbox}, 1000);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE(absl::IsAborted((*alone)[0]));
  EXPECT_EQ(claimed.log.front(), "savepoint");
  EXPECT_EQ(claimed.log.back(), "release");
}

TEST(StoreRulesTest, ASqlStepsStatementRunsAfterTheFenceAndItsRowsAreTheStepsResult) {
  FakeChangeSql sql;
  Change good = ChangeOf(1);
  good.statements.push_back(BusinessStatement{0, "insert", "insert", {}, true});
  Change bad = ChangeOf(2);
  bad.statements.push_back(BusinessStatement{0, "bad", "bad", {}, true});
  Change undo = ChangeOf(3);  // a compensation's statement leaves the result alone
  undo.statements.push_back(BusinessStatement{0, "delete", "delete", {}, false});
  auto results = CommitChanges(sql, {good, bad, undo}, 1000);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].ok());
  EXPECT_TRUE(IsStatementFailure((*results)[1])) << (*results)[1];
  EXPECT_TRUE((*results)[2].ok());
  const std::vector<std::string> expected = {
      "savepoint",     "fence 1",          "statement insert", "step 0 {\"rows\":[],\"count\":1}",
      "event",         "release",          "savepoint",        "fence 2",
      "statement bad", "rollback",         "release",          "savepoint",
      "fence 3",       "statement delete", "step 0",           "event",
      "release"};
  EXPECT_EQ(sql.log, expected);

  // The database's own trouble is not the statement's, and never a lost lease (which
  // would undo only its change): the whole group fails.
  FakeChangeSql busy;
  Change troubled = ChangeOf(1);
  troubled.statements.push_back(BusinessStatement{0, "busy", "busy", {}, true});
  EXPECT_TRUE(absl::IsUnavailable(CommitChanges(busy, {troubled, good}, 1000).status()));
}

TEST(StoreRulesTest, AnErrorThatIsNotTheChangesOwnFailsTheWholeGroup) {
  FakeChangeSql sql;
  sql.broken_step = 0;
  auto results = CommitChanges(sql, {ChangeOf(1), ChangeOf(2)}, 1000);
  EXPECT_TRUE(absl::IsUnavailable(results.status())) << results.status();
  EXPECT_EQ(sql.log.back(), "step 0");  // nothing after it: the caller rolls back
  // Under a savepoint (a key claimed), the change is rolled back to it first.
  FakeChangeSql keyed;
  keyed.broken_step = 0;
  Change with_key = ChangeOf(1);
  with_key.idempotency = IdempotencyClaim{"t", "k", "h", 1, "one", 1000};
  EXPECT_TRUE(absl::IsUnavailable(CommitChanges(keyed, {with_key}, 1000).status()));
  EXPECT_EQ(keyed.log.back(), "rollback");
}

TEST(StoreRulesTest, TheFenceComesFirstAndAReleaseToRunNowWakesWorkers) {
  FakeChangeSql sql;
  Change c = ChangeOf(1);
  c.lease_expires_at = 0;
  c.next_run_at = c.now;
  c.inbox = InboxClaim{"t", "s", "e", "h"};
  c.keep = KeptEvent{};
  c.take = KeptEventTake{};
  c.resolve_alerts = true;
  c.idempotency = IdempotencyClaim{"t", "k", "hash", 1, "step", 500};
  // Two attempts of step 2, one of step 0: each step's bound once, after them all.
  c.attempts = {AttemptRecord{.step_index = 2}, AttemptRecord{}, AttemptRecord{.step_index = 2}};
  c.alerts.push_back(AlertRecord{});
  c.audits.push_back(AuditRecord{});
  ASSERT_TRUE(ApplyChange(sql, c, 7).ok());
  const std::vector<std::string> expected = {
      "fence 1",  "signal",   "inbox",  "keep",    "take",    "resolve",
      "read key", "put key",  "step 0", "attempt", "attempt", "attempt",
      "drop 2 7", "drop 0 7", "event",  "alert",   "audit"};
  EXPECT_EQ(sql.log, expected);
}

TEST(StoreRulesTest, AnIdempotencyKeyHeldForAnotherRequestIsAConflictUntilItExpires) {
  const IdempotencyClaim claim{"t", "k", "new-hash", 1, "step", 500};
  EXPECT_TRUE(CheckIdempotencyKey(claim, std::nullopt, 100).ok());
  EXPECT_TRUE(CheckIdempotencyKey(claim, StoredIdempotencyKey{"new-hash", 900}, 100).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CheckIdempotencyKey(claim, StoredIdempotencyKey{"old-hash", 900}, 100)));
  EXPECT_TRUE(CheckIdempotencyKey(claim, StoredIdempotencyKey{"old-hash", 100}, 100).ok());

  FakeChangeSql sql;
  sql.stored_key = StoredIdempotencyKey{"old-hash", 900};
  Change c = ChangeOf(1);
  c.idempotency = claim;
  auto results = CommitChanges(sql, {c}, 1000);
  ASSERT_TRUE(results.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*results)[0]));
}

TEST(StoreRulesTest, ADeliveryIdentityBelongsToTheStepThatClaimedItFirst) {
  IdempotencyClaim claim{"t", "notify:c:t@1:e:email", "hash", 1, "confirm-email", 500};
  claim.exclusive = true;
  const StoredIdempotencyKey mine{"hash", 900, 1, "confirm-email"};
  EXPECT_TRUE(CheckIdempotencyKey(claim, mine, 100).ok()) << "its own retries";
  const StoredIdempotencyKey other_instance{"hash", 900, 2, "confirm-email"};
  const absl::Status taken = CheckIdempotencyKey(claim, other_instance, 100);
  EXPECT_TRUE(absl::IsAlreadyExists(taken)) << taken;
  EXPECT_NE(taken.message().find("belongs to step 'confirm-email' of another instance"),
            std::string::npos);
  EXPECT_TRUE(absl::IsAlreadyExists(
      CheckIdempotencyKey(claim, StoredIdempotencyKey{"hash", 900, 1, "other-step"}, 100)));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CheckIdempotencyKey(claim, StoredIdempotencyKey{"other", 900, 2, "confirm-email"}, 100)))
      << "other content under the identity stays a conflict";
  EXPECT_TRUE(CheckIdempotencyKey(claim, StoredIdempotencyKey{"hash", 100, 2, "x"}, 100).ok())
      << "once it expired";
  StoredIdempotencyKey gave_up = other_instance;
  gave_up.owner_gave_up = true;
  gave_up.request_hash = "other";
  EXPECT_TRUE(CheckIdempotencyKey(claim, gave_up, 100).ok()) << "nothing of the owner's arrived";
  claim.exclusive = false;
  EXPECT_TRUE(CheckIdempotencyKey(claim, other_instance, 100).ok()) << "a shared key";

  // Undone alone: the step is skipped in a change of its own.
  FakeChangeSql sql;
  sql.stored_key = other_instance;
  claim.exclusive = true;
  Change c = ChangeOf(1);
  c.idempotency = claim;
  auto results = CommitChanges(sql, {c}, 1000);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(absl::IsAlreadyExists((*results)[0]));
}

TEST(StoreRulesTest, AReservedDeliveryIsItsReportersToSend) {
  IdempotencyClaim claim{"t", "notify:c:t@1:e:line", "hash", 1, "confirm-line", 500};
  claim.exclusive = true;
  const StoredIdempotencyKey reserved{"", 900, 1, "confirm-line"};
  EXPECT_TRUE(CheckIdempotencyKey(claim, reserved, 100).ok()) << "its owner fills it in";
  const StoredIdempotencyKey theirs{"", 900, 2, "confirm-line"};
  EXPECT_TRUE(IsDeliveryOwned(CheckIdempotencyKey(claim, theirs, 100)))
      << "reserved by another instance: whatever its message will be";
  StoredIdempotencyKey gave_up = theirs;
  gave_up.owner_gave_up = true;
  EXPECT_TRUE(CheckIdempotencyKey(claim, gave_up, 100).ok());
  EXPECT_TRUE(CheckIdempotencyKey(claim, StoredIdempotencyKey{"", 100, 2, "x"}, 100).ok())
      << "expired";

  FakeChangeSql sql;
  Change c = ChangeOf(1);
  c.reservations = {claim, claim};
  auto results = CommitChanges(sql, {c}, 1000);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].ok());
  EXPECT_EQ(std::count(sql.log.begin(), sql.log.end(), "reserve key"), 2);
}

TEST(StoreRulesTest, ARowThatStillNamedAnOwnerIsATakeover) {
  int64_t takeovers = 0;
  const std::vector<Lease> leases =
      LeasesOf({{1, 5, ""}, {2, 7, "dead/1/x"}, {3, 2, ""}}, "me", &takeovers);
  EXPECT_EQ(takeovers, 1);
  ASSERT_EQ(leases.size(), 3u);
  EXPECT_EQ(leases[1], (Lease{2, 7, "me"}));
}

// Records a gc's statements.
class FakeGcSql final : public GcSql {
 public:
  std::vector<std::string> log;
  absl::Status PickCollectable(Millis) override { return Note("pick"); }
  absl::StatusOr<GcReport> CountGarbage(Millis, Millis) override {
    log.push_back("count");
    GcReport report;
    report.instances = 2;
    return report;
  }
  absl::Status DeleteTombstonesBefore(Millis) override { return Note("old tombstones"); }
  absl::Status BuryPicked(Millis) override { return Note("bury"); }
  absl::Status Exec(std::string_view sql) override {
    return Note(std::string(sql.substr(0, sql.find(" WHERE"))));
  }
  absl::Status DeleteInboxClaimsBefore(Millis) override { return Note("inbox"); }
  absl::Status DeleteIdempotencyKeysBefore(Millis) override { return Note("keys"); }
  absl::Status DeleteApiRequestsBefore(Millis) override { return Note("requests"); }

 private:
  absl::Status Note(const std::string& what) {
    log.push_back(what);
    return absl::OkStatus();
  }
};

TEST(StoreRulesTest, GcBuriesBeforeItDeletesAndChildrenGoBeforeParents) {
  FakeGcSql dry;
  auto counted = CollectGarbageWith(dry, 10, 20, 5, /*dry_run=*/true);
  ASSERT_TRUE(counted.ok());
  EXPECT_EQ(counted->tombstones_written, 2);
  EXPECT_EQ(dry.log, (std::vector<std::string>{"pick", "count"}));

  FakeGcSql sql;
  ASSERT_TRUE(CollectGarbageWith(sql, 10, 20, 5, /*dry_run=*/false).ok());
  const std::vector<std::string> expected = {"pick",
                                             "count",
                                             "old tombstones",
                                             "bury",
                                             "DELETE FROM attempts",
                                             "DELETE FROM deliveries",
                                             "DELETE FROM outbox",
                                             "DELETE FROM steps",
                                             "DELETE FROM kept_events",
                                             "DELETE FROM alerts",
                                             "DELETE FROM instances",
                                             "inbox",
                                             "keys",
                                             "requests"};
  EXPECT_EQ(sql.log, expected);
}

// Records a delivery's statements; `held` says whether the claim still holds.
class FakeDeliverySql final : public DeliverySql {
 public:
  bool held = true;
  std::set<int64_t> lost_ids;  // claims whose lease another relay holds now
  bool fail_marks = false;
  bool time_out_marks = false;  // as PostgreSQL's lock timeout: Aborted
  std::vector<std::string> log;
  absl::StatusOr<std::vector<EventRecord>> ReadEvents(const std::vector<int64_t>& seqs) override {
    std::vector<EventRecord> rows;
    for (int64_t seq : seqs) {
      if (seq == 404) continue;  // a missing row
      EventRecord e;
      e.seq = seq;
      e.type = "type-" + std::to_string(seq);
      rows.push_back(e);
    }
    return rows;
  }
  absl::StatusOr<bool> FinishClaimed(const DeliveryClaim& claim, const DeliveryUpdate&) override {
    log.push_back("finish");
    return held && !lost_ids.contains(claim.id);
  }
  absl::Status MarkEventDelivered(int64_t, Millis) override {
    if (fail_marks) return absl::UnavailableError("disk full");
    if (time_out_marks) return absl::AbortedError("lock timeout");
    return Note("mark");
  }
  absl::Status InsertAlert(const AlertRecord&, Millis) override { return Note("alert"); }
  absl::Status InsertEvent(const EventRecord&, Millis) override { return Note("event"); }
  absl::Status DisableSink(const std::string&, const std::string&, Millis) override {
    return Note("disable");
  }

 private:
  absl::Status Note(const std::string& what) {
    log.push_back(what);
    return absl::OkStatus();
  }
};

TEST(StoreRulesTest, ABatchOfDeliveriesSkipsOnlyTheLostLeaseAndStopsAtAnError) {
  DeliveryUpdate delivered;
  delivered.state = DeliveryState::kDelivered;
  DeliveryUpdate retry;
  retry.state = DeliveryState::kPending;
  std::vector<FinishedDelivery> batch(3);
  for (int i = 0; i < 3; ++i) batch[i].claim.id = i + 1;
  batch[0].update = delivered;
  batch[1].update = delivered;
  batch[2].update = retry;
  FakeDeliverySql sql;
  sql.lost_ids = {2};
  auto results = FinishDeliveriesWith(sql, batch);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_TRUE((*results)[0].ok());
  EXPECT_TRUE(absl::IsAborted((*results)[1]));
  EXPECT_TRUE((*results)[2].ok());
  // Marked delivered: the first only (the second's lease was lost, the third is a retry).
  EXPECT_EQ(sql.log, (std::vector<std::string>{"finish", "mark", "finish", "finish"}));

  FakeDeliverySql failing;
  failing.fail_marks = true;
  auto failed = FinishDeliveriesWith(failing, batch);
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_EQ(failing.log, (std::vector<std::string>{"finish"}));  // stopped at the error

  // A lock timeout after the claim was finished is no lost lease: the batch fails
  // (Unavailable), where taking it for one would have committed half a delivery.
  FakeDeliverySql timed_out;
  timed_out.time_out_marks = true;
  auto stopped = FinishDeliveriesWith(timed_out, batch);
  EXPECT_TRUE(absl::IsUnavailable(stopped.status())) << stopped.status();
  EXPECT_EQ(timed_out.log, (std::vector<std::string>{"finish"}));
}

TEST(StoreRulesTest, ASinkDisabledInABatchIsAlertedOnceByTheFirstDisableWritten) {
  DeliveryUpdate gone;
  gone.state = DeliveryState::kPending;
  gone.alert = AlertRecord{};
  gone.alert_event = EventRecord{};
  gone.disable_sink = true;
  std::vector<FinishedDelivery> batch(3);
  for (int i = 0; i < 3; ++i) {
    batch[i].claim.id = i + 1;
    batch[i].claim.sink = "hooks";
    batch[i].update = gone;
  }
  FakeDeliverySql sql;
  sql.lost_ids = {1};  // the first 410's lease was lost: it writes nothing, its alert neither
  auto results = FinishDeliveriesWith(sql, batch);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(absl::IsAborted((*results)[0]));
  EXPECT_EQ(sql.log, (std::vector<std::string>{"finish", "finish", "alert", "event", "disable",
                                               "finish", "disable"}));
}

TEST(StoreRulesTest, ADeliveryEndsUnderItsLeaseAndClaimsComeInOutboxOrder) {
  DeliveryUpdate gone;
  gone.state = DeliveryState::kPending;
  gone.alert = AlertRecord{};
  gone.alert_event = EventRecord{};
  gone.disable_sink = true;
  FakeDeliverySql sql;
  ASSERT_TRUE(FinishDeliveryWith(sql, DeliveryClaim{}, gone).ok());
  EXPECT_EQ(sql.log, (std::vector<std::string>{"finish", "alert", "event", "disable"}));

  FakeDeliverySql lost;
  lost.held = false;
  DeliveryUpdate delivered;
  delivered.state = DeliveryState::kDelivered;
  EXPECT_TRUE(absl::IsAborted(FinishDeliveryWith(lost, DeliveryClaim{}, delivered)));
  EXPECT_EQ(lost.log, (std::vector<std::string>{"finish"}));

  std::vector<DeliveryClaim> claims(3);
  claims[0].event.seq = 9;
  claims[1].event.seq = 2;
  claims[2].event.seq = 5;
  ASSERT_TRUE(CompleteClaims(sql, &claims).ok());
  EXPECT_EQ(claims[0].event.seq, 2);
  EXPECT_EQ(claims[0].event.type, "type-2");  // the row read, not just the seq kept
  EXPECT_EQ(claims[2].event.seq, 9);
  EXPECT_EQ(claims[2].event.type, "type-9");
  claims[1].event.seq = 404;
  EXPECT_TRUE(absl::IsDataLoss(CompleteClaims(sql, &claims)));
}

// A start against rows held in memory.
class FakeStartSql final : public StartSql {
 public:
  std::optional<InstanceRecord> existing;
  std::optional<TombstoneRecord> tombstone;
  std::map<std::string, int64_t> counters;
  std::vector<std::string> log;

  absl::Status fail_insert;  // the next InsertInstance answers this when set
  std::optional<TombstoneRecord> buried_meanwhile;
  bool held_unseen = false;  // the insert finds the key held; no row or tombstone is read

  absl::Status Savepoint() override {
    log.push_back("savepoint");
    return absl::OkStatus();
  }
  absl::Status RollbackToSavepoint() override {
    log.push_back("rollback");
    return absl::OkStatus();
  }
  absl::Status ReleaseSavepoint() override {
    log.push_back("release");
    return absl::OkStatus();
  }
  absl::StatusOr<bool> ClaimStartEvent(const NewInstance&) override { return true; }
  absl::StatusOr<std::optional<InboxEntry>> ReadInbox(const std::string&, const std::string&,
                                                      const std::string&) override {
    return std::nullopt;
  }
  absl::StatusOr<std::optional<InstanceRecord>> InstanceById(int64_t id) override {
    InstanceRecord r;
    r.id = id;
    return r;
  }
  absl::StatusOr<std::optional<InstanceRecord>> InstanceByKey(const std::string&,
                                                              const std::string&) override {
    return existing;
  }
  absl::StatusOr<std::optional<TombstoneRecord>> TombstoneOfInstance(int64_t) override {
    return std::nullopt;
  }
  // Inserts unless `existing` or `tombstone` holds the key; `buried_meanwhile` plays
  // a gc that buried the key while the insert waited.
  absl::StatusOr<Insertion> InsertInstance(const NewInstance&, const std::string&) override {
    log.push_back("insert");
    if (!fail_insert.ok()) return fail_insert;
    Insertion insertion;
    insertion.tombstone = tombstone;
    if (buried_meanwhile) {
      insertion.created = 7;
      insertion.tombstone = buried_meanwhile;
    } else if (!existing && !tombstone && !held_unseen) {
      insertion.created = 7;
    }
    return insertion;
  }
  absl::Status InsertPendingSteps(int64_t, const std::vector<std::string>& names) override {
    log.push_back("steps " + std::to_string(names.size()));
    return absl::OkStatus();
  }
  absl::Status InsertEvent(const EventRecord&, int64_t, Millis) override {
    log.push_back("event");
    return absl::OkStatus();
  }
  absl::Status SignalWork() override { return absl::OkStatus(); }
  absl::Status LinkInbox(const NewInstance&, int64_t) override { return absl::OkStatus(); }
  absl::Status AddToCounter(const std::string& name, int64_t delta) override {
    counters[name] += delta;
    return absl::OkStatus();
  }
};

NewInstance StartOf(const std::string& input_hash) {
  NewInstance in;
  in.tenant = "t";
  in.key = "k";
  in.workflow = "order";
  in.input_hash = input_hash;
  in.step_names = {"a", "b"};
  return in;
}

TEST(StoreRulesTest, AStartCreatesAnswersFromTheExistingInstanceOrFromItsTombstone) {
  FakeStartSql fresh;
  auto created = StartInstanceWith(fresh, StartOf("h1"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->outcome, StartOutcome::kCreated);
  EXPECT_EQ(created->instance.id, 7);
  EXPECT_EQ(fresh.log, (std::vector<std::string>{"insert", "steps 2", "event"}));

  FakeStartSql held;
  held.existing = InstanceRecord{.id = 3, .workflow = "order", .input_hash = "h1"};
  auto existing = StartInstanceWith(held, StartOf("h1"));
  ASSERT_TRUE(existing.ok());
  EXPECT_EQ(existing->outcome, StartOutcome::kExisting);
  EXPECT_TRUE(absl::IsFailedPrecondition(StartInstanceWith(held, StartOf("h2")).status()));

  FakeStartSql buried;
  buried.tombstone = TombstoneRecord{
      .tenant = "t", .workflow = "order", .key = "k", .input_hash = "h1", .instance_id = 3};
  auto collected = StartInstanceWith(buried, StartOf("h1"));
  ASSERT_TRUE(collected.ok());
  EXPECT_EQ(collected->outcome, StartOutcome::kCollected);
  ASSERT_TRUE(collected->tombstone.has_value());
  EXPECT_EQ(collected->instance.id, 3);
  EXPECT_EQ(buried.log, (std::vector<std::string>{"insert"}));  // nothing under a tombstone
  EXPECT_TRUE(absl::IsFailedPrecondition(StartInstanceWith(buried, StartOf("h2")).status()));

  // A gc buried the key while the insert waited: the start runs again, where the
  // tombstone answers it.
  FakeStartSql raced;
  raced.buried_meanwhile = buried.tombstone;
  auto again = StartInstanceWith(raced, StartOf("h1"));
  EXPECT_TRUE(StartAgain(again.status())) << again.status();
  EXPECT_EQ(raced.log, (std::vector<std::string>{"insert"}));

  // The insert found the key held, but what held it was gone by the next read (a gc
  // removed the instance, or the tombstone had expired): the start runs again too.
  FakeStartSql vanished;
  vanished.held_unseen = true;
  auto retried = StartInstanceWith(vanished, StartOf("h1"));
  EXPECT_TRUE(StartAgain(retried.status())) << retried.status();
}

TEST(StoreRulesTest, EnumValuesInSqlAreTheirStoredNumbers) {
  EXPECT_EQ(SqlValue(AlertState::kResolved), "3");
  EXPECT_EQ(SqlRunnableStates(), "(1, 3)");
  EXPECT_EQ(SqlFinishedStates(), "(2, 4, 5, 7)");
  EXPECT_EQ(QuoteEach({"a", "b\"c"}), "\"a\",\"b\\\"c\"");
}

// A component that takes one slice needs a fake of that slice only.
class FakeLeases final : public LeaseStore {
 public:
  std::vector<std::string> expired;
  absl::StatusOr<std::vector<Lease>> ClaimRunnable(const std::string&, Millis, Millis,
                                                   int) override {
    return std::vector<Lease>();
  }
  absl::StatusOr<Lease> ClaimInstance(int64_t, const std::string&, Millis, Millis) override {
    return absl::NotFoundError("none");
  }
  absl::StatusOr<std::vector<std::string>> LeaseOwners(Millis) override {
    return std::vector<std::string>{"elsewhere/1/x"};
  }
  absl::Status ExpireLeases(const std::string& owner) override {
    expired.push_back(owner);
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<Millis>> NextDueTime() override { return std::nullopt; }
};

TEST(StoreRulesTest, TheLeaseReaperNeedsOnlyTheLeaseSlice) {
  FakeLeases leases;
  auto reaped = ReapDeadLocalOwners(leases, 0);
  ASSERT_TRUE(reaped.ok());
  EXPECT_EQ(*reaped, 0);  // an owner on another host is left to lease expiry
  EXPECT_TRUE(leases.expired.empty());
}

TEST(StoreRulesTest, StartsInABatchEachUndoOnlyThemselvesUnlessTheStoreFails) {
  FakeStartSql sql;
  InstanceRecord held;
  held.id = 3;
  held.key = "k";
  held.workflow = "order";
  held.input_hash = "other";
  sql.existing = held;
  // A start whose key another input holds, with an event: its inbox claim was
  // written, so it is refused and rolled back to its own savepoint.
  NewInstance with_event = StartOf("h1");
  with_event.event_source = "crm";
  with_event.event_id = "e1";
  auto batch = StartInstancesWith(sql, {with_event});
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 1u);
  EXPECT_EQ((*batch)[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sql.log.front(), "savepoint");
  EXPECT_NE(std::find(sql.log.begin(), sql.log.end(), "rollback"), sql.log.end());
  EXPECT_EQ(sql.log.back(), "release");

  // Without an event it is refused before it writes anything: no savepoint needed,
  // and the start after it in the batch still gets its own result.
  FakeStartSql plain;
  plain.existing = held;
  auto refused = StartInstancesWith(plain, {StartOf("h1"), StartOf("other")});
  ASSERT_TRUE(refused.ok()) << refused.status();
  ASSERT_EQ(refused->size(), 2u);
  EXPECT_EQ((*refused)[0].status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*refused)[1].ok()) << (*refused)[1].status();
  EXPECT_EQ((*refused)[1]->outcome, StartOutcome::kExisting);
  EXPECT_EQ(std::count(plain.log.begin(), plain.log.end(), "savepoint"), 0);
  EXPECT_EQ(std::count(plain.log.begin(), plain.log.end(), "rollback"), 0);

  // A start that fails for another reason (I/O, busy) fails the whole batch.
  FakeStartSql broken;
  broken.fail_insert = absl::UnavailableError("disk I/O error");
  auto failed = StartInstancesWith(broken, {StartOf("h1"), StartOf("h2")});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);

  // Fresh starts each get their result, in order.
  FakeStartSql fresh;
  auto created = StartInstancesWith(fresh, {StartOf("h1")});
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE((*created)[0].ok()) << (*created)[0].status();
  EXPECT_EQ((*created)[0]->outcome, StartOutcome::kCreated);
}

}  // namespace
}  // namespace waystone
