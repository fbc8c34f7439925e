#include "store/sqlite/sqlite_store.h"

#include <sqlite3.h>

#include <gtest/gtest.h>

#include <thread>

#include "base/sha256.h"
#include "store/migration.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

class SqliteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("w.db");
    store_ = Open();
    ASSERT_TRUE(store_->PutDefinition("defhash", "wf", "wf.yaml", "text", 1).ok());
  }

  std::unique_ptr<SqliteStore> Open() {
    StoreOptions options;
    options.path = path_;
    auto store = SqliteStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  NewInstance Instance(const std::string& key, const std::string& input = R"({"a":1})") {
    NewInstance in;
    in.tenant = "t1";
    in.key = key;
    in.workflow = "wf";
    in.definition_hash = "defhash";
    in.input_json = input;
    in.input_hash = Sha256Hex(input);
    in.trace_id = "trace";
    in.step_names = {"one", "two"};
    in.started_event = {0, "ev-" + key, 0, "t1", "waystone.instance.started", "{}", 0};
    in.now = 1000;
    return in;
  }

  void RawExec(const std::string& sql, int expect_rc) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), expect_rc) << sql;
    sqlite3_free(error);
    sqlite3_close(db);
  }

  testing::TempDir dir_;
  std::string path_;
  std::unique_ptr<SqliteStore> store_;
};

TEST_F(SqliteStoreTest, StartCreatesInstanceStepsAndStartedEvent) {
  auto started = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->outcome, StartOutcome::kCreated);
  EXPECT_EQ(started->instance.state, InstanceState::kRunning);
  auto steps = store_->GetSteps(started->instance.id);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[1].name, "two");
  EXPECT_EQ((*steps)[1].state, StepState::kPending);
  auto events = store_->ListEvents(started->instance.id);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].type, "waystone.instance.started");
}

TEST_F(SqliteStoreTest, SameKeySameInputReturnsExisting) {
  auto first = store_->StartInstance(Instance("k1"));
  auto second = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(second->outcome, StartOutcome::kExisting);
  EXPECT_EQ(second->instance.id, first->instance.id);
  auto events = store_->ListEvents(first->instance.id);
  EXPECT_EQ(events->size(), 1u);
}

TEST_F(SqliteStoreTest, SameKeyDifferentInputIsAConflictNamingBothHashes) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1", R"({"a":1})")).ok());
  auto conflict = store_->StartInstance(Instance("k1", R"({"a":2})"));
  ASSERT_FALSE(conflict.ok());
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(conflict.status().message().find(Sha256Hex(R"({"a":1})").substr(0, 16)),
            std::string::npos);
  EXPECT_NE(conflict.status().message().find(Sha256Hex(R"({"a":2})").substr(0, 16)),
            std::string::npos);
}

TEST_F(SqliteStoreTest, SameEventTwiceHasOneEffect) {
  NewInstance in = Instance("k1");
  in.event_source = "crm";
  in.event_id = "evt-1";
  auto first = store_->StartInstance(in);
  ASSERT_TRUE(first.ok());
  auto again = store_->StartInstance(in);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, StartOutcome::kDuplicateEvent);
  EXPECT_EQ(again->instance.id, first->instance.id);
  auto list = store_->ListInstances({});
  EXPECT_EQ(list->size(), 1u);
}

TEST_F(SqliteStoreTest, ConcurrentIdenticalStartsFromTwoConnectionsMakeOneInstance) {
  auto other = Open();
  std::vector<absl::StatusOr<StartResult>> results(2, absl::UnknownError("not run"));
  std::thread a([&] { results[0] = store_->StartInstance(Instance("same")); });
  std::thread b([&] { results[1] = other->StartInstance(Instance("same")); });
  a.join();
  b.join();
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->instance.id, results[1]->instance.id);
  EXPECT_NE(results[0]->outcome, results[1]->outcome);
  EXPECT_EQ(store_->ListInstances({})->size(), 1u);
}

TEST_F(SqliteStoreTest, ClaimsExcludeLeasedInstancesUntilExpiry) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  auto a = store_->ClaimRunnable("worker-a", 2000, 5000, 10);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].epoch, 1);
  auto b = store_->ClaimRunnable("worker-b", 3000, 5000, 10);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->empty());
  auto after_expiry = store_->ClaimRunnable("worker-b", 7001, 5000, 10);
  ASSERT_TRUE(after_expiry.ok());
  ASSERT_EQ(after_expiry->size(), 1u);
  EXPECT_EQ((*after_expiry)[0].epoch, 2);
}

TEST_F(SqliteStoreTest, NotDueInstancesAreNotClaimed) {
  NewInstance in = Instance("k1");
  in.now = 10'000;
  ASSERT_TRUE(store_->StartInstance(in).ok());
  EXPECT_TRUE(store_->ClaimRunnable("w", 9'999, 5000, 10)->empty());
  EXPECT_EQ(store_->ClaimRunnable("w", 10'000, 5000, 10)->size(), 1u);
}

TEST_F(SqliteStoreTest, StaleLeaseCommitsNothing) {
  auto started = store_->StartInstance(Instance("k1"));
  const int64_t id = started->instance.id;
  Lease old_lease = (*store_->ClaimRunnable("worker-a", 2000, 1000, 10))[0];
  Lease new_lease = (*store_->ClaimRunnable("worker-b", 3001, 5000, 10))[0];

  StepRecord step = (*store_->GetSteps(id))[0];
  step.state = StepState::kCompleted;
  step.external_id = "from-zombie";
  Change stale;
  stale.lease = old_lease;
  stale.now = 3002;
  stale.lease_expires_at = 9000;
  stale.steps.push_back(step);
  stale.events.push_back({0, "zombie-event", id, "t1", "waystone.step.completed", "{}", 0});

  StepRecord good_step = step;
  good_step.external_id = "from-owner";
  Change good = stale;
  good.lease = new_lease;
  good.steps = {good_step};
  good.events = {{0, "owner-event", id, "t1", "waystone.step.completed", "{}", 0}};

  auto results = store_->Commit({stale, good});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].code(), absl::StatusCode::kAborted);
  EXPECT_TRUE((*results)[1].ok());
  EXPECT_EQ((*store_->GetSteps(id))[0].external_id, "from-owner");
  auto events = *store_->ListEvents(id);
  ASSERT_EQ(events.size(), 2u);  // started + the owner's
  EXPECT_EQ(events[1].event_id, "owner-event");
}

TEST_F(SqliteStoreTest, StateChangeAndOutboxCommitTogetherOrNotAtAll) {
  auto started = store_->StartInstance(Instance("k1"));
  const int64_t id = started->instance.id;
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 7000;
  change.state = InstanceState::kCompleted;
  // The second event reuses an id: the change must fail as a whole.
  change.events = {{0, "dup", id, "t1", "a", "{}", 0}, {0, "dup", id, "t1", "b", "{}", 0}};
  auto results = store_->Commit({change});
  EXPECT_FALSE(results.ok());
  EXPECT_EQ(store_->GetInstance(id)->state, InstanceState::kRunning);
  EXPECT_EQ(store_->ListEvents(id)->size(), 1u);
}

TEST_F(SqliteStoreTest, IdempotencyKeyWithAnotherRequestHashIsAConflict) {
  auto started = store_->StartInstance(Instance("k1"));
  const int64_t id = started->instance.id;
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change first;
  first.lease = lease;
  first.now = 2001;
  first.lease_expires_at = 7000;
  first.idempotency = IdempotencyClaim{"t1", "k1:one", "hash-a", id, "one", 100'000};
  ASSERT_TRUE((*store_->Commit({first}))[0].ok());
  Change same = first;
  EXPECT_TRUE((*store_->Commit({same}))[0].ok());
  Change changed = first;
  changed.idempotency->request_hash = "hash-b";
  StepRecord step = (*store_->GetSteps(id))[0];
  step.state = StepState::kRunning;
  changed.steps = {step};
  auto result = (*store_->Commit({changed}))[0];
  EXPECT_EQ(result.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(result.message().find("k1:one"), std::string::npos);
  EXPECT_EQ((*store_->GetSteps(id))[0].state, StepState::kPending);
  EXPECT_EQ((*store_->GetIdempotencyClaim("t1", "k1:one"))->request_hash, "hash-a");
  // After the retention window the key may be reused.
  Change later = changed;
  later.now = 100'001;
  EXPECT_TRUE((*store_->Commit({later}))[0].ok());
}

TEST_F(SqliteStoreTest, AuditLogIsAppendOnly) {
  auto started = store_->StartInstance(Instance("k1"));
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 7000;
  change.audits.push_back({0, 0, "alice", "t1", 0, "retry", "customer called", "{}"});
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  ASSERT_EQ(store_->ListAudit(started->instance.id)->size(), 1u);
  RawExec("UPDATE audit_log SET reason = 'changed'", SQLITE_CONSTRAINT);
  RawExec("DELETE FROM audit_log", SQLITE_CONSTRAINT);
  EXPECT_EQ((*store_->ListAudit(started->instance.id))[0].reason, "customer called");
}

TEST_F(SqliteStoreTest, MigrationsAreIdempotentAndRefuseNewerSchemas) {
  const int newest = sqlite_migrations().back().version;
  EXPECT_GE(newest, 2);
  EXPECT_EQ(*store_->SchemaVersion(), newest);
  store_.reset();
  store_ = Open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(*store_->SchemaVersion(), newest);
  store_.reset();
  RawExec("INSERT INTO schema_migrations VALUES (999, 'future', 0)", SQLITE_OK);
  StoreOptions options;
  options.path = path_;
  auto refused = SqliteStore::Open(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("999"), std::string::npos);
}

TEST_F(SqliteStoreTest, ExpireLeasesFreesADeadOwnersInstances) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  ASSERT_EQ(store_->ClaimRunnable("dead", 2000, 60'000, 10)->size(), 1u);
  EXPECT_EQ(*store_->LeaseOwners(2001), std::vector<std::string>{"dead"});
  EXPECT_TRUE(store_->ClaimRunnable("alive", 2002, 60'000, 10)->empty());
  ASSERT_TRUE(store_->ExpireLeases("dead").ok());
  EXPECT_EQ(store_->ClaimRunnable("alive", 2003, 60'000, 10)->size(), 1u);
}

}  // namespace
}  // namespace waystone
