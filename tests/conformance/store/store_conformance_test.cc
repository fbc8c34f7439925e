// One suite that pins the semantics of every store operation, run on SQLite and
// on PostgreSQL (a private cluster; see tests/support/postgres_cluster.h).

#include <libpq-fe.h>
#include <sqlite3.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "base/sha256.h"
#include "model/sql_statement.h"
#include "store/business_statement.h"
#include "store/claims.h"
#include "store/migration.h"
#include "store/postgres/pg_store.h"
#include "store/sqlite/sqlite_store.h"
#include "store/sqlite/wal_gather_vfs.h"
#include "support/backends.h"
#include "support/postgres_cluster.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using testing::Backend;

class StoreConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kSqlite) {
      path_ = dir_.File("w.db");
    } else {
      path_ = testing::FreshPostgresDatabase();
      ASSERT_FALSE(path_.empty());
    }
    store_ = Open();
    ASSERT_NE(store_, nullptr);
    ASSERT_TRUE(store_->PutDefinition("defhash", "wf", "wf.yaml", "text", 1).ok());
  }

  std::unique_ptr<Store> Open() {
    StoreOptions options;
    options.path = path_;
    auto store = OpenStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  int SchemaVersion() {
    if (auto* sqlite = dynamic_cast<SqliteStore*>(store_.get())) return *sqlite->SchemaVersion();
    return *dynamic_cast<PostgresStore*>(store_.get())->SchemaVersion();
  }

  int NewestMigration() {
    return GetParam() == Backend::kSqlite ? sqlite_migrations().back().version
                                          : postgres_migrations().back().version;
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

  // A start of an instance without steps (a code workflow's), which adds its own.
  NewInstance Stepless(const std::string& key) {
    NewInstance in = Instance(key);
    in.step_names.clear();
    return in;
  }

  // Claims the leases of the two runnable instances `id` and `other`.
  std::pair<Lease, Lease> ClaimBoth(int64_t id, int64_t other) {
    Lease lease, other_lease;
    const std::vector<Lease> claims = *store_->ClaimRunnable("w", 2000, 5000, 10);
    for (const Lease& claimed : claims) {
      if (claimed.instance_id == id) lease = claimed;
      if (claimed.instance_id == other) other_lease = claimed;
    }
    return {lease, other_lease};
  }

  // A created start answers its row as stored, and its steps are pending with nothing
  // recorded: the worker a start was leased to begins from these without reading them.
  void ExpectAnsweredAsStored(const NewInstance& in, const StartResult& started) {
    ASSERT_EQ(started.outcome, StartOutcome::kCreated);
    const int64_t id = started.instance.id;
    auto stored = store_->GetInstance(id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(started.instance, *stored) << in.key;
    auto steps = store_->GetSteps(id);
    ASSERT_TRUE(steps.ok()) << steps.status();
    ASSERT_FALSE(in.step_names.empty());
    ASSERT_EQ(steps->size(), in.step_names.size());
    for (size_t i = 0; i < steps->size(); ++i) {
      StepRecord pending;
      pending.instance_id = id;
      pending.index = static_cast<int>(i);
      pending.name = in.step_names[i];
      pending.state = StepState::kPending;
      EXPECT_EQ((*steps)[i], pending) << in.key << " step " << i;
    }
  }

  // Runs SQL behind the store's back; returns whether the database accepted it.
  bool RawExec(const std::string& sql) {
    if (GetParam() == Backend::kSqlite) {
      sqlite3* db = nullptr;
      EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
      const bool ok = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
      sqlite3_close(db);
      return ok;
    }
    PGconn* conn = PQconnectdb(path_.c_str());
    PGresult* result = PQexec(conn, sql.c_str());
    const bool ok = PQresultStatus(result) == PGRES_COMMAND_OK;
    PQclear(result);
    PQfinish(conn);
    return ok;
  }

  // The single value of `sql`, read behind the store's back; -1 when it fails.
  int64_t RawCount(const std::string& sql) {
    int64_t value = -1;
    if (GetParam() == Backend::kSqlite) {
      sqlite3* db = nullptr;
      EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
      sqlite3_stmt* stmt = nullptr;
      if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
          sqlite3_step(stmt) == SQLITE_ROW) {
        value = sqlite3_column_int64(stmt, 0);
      }
      sqlite3_finalize(stmt);
      sqlite3_close(db);
      return value;
    }
    PGconn* conn = PQconnectdb(path_.c_str());
    PGresult* result = PQexec(conn, sql.c_str());
    if (PQresultStatus(result) == PGRES_TUPLES_OK && PQntuples(result) == 1) {
      value = std::atoll(PQgetvalue(result, 0, 0));
    }
    PQclear(result);
    PQfinish(conn);
    return value;
  }

  testing::TempDir dir_;
  std::string path_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreConformanceTest, StartCreatesInstanceStepsAndStartedEvent) {
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

TEST_P(StoreConformanceTest, SameKeySameInputReturnsExisting) {
  auto first = store_->StartInstance(Instance("k1"));
  auto second = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(second->outcome, StartOutcome::kExisting);
  EXPECT_EQ(second->instance.id, first->instance.id);
  auto events = store_->ListEvents(first->instance.id);
  EXPECT_EQ(events->size(), 1u);
}

TEST_P(StoreConformanceTest, SameKeyDifferentInputIsAConflictThatNamesNoHash) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1", R"({"a":1})")).ok());
  auto conflict = store_->StartInstance(Instance("k1", R"({"a":2})"));
  ASSERT_FALSE(conflict.ok());
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(conflict.status().message().find("another input"), std::string::npos)
      << conflict.status();
  // The plain hash of an input gives a redacted field away to whoever knows the rest
  // of it (the answer goes to tokens that may not see redacted values).
  for (const char* input : {R"({"a":1})", R"({"a":2})"}) {
    EXPECT_EQ(conflict.status().message().find(Sha256Hex(input).substr(0, 8)), std::string::npos)
        << conflict.status();
  }
}

TEST_P(StoreConformanceTest, StartsInOneBatchAreEachAsIfAlone) {
  // In one transaction: a new key, the same start again, the same key with other
  // input, and another new key. Each answers as StartInstance would, in order.
  NewInstance other = Instance("k2");
  other.started_event.event_id = "ev-k2";
  auto batch =
      store_->StartInstances({Instance("k1"), Instance("k1"), Instance("k1", R"({"a":2})"), other});
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 4u);
  ASSERT_TRUE((*batch)[0].ok()) << (*batch)[0].status();
  EXPECT_EQ((*batch)[0]->outcome, StartOutcome::kCreated);
  ASSERT_TRUE((*batch)[1].ok()) << (*batch)[1].status();
  EXPECT_EQ((*batch)[1]->outcome, StartOutcome::kExisting);
  EXPECT_EQ((*batch)[1]->instance.id, (*batch)[0]->instance.id);
  EXPECT_EQ((*batch)[2].status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*batch)[3].ok()) << (*batch)[3].status();
  EXPECT_EQ((*batch)[3]->outcome, StartOutcome::kCreated);
  // What is stored: two instances, each with its steps and one started event; the
  // refused start left nothing.
  for (int i : {0, 3}) {
    const int64_t id = (*batch)[i]->instance.id;
    EXPECT_EQ(store_->GetSteps(id)->size(), 2u);
    EXPECT_EQ(store_->ListEvents(id)->size(), 1u);
  }
  auto stored = store_->FindInstance("t1", "k1");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->input_hash, Sha256Hex(R"({"a":1})"));
}

// Leased starts group-committed in one transaction (one with an event, under its own
// savepoint; one refused for its key between them): each created one answers its row
// as stored and its steps pending, as a start alone does.
TEST_P(StoreConformanceTest, LeasedStartsInOneBatchAnswerTheirRowsAsStored) {
  std::vector<NewInstance> starts = {Instance("k1"), Instance("k2"), Instance("k1", R"({"a":2})"),
                                     Instance("k3")};
  starts[1].event_source = "crm";
  starts[1].event_id = "evt-2";
  starts[1].event_data_hash = starts[1].input_hash;
  starts[3].step_names = {"one", "two", "three"};
  for (NewInstance& in : starts) {
    in.lease_owner = "worker-a";
    in.lease_expires_at = 6000;
  }
  auto batch = store_->StartInstances(starts);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), starts.size());
  EXPECT_EQ((*batch)[2].status().code(), absl::StatusCode::kFailedPrecondition);
  for (int i : {0, 1, 3}) {
    ASSERT_TRUE((*batch)[i].ok()) << (*batch)[i].status();
    EXPECT_EQ((*batch)[i]->instance.lease_owner, "worker-a");
    EXPECT_EQ((*batch)[i]->instance.lease_epoch, 1);
    ASSERT_NO_FATAL_FAILURE(ExpectAnsweredAsStored(starts[i], *(*batch)[i]));
  }
}

TEST_P(StoreConformanceTest, SameEventTwiceHasOneEffect) {
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

TEST_P(StoreConformanceTest, ConcurrentIdenticalStartsFromTwoConnectionsMakeOneInstance) {
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

TEST_P(StoreConformanceTest, ClaimsExcludeLeasedInstancesUntilExpiry) {
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

// A start with a worker of its own free: created leased to that worker, which commits
// under the lease with no claim; nobody else claims it before the lease runs out.
TEST_P(StoreConformanceTest, AStartCanCreateItsInstanceLeasedToItsOwnWorker) {
  NewInstance in = Instance("k1");
  in.lease_owner = "worker-a";
  in.lease_expires_at = 6000;
  auto started = store_->StartInstance(in);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_EQ(started->outcome, StartOutcome::kCreated);
  const int64_t id = started->instance.id;
  EXPECT_EQ(started->instance.lease_owner, "worker-a");
  EXPECT_EQ(started->instance.lease_epoch, 1);
  EXPECT_EQ(started->instance.lease_expires_at, 6000);
  ASSERT_NO_FATAL_FAILURE(ExpectAnsweredAsStored(in, *started));
  EXPECT_TRUE(store_->ClaimRunnable("worker-b", 5999, 5000, 10)->empty());

  StepRecord step = (*store_->GetSteps(id))[0];
  step.state = StepState::kCompleted;
  Change change;
  change.lease = {id, 1, "worker-a"};
  change.now = 2000;
  change.lease_expires_at = 0;  // lets go
  change.steps.push_back(step);
  auto results = store_->Commit({change});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0];
  EXPECT_EQ((*store_->GetSteps(id))[0].state, StepState::kCompleted);
  auto next = store_->ClaimRunnable("worker-b", 2001, 5000, 10);
  ASSERT_EQ(next->size(), 1u);
  EXPECT_EQ((*next)[0].epoch, 2);

  // A start that finds the instance leaves its lease alone; one without an owner is
  // created for any worker.
  auto again = store_->StartInstance(in);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, StartOutcome::kExisting);
  EXPECT_EQ(again->instance.lease_owner, "worker-b");
  auto plain = store_->StartInstance(Instance("k2"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->instance.lease_owner, "");
  EXPECT_EQ(plain->instance.lease_epoch, 0);
}

TEST_P(StoreConformanceTest, NotDueInstancesAreNotClaimed) {
  NewInstance in = Instance("k1");
  in.now = 10'000;
  ASSERT_TRUE(store_->StartInstance(in).ok());
  EXPECT_TRUE(store_->ClaimRunnable("w", 9'999, 5000, 10)->empty());
  EXPECT_EQ(store_->ClaimRunnable("w", 10'000, 5000, 10)->size(), 1u);
}

TEST_P(StoreConformanceTest, StaleLeaseCommitsNothing) {
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

// With one writer, a batch of starts and a batch of changes share one transaction:
// each start and each change answers as it would in its own batch (a refused key
// and a lost lease undo only themselves), and what is stored is the same.
TEST_P(StoreConformanceTest, StartsAndChangesInOneTransactionAnswerAsInTheirOwn) {
  if (!store_->OneWriter()) {
    EXPECT_TRUE(absl::IsUnimplemented(store_->StartAndCommit({Instance("x")}, {}).status()));
    EXPECT_FALSE(store_->FindInstance("t1", "x").ok());
    return;
  }
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  Lease old_lease = (*store_->ClaimRunnable("worker-a", 2000, 1000, 10))[0];
  Lease lease = (*store_->ClaimRunnable("worker-b", 3001, 5000, 10))[0];
  const int64_t id = lease.instance_id;
  StepRecord step = (*store_->GetSteps(id))[0];
  step.state = StepState::kCompleted;
  step.external_id = "from-owner";
  Change good;
  good.lease = lease;
  good.now = 3002;
  good.lease_expires_at = 9000;
  good.steps = {step};
  good.events = {{0, "owner-event", id, "t1", "waystone.step.completed", "{}", 0}};
  Change stale = good;
  stale.lease = old_lease;
  stale.steps[0].external_id = "from-zombie";
  stale.events = {{0, "zombie-event", id, "t1", "waystone.step.completed", "{}", 0}};

  auto committed = store_->StartAndCommit(
      {Instance("k2"), Instance("k1", R"({"a":2})"), Instance("k3")}, {stale, good});
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_EQ(committed->started.size(), 3u);
  ASSERT_TRUE(committed->started[0].ok()) << committed->started[0].status();
  EXPECT_EQ(committed->started[1].status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(committed->started[2].ok()) << committed->started[2].status();
  for (int i : {0, 2}) {
    const NewInstance in = Instance(i == 0 ? "k2" : "k3");
    ASSERT_NO_FATAL_FAILURE(ExpectAnsweredAsStored(in, *committed->started[i]));
    EXPECT_EQ(store_->ListEvents(committed->started[i]->instance.id)->size(), 1u);
  }
  ASSERT_EQ(committed->applied.size(), 2u);
  EXPECT_EQ(committed->applied[0].code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(committed->applied[1].ok()) << committed->applied[1];
  EXPECT_EQ((*store_->GetSteps(id))[0].external_id, "from-owner");
  auto events = *store_->ListEvents(id);
  ASSERT_EQ(events.size(), 2u);  // started + the owner's
  EXPECT_EQ(events[1].event_id, "owner-event");
  EXPECT_EQ(store_->FindInstance("t1", "k1")->input_hash, Sha256Hex(R"({"a":1})"));
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM instances"), 3);
}

TEST_P(StoreConformanceTest, StateChangeAndOutboxCommitTogetherOrNotAtAll) {
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

// Counts rows behind the store's back (its own connection).
// A sql step's statement commits with the step's checkpoint: the row, the step's
// result and its event together; a statement that fails writes nothing of its
// change while the rest of the batch commits; a lost lease runs no statement.
TEST_P(StoreConformanceTest, ASqlStepsStatementCommitsWithItsCheckpointOrNotAtAll) {
  const bool sqlite = GetParam() == Backend::kSqlite;
  ASSERT_TRUE(RawExec(sqlite ? "CREATE TABLE orders (id INTEGER PRIMARY KEY, order_key TEXT "
                               "UNIQUE NOT NULL, amount REAL CHECK (amount > 0), note TEXT)"
                             : "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, order_key TEXT "
                               "UNIQUE NOT NULL, amount NUMERIC CHECK (amount > 0), note TEXT)"));
  auto statement = ParseSqlStatement(
      "INSERT INTO orders (order_key, amount, note) VALUES (:key, :amount, :note) "
      "RETURNING id, order_key, amount, note");
  ASSERT_TRUE(statement.ok()) << statement.status();
  auto insert = [&](const std::string& key, const std::string& amount) {
    return BusinessStatement{0,
                             statement->sqlite,
                             statement->postgres,
                             {{SqlParam::Kind::kText, key},
                              {SqlParam::Kind::kReal, amount},
                              {SqlParam::Kind::kNull, ""}},
                             true};
  };
  std::vector<int64_t> ids;
  std::vector<Change> changes;
  for (const std::string key : {"good", "bad", "stale"}) {
    const int64_t id = store_->StartInstance(Instance(key))->instance.id;
    ids.push_back(id);
  }
  auto leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 3u);
  for (size_t i = 0; i < leases.size(); ++i) {
    Change change;
    change.lease = leases[i];
    change.now = 2001;
    change.lease_expires_at = 7000;
    StepRecord step = (*store_->GetSteps(leases[i].instance_id))[0];
    step.state = StepState::kCompleted;
    change.steps = {step};
    change.events = {{0, "done-" + std::to_string(i), leases[i].instance_id, "t1",
                      "waystone.step.completed", "{}", 0}};
    changes.push_back(change);
  }
  changes[0].statements = {insert("good", "12.5")};
  changes[1].statements = {insert("bad", "-1")};  // the CHECK refuses it
  changes[2].statements = {insert("stale", "3")};
  changes[2].lease.epoch += 1;  // not the lease it holds: nothing may run

  auto results = store_->Commit(changes);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0];
  EXPECT_TRUE(IsStatementFailure((*results)[1])) << (*results)[1];
  std::string refused((*results)[1].message());
  std::transform(refused.begin(), refused.end(), refused.begin(), ::tolower);
  EXPECT_NE(refused.find("check"), std::string::npos) << refused;
  EXPECT_TRUE(absl::IsAborted((*results)[2])) << (*results)[2];

  auto first = *store_->GetSteps(leases[0].instance_id);
  EXPECT_EQ(first[0].state, StepState::kCompleted);
  EXPECT_EQ(first[0].response_json,
            R"({"rows":[{"id":1,"order_key":"good","amount":12.5,"note":null}],"count":1})");
  for (int i : {1, 2}) {
    EXPECT_EQ((*store_->GetSteps(leases[i].instance_id))[0].state, StepState::kPending) << i;
    EXPECT_EQ(store_->ListEvents(leases[i].instance_id)->size(), 1u) << i;  // started only
  }
  // Only the good row, counted on a connection of the test's own.
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders"), 1);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders WHERE order_key = 'good' AND amount = 12.5"), 1);

  // A statement of the wrong shape for the table fails its change alone, too.
  auto missing = ParseSqlStatement("UPDATE no_such_table SET a = :a");
  ASSERT_TRUE(missing.ok());
  Change again = changes[1];
  again.statements = {BusinessStatement{
      0, missing->sqlite, missing->postgres, {{SqlParam::Kind::kInteger, "1"}}, true}};
  auto missing_result = store_->Commit({again});
  ASSERT_TRUE(missing_result.ok()) << missing_result.status();
  EXPECT_TRUE(IsStatementFailure((*missing_result)[0])) << (*missing_result)[0];
  EXPECT_NE((*missing_result)[0].message().find("no_such_table"), std::string::npos);
}

// A code workflow's work (Change::work) runs in its change's transaction after the
// fence: its statements' rows, the step row the change adds (with the work's result),
// the events it emits and the change's own commit together; a work that fails (its own
// error, or a statement the database refuses, after which nothing more runs) writes
// nothing of its change while the rest of the batch commits.
class InsertWork final : public BusinessWork {
 public:
  InsertWork(std::string key, std::string amount, bool fail_after)
      : key_(std::move(key)), amount_(std::move(amount)), fail_after_(fail_after) {}
  int step_index() const override { return 0; }
  absl::StatusOr<BusinessWorkResult> Run(StatementRunner& sql) const override {
    auto insert = ParseSqlStatement(
        "INSERT INTO orders (order_key, amount) VALUES (:key, :amount) RETURNING order_key");
    if (!insert.ok()) return insert.status();
    auto rows =
        sql.Run(BusinessStatement{0,
                                  insert->sqlite,
                                  insert->postgres,
                                  {{SqlParam::Kind::kText, key_}, {SqlParam::Kind::kReal, amount_}},
                                  true});
    // A refused statement is ignored here: the store fails the work all the same, and
    // the statement after it does not run.
    auto second = sql.Run(
        BusinessStatement{0,
                          insert->sqlite,
                          insert->postgres,
                          {{SqlParam::Kind::kText, key_ + "-2"}, {SqlParam::Kind::kReal, "1"}},
                          true});
    if (fail_after_) return absl::FailedPreconditionError("the program says no");
    BusinessWorkResult done;
    done.result_json = rows.ok() ? *rows : "{}";
    done.events.push_back({0, "work-" + key_, 0, "t1", "shop.order.recorded", "{}", 0});
    return done;
  }

 private:
  std::string key_, amount_;
  bool fail_after_;
};

TEST_P(StoreConformanceTest, ACodeWorkflowsTransactionCommitsWithTheStepRowItAdds) {
  const bool sqlite = GetParam() == Backend::kSqlite;
  ASSERT_TRUE(RawExec(sqlite ? "CREATE TABLE orders (id INTEGER PRIMARY KEY, order_key TEXT "
                               "UNIQUE NOT NULL, amount REAL CHECK (amount > 0))"
                             : "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, order_key TEXT "
                               "UNIQUE NOT NULL, amount NUMERIC CHECK (amount > 0))"));
  for (const std::string key : {"good", "refused", "said-no"}) {
    NewInstance code = Instance(key);
    code.step_names.clear();  // a code workflow's rows come as its function asks
    ASSERT_TRUE(store_->StartInstance(code).ok());
  }
  auto leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 3u);
  std::vector<Change> changes;
  const std::pair<const char*, const char*> works[] = {
      {"good", "5"}, {"refused", "-1"}, {"said-no", "2"}};
  for (size_t i = 0; i < leases.size(); ++i) {
    Change change;
    change.lease = leases[i];
    change.now = 2001;
    change.lease_expires_at = 7000;
    StepRecord row;
    row.index = 0;
    row.name = "record-order";
    row.state = StepState::kCompleted;
    row.attempts = 1;
    change.added_steps = {row};
    change.work = std::make_shared<InsertWork>(works[i].first, works[i].second, i == 2);
    changes.push_back(change);
  }
  auto results = store_->Commit(changes);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0];
  EXPECT_TRUE(IsStatementFailure((*results)[1])) << (*results)[1];
  EXPECT_TRUE(IsStatementFailure((*results)[2])) << (*results)[2];
  EXPECT_NE((*results)[2].message().find("the program says no"), std::string::npos);

  auto good = *store_->GetSteps(leases[0].instance_id);
  ASSERT_EQ(good.size(), 1u);
  EXPECT_EQ(good[0].name, "record-order");
  EXPECT_EQ(good[0].state, StepState::kCompleted);
  EXPECT_EQ(good[0].response_json, R"({"rows":[{"order_key":"good"}],"count":1})");
  auto events = *store_->ListEvents(leases[0].instance_id);
  ASSERT_EQ(events.size(), 2u);  // started, and the work's own
  EXPECT_EQ(events[1].type, "shop.order.recorded");
  for (int i : {1, 2}) {
    EXPECT_TRUE(store_->GetSteps(leases[i].instance_id)->empty()) << i;
    EXPECT_EQ(store_->ListEvents(leases[i].instance_id)->size(), 1u) << i;
  }
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders"), 2);  // good and good-2
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders WHERE order_key LIKE 'refused%'"), 0);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders WHERE order_key LIKE 'said-no%'"), 0);
}

// The statement and the rest of its change are one: when the change fails after the
// statement ran (here: a step row that does not exist), its row is not written either,
// and a failing statement (one that cannot even be prepared) leaves the change after it
// in the same transaction to commit.
TEST_P(StoreConformanceTest, ASqlStepsRowGoesWithItsWholeChangeAndAFailedPrepareSparesTheNext) {
  const bool sqlite = GetParam() == Backend::kSqlite;
  ASSERT_TRUE(RawExec(sqlite ? "CREATE TABLE orders (id INTEGER PRIMARY KEY, k TEXT)"
                             : "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, k TEXT)"));
  auto insert = ParseSqlStatement("INSERT INTO orders (k) VALUES (:k)");
  auto missing = ParseSqlStatement("INSERT INTO no_such_table (k) VALUES (:k)");
  ASSERT_TRUE(insert.ok() && missing.ok());
  for (const std::string key : {"a", "b", "c"})
    ASSERT_TRUE(store_->StartInstance(Instance(key)).ok());
  auto leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 3u);
  auto change_of = [&](const Lease& lease, const SqlStatement& statement, const std::string& k) {
    Change change;
    change.lease = lease;
    change.now = 2001;
    change.lease_expires_at = 7000;
    StepRecord step = (*store_->GetSteps(lease.instance_id))[0];
    step.state = StepState::kCompleted;
    change.steps = {step};
    change.statements = {BusinessStatement{
        0, statement.sqlite, statement.postgres, {{SqlParam::Kind::kText, k}}, true}};
    return change;
  };
  Change broken = change_of(leases[0], *insert, "lost");
  broken.steps[0].index = 7;  // no such step: the change fails after its statement ran
  auto whole = store_->Commit({broken});
  EXPECT_FALSE(whole.ok() && (*whole)[0].ok());
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders"), 0);

  auto results =
      store_->Commit({change_of(leases[1], *missing, "x"), change_of(leases[2], *insert, "kept")});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(IsStatementFailure((*results)[0])) << (*results)[0];
  EXPECT_TRUE((*results)[1].ok()) << (*results)[1];
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM orders WHERE k = 'kept'"), 1);
  EXPECT_EQ((*store_->GetSteps(leases[2].instance_id))[0].state, StepState::kCompleted);
}

// The write system calls this process made so far (/proc/self/io's syscw).
int64_t WriteCalls() {
  std::ifstream io("/proc/self/io");
  std::string field;
  int64_t value = 0;
  while (io >> field >> value) {
    if (field == "syscw:") return value;
  }
  ADD_FAILURE() << "no syscw in /proc/self/io";
  return -1;
}

// Where every commit syncs (synchronous FULL, the default), a commit's WAL frames
// reach the file in a few writes, not two per page (SQLite writes a frame's header
// and its page apart). They are not gathered with NORMAL, where commits do not sync,
// nor with power-safe overwrite off (`?psow=0`), where SQLite pads a commit to a
// sector after its sync. What is written is the same: another connection, and the
// store opened again, read every start back.
TEST_P(StoreConformanceTest, OnSqliteACommitsWalFramesReachTheFileInAFewWrites) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "SQLite's WAL";
  std::vector<NewInstance> starts;
  const std::string input = R"({"note":")" + std::string(1500, 'x') + R"("})";
  for (int i = 0; i < 40; ++i) starts.push_back(Instance("many-" + std::to_string(i), input));
  std::map<std::string, int64_t> writes;
  for (const std::string variant : {"FULL", "NORMAL", "FULL-psow0"}) {
    StoreOptions options;
    const std::string file = dir_.File(variant + ".db");
    options.path = variant == "FULL-psow0" ? "file:" + file + "?psow=0" : file;
    options.synchronous = variant == "NORMAL" ? "NORMAL" : "FULL";
    auto store = OpenStore(options);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutDefinition("defhash", "wf", "wf.yaml", "text", 1).ok());
    const int64_t before = WriteCalls();
    auto started = (*store)->StartInstances(starts);
    writes[variant] = WriteCalls() - before;
    ASSERT_TRUE(started.ok()) << started.status();
    for (const auto& one : *started) ASSERT_TRUE(one.ok()) << one.status();
    path_ = file;
    EXPECT_EQ(RawCount("SELECT COUNT(*) FROM instances"), 40) << variant;
    EXPECT_EQ(RawCount("SELECT COUNT(*) FROM steps"), 80) << variant;
    store->reset();
    auto again = OpenStore(options);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ((*again)->ListInstances({})->size(), 40u) << variant;
  }
  // 40 instances of 1.5 KB, 80 steps and 40 events: dozens of pages, two writes each
  // when not gathered.
  EXPECT_GE(writes["NORMAL"], 40);
  EXPECT_LE(writes["FULL"] * 5, writes["NORMAL"])
      << "FULL: " << writes["FULL"] << " writes, NORMAL: " << writes["NORMAL"];
  EXPECT_GE(writes["FULL-psow0"], writes["NORMAL"])
      << "psow=0: " << writes["FULL-psow0"] << " writes, NORMAL: " << writes["NORMAL"];
}

// Runs `sql` (one or more statements) on `db`; a failure fails the test, naming the SQL.
void ExecOn(sqlite3* db, const std::string& sql) {
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << (error != nullptr ? error : "");
  sqlite3_free(error);
}

// The first column of the first row of `sql` on `db`, as text; SQLite's message when
// there is none.
std::string FirstText(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* statement = nullptr;
  std::string out;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr) != SQLITE_OK) {
    return std::string("prepare: ") + sqlite3_errmsg(db);
  }
  if (const int rc = sqlite3_step(statement); rc == SQLITE_ROW) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
  } else {
    out = std::string("step: ") + sqlite3_errmsg(db);
  }
  sqlite3_finalize(statement);
  return out;
}

// A transaction bigger than the page cache writes ("spills") frames to the WAL before
// it commits; rolled back, it leaves them past the WAL's end for the next writer to
// overwrite. Gathered and not yet written when the write lock is handed over, they
// would later land on that writer's committed frames. Here, from an emptied WAL, a
// connection through the gathering VFS spills ~20 frames (less than it gathers at
// once) and rolls back; a plain connection commits rows over the same stretch of the
// WAL; the first writes again; a third connection, and a checkpoint into the database
// file, find every row intact.
TEST_P(StoreConformanceTest, OnSqliteARolledBackSpillNeverLandsOnTheNextWritersFrames) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "SQLite's WAL";
  ASSERT_TRUE(RegisterWalGatherVfs());
  const std::string file = dir_.File("spill.db");
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  auto open = [&](const char* vfs) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(file.c_str(), &db, flags, vfs), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    return db;
  };
  sqlite3* gathering = open(kWalGatherVfs);
  ExecOn(gathering,
         "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA cache_size=4; "
         "CREATE TABLE spilled (id INTEGER PRIMARY KEY, v BLOB); "
         "CREATE TABLE kept (id INTEGER PRIMARY KEY, v TEXT)");
  sqlite3* plain = open(nullptr);
  ExecOn(plain, "PRAGMA synchronous=FULL");
  for (int round = 0; round < 3; ++round) {
    // From an empty WAL, so that the rollback reads no page back from it (a read would
    // write what was gathered while the write lock is still held).
    ExecOn(plain, "PRAGMA wal_checkpoint(TRUNCATE)");
    ExecOn(gathering,
           "BEGIN; WITH RECURSIVE n(value) AS (SELECT 1 UNION ALL SELECT value + 1 "
           "FROM n WHERE value < 25) INSERT INTO spilled (v) SELECT randomblob(3000) "
           "FROM n; ROLLBACK");
    ExecOn(plain,
           "WITH RECURSIVE n(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM n "
           "WHERE value < 60) INSERT INTO kept (v) SELECT printf('%0900d', value) FROM n");
    ExecOn(gathering, "INSERT INTO spilled VALUES (NULL, x'00')");
  }
  sqlite3* reader = open(nullptr);
  EXPECT_EQ(FirstText(reader, "SELECT COUNT(*) || ' ' || SUM(LENGTH(v)) FROM kept"), "180 162000");
  EXPECT_EQ(FirstText(reader, "SELECT COUNT(*) FROM spilled"), "3");
  EXPECT_EQ(FirstText(reader, "PRAGMA integrity_check"), "ok");
  ExecOn(reader, "PRAGMA wal_checkpoint(TRUNCATE)");
  for (sqlite3* db : {gathering, plain, reader}) sqlite3_close(db);
  sqlite3* again = open(nullptr);
  EXPECT_EQ(FirstText(again, "SELECT COUNT(*) || ' ' || SUM(LENGTH(v)) FROM kept"), "180 162000");
  EXPECT_EQ(FirstText(again, "PRAGMA integrity_check"), "ok");
  sqlite3_close(again);
}

// A commit whose WAL frames cannot all be written (here the process may not grow a file
// past a limit: RLIMIT_FSIZE, its SIGXFSZ ignored) fails as a whole and leaves nothing
// of itself, gathered or not: another connection, `PRAGMA integrity_check` and the
// store opened again find exactly what committed before, and the next commit works.
TEST_P(StoreConformanceTest, OnSqliteACommitThatCannotBeWrittenFailsAndLeavesNothing) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "SQLite's WAL";
  const std::string input = R"({"note":")" + std::string(1500, 'x') + R"("})";
  auto batch = [&](const std::string& prefix) {
    std::vector<NewInstance> starts;
    for (int i = 0; i < 40; ++i) starts.push_back(Instance(prefix + std::to_string(i), input));
    return starts;
  };
  ASSERT_TRUE(store_->PutDefinition("defhash", "wf", "wf.yaml", "text", 1).ok());
  auto first = store_->StartInstances(batch("before-"));
  ASSERT_TRUE(first.ok()) << first.status();

  const auto wal_size = std::filesystem::file_size(path_ + "-wal");
  struct rlimit before {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = before;
  limited.rlim_cur = static_cast<rlim_t>(wal_size + 16 * 1024);  // a few frames more
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  auto refused = store_->StartInstances(batch("refused-"));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, old_handler);
  bool any_failed = !refused.ok();
  if (refused.ok()) {
    for (const auto& one : *refused) any_failed = any_failed || !one.ok();
  }
  EXPECT_TRUE(any_failed) << "40 starts of 1.5 KB each fit in 16 KiB of WAL?";

  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM instances WHERE business_key LIKE 'refused-%'"), 0);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM instances"), 40);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM steps"), 80);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"),
            1);
  auto after = store_->StartInstances(batch("after-"));
  ASSERT_TRUE(after.ok()) << after.status();
  for (const auto& one : *after) EXPECT_TRUE(one.ok()) << one.status();
  store_.reset();
  StoreOptions options;
  options.path = path_;
  auto again = OpenStore(options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->ListInstances({})->size(), 80u);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM instances WHERE business_key LIKE 'refused-%'"), 0);
}

// A database opened without locks (`?nolock=1`) answers through the gathering VFS as
// through the default one: SQLite keeps its rollback journal, even in exclusive locking
// mode, and the rows written are read back.
TEST_P(StoreConformanceTest, OnSqliteADatabaseWithoutSharedMemoryWorksThroughTheGatheringVfs) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "SQLite's WAL";
  ASSERT_TRUE(RegisterWalGatherVfs());
  std::map<std::string, std::string> modes;
  for (const char* vfs : {static_cast<const char*>(nullptr), kWalGatherVfs}) {
    const std::string name = vfs == nullptr ? "default" : "gathering";
    const std::string uri = "file:" + dir_.File(name + ".db") + "?nolock=1";
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open_v2(uri.c_str(), &db,
                              SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI, vfs),
              SQLITE_OK);
    std::string answers;
    for (const char* pragma :
         {"PRAGMA journal_mode=WAL", "PRAGMA locking_mode=EXCLUSIVE", "PRAGMA journal_mode=WAL"}) {
      answers += FirstText(db, pragma) + " ";
    }
    ExecOn(db, "CREATE TABLE IF NOT EXISTS t (v TEXT); INSERT INTO t VALUES ('x')");
    answers += FirstText(db, "SELECT COUNT(*) FROM t") + " ";
    modes[name] = answers;
    sqlite3_close(db);
  }
  // Without shared memory SQLite keeps its rollback journal, through either VFS.
  EXPECT_EQ(modes["default"], "delete exclusive delete 1 ");
  EXPECT_EQ(modes["gathering"], modes["default"]);
}

// Past the definition's lint (a statement built by hand), SQLite's authorizer still
// refuses Waystone's tables and anything but reading and writing rows. On PostgreSQL
// the lint is the boundary (and the database role Waystone runs as): see
// docs/definition-reference.md#sql.
TEST_P(StoreConformanceTest, OnSqliteTheDatabaseItselfRefusesWaystonesTablesToAStatement) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "the authorizer is SQLite's";
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  for (const std::string sql :
       {"UPDATE steps SET state = 0", "SELECT token_hash FROM \"main\".api_tokens",
        "SELECT * FROM sqlite_master", "INSERT OR ROLLBACK INTO counters VALUES (1, 2)",
        "PRAGMA journal_mode = DELETE", "ATTACH DATABASE ':memory:' AS other", "SAVEPOINT x",
        "COMMIT", "CREATE TABLE t (a)"}) {
    Change change;
    change.lease = lease;
    change.now = 2001;
    change.lease_expires_at = 7000;
    change.statements = {BusinessStatement{0, sql, sql, {}, true}};
    auto results = store_->Commit({change});
    ASSERT_TRUE(results.ok()) << sql << ": " << results.status();
    EXPECT_TRUE(IsStatementFailure((*results)[0])) << sql << ": " << (*results)[0];
  }
  EXPECT_EQ((*store_->GetSteps(lease.instance_id))[0].state, StepState::kPending);
  EXPECT_EQ(store_->GetInstance(lease.instance_id)->state, InstanceState::kRunning);
}

// Reads go to a second connection beside the writer's; a database in memory is one
// connection's alone (a second would open another, empty one), so there it keeps one.
TEST_P(StoreConformanceTest, OnSqliteAnInMemoryDatabaseReadsWhatItWrote) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "in-memory databases are SQLite's";
  for (const std::string path :
       {":memory:", "file::memory:", "file:conformance-memory?mode=memory&cache=shared"}) {
    StoreOptions options;
    options.path = path;
    auto store = OpenStore(options);
    ASSERT_TRUE(store.ok()) << path << ": " << store.status();
    ASSERT_TRUE((*store)->PutDefinition("defhash", "wf", "wf.yaml", "text", 1).ok()) << path;
    auto started = (*store)->StartInstance(Instance("m1"));
    ASSERT_TRUE(started.ok()) << path << ": " << started.status();
    auto read = (*store)->GetInstance(started->instance.id);
    ASSERT_TRUE(read.ok()) << path << ": " << read.status();
    EXPECT_EQ(read->key, "m1") << path;
    auto found = (*store)->FindInstance("t1", "m1");
    ASSERT_TRUE(found.ok()) << path << ": " << found.status();
    EXPECT_EQ(found->id, read->id) << path;
    auto steps = (*store)->GetSteps(read->id);
    ASSERT_TRUE(steps.ok()) << path << ": " << steps.status();
    EXPECT_EQ(steps->size(), 2u) << path;
    auto due = (*store)->NextDueTime();
    ASSERT_TRUE(due.ok()) << path << ": " << due.status();
    EXPECT_EQ(*due, std::optional<Millis>(1000)) << path;
    // The reports, which elsewhere read on a connection of their own, read here too.
    auto summary = (*store)->Summary();
    ASSERT_TRUE(summary.ok()) << path << ": " << summary.status();
    ASSERT_EQ(summary->instances_by_state.size(), 1u) << path;
    EXPECT_EQ(summary->instances_by_state[0].second, 1) << path;
    EXPECT_EQ(summary->outbox_events, 1) << path;
    ASSERT_TRUE((*store)->DeliveryStats().ok()) << path;
  }
}

// Without file locks SQLite refuses WAL and keeps its rollback journal, in which the
// store's connections would read and write without the locks that keep them apart:
// the store refuses to open such a database, and says why.
TEST_P(StoreConformanceTest, OnSqliteADatabaseThatCannotEnterWalIsRefused) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "SQLite's WAL";
  StoreOptions options;
  options.path = "file:" + dir_.File("nolock.db") + "?nolock=1";
  auto store = OpenStore(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find("journal mode 'delete'"), std::string::npos)
      << store.status();
  EXPECT_NE(store.status().message().find("needs WAL"), std::string::npos) << store.status();
}

// Metrics scrapes and the relay's counts scan whole tables. On SQLite they read on a
// connection of their own: a report never waits for the writer (nor the writer for it,
// for as long as the scan takes). Here another connection holds the database's write
// lock, so the store's next write waits (up to its busy timeout, 10 s) holding the
// writer; the reports answer meanwhile.
TEST_P(StoreConformanceTest, OnSqliteReportsReadWhileTheWriterWaits) {
  if (GetParam() != Backend::kSqlite) GTEST_SKIP() << "PostgreSQL reports on a pooled connection";
  ASSERT_TRUE(store_->StartInstance(Instance("r1")).ok());
  sqlite3* blocker = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &blocker), SQLITE_OK);
  absl::Cleanup close = [&] { sqlite3_close(blocker); };
  ASSERT_EQ(sqlite3_exec(blocker, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  std::atomic<bool> written = false;
  std::thread writer([&] {
    EXPECT_TRUE(store_->AddToCounter("conformance", 1).ok());
    written = true;
  });
  {
    absl::Cleanup let_go = [&] {
      EXPECT_EQ(sqlite3_exec(blocker, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
      writer.join();
    };
    // Time for the write to begin waiting. (Should it not have begun yet, the reports
    // below prove less, but they cannot fail for it.)
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto summary = store_->Summary();
    auto stats = store_->DeliveryStats();
    EXPECT_FALSE(written) << "the reports waited for the writer";
    ASSERT_TRUE(summary.ok()) << summary.status();
    ASSERT_EQ(summary->instances_by_state.size(), 1u);
    EXPECT_EQ(summary->instances_by_state[0].second, 1);
    EXPECT_EQ(summary->outbox_events, 1);
    ASSERT_TRUE(stats.ok()) << stats.status();
  }
  EXPECT_TRUE(written);
}

TEST_P(StoreConformanceTest, SqlStepStatementsMayNotNameWaystonesOwnTables) {
  // Every table the migrations create is in the list a definition is checked against.
  std::vector<std::string> tables;
  const std::string query =
      GetParam() == Backend::kSqlite
          ? "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
          : "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()";
  if (GetParam() == Backend::kSqlite) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, query.c_str(), -1, &stmt, nullptr), SQLITE_OK);
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      tables.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  } else {
    PGconn* conn = PQconnectdb(path_.c_str());
    PGresult* result = PQexec(conn, query.c_str());
    for (int r = 0; r < PQntuples(result); ++r) tables.emplace_back(PQgetvalue(result, r, 0));
    PQclear(result);
    PQfinish(conn);
  }
  ASSERT_GT(tables.size(), 10u);
  for (const std::string& table : tables) {
    EXPECT_NE(std::find(std::begin(kWaystoneTables), std::end(kWaystoneTables), table),
              std::end(kWaystoneTables))
        << table << " is not in kWaystoneTables (model/sql_statement.h)";
  }
}

TEST_P(StoreConformanceTest, IdempotencyKeyWithAnotherRequestHashIsAConflict) {
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

// A notification's delivery identity belongs to the instance step that claimed it
// first, also when two claim it at once (each finding no row before it writes).
TEST_P(StoreConformanceTest, AnExclusiveClaimHasOneOwnerEvenWhenClaimedAtOnce) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  ASSERT_TRUE(store_->StartInstance(Instance("k2")).ok());
  const std::vector<Lease> leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 2u);
  auto claim = [&](const Lease& lease, const std::string& key, Millis now) {
    Change change;
    change.lease = lease;
    change.now = now;
    change.lease_expires_at = 7000;
    change.idempotency = IdempotencyClaim{"t1", key, "h", lease.instance_id, "two", 100'000};
    change.idempotency->exclusive = true;
    return (*store_->Commit({change}))[0];
  };
  ASSERT_TRUE(claim(leases[0], "notify:one", 2001).ok());
  EXPECT_TRUE(claim(leases[0], "notify:one", 2002).ok()) << "its own next attempt";
  const absl::Status taken = claim(leases[1], "notify:one", 2003);
  EXPECT_TRUE(IsDeliveryOwned(taken)) << taken;
  EXPECT_TRUE(claim(leases[1], "notify:one", 100'001).ok()) << "once it expired";

  // The owner's step failed without an unknown outcome: nothing of it arrived, so the
  // delivery passes to the other instance; after an unknown outcome it would not.
  ASSERT_TRUE(claim(leases[0], "notify:two", 2004).ok());
  StepRecord owner = (*store_->GetSteps(leases[0].instance_id))[1];
  owner.state = StepState::kFailed;
  owner.unknowns = 1;
  Change failed;
  failed.lease = leases[0];
  failed.now = 2005;
  failed.lease_expires_at = 7000;
  failed.steps = {owner};
  ASSERT_TRUE((*store_->Commit({failed}))[0].ok());
  EXPECT_TRUE(IsDeliveryOwned(claim(leases[1], "notify:two", 2006)));
  owner.unknowns = 0;
  failed.steps = {owner};
  ASSERT_TRUE((*store_->Commit({failed}))[0].ok());
  EXPECT_TRUE(claim(leases[1], "notify:two", 2007).ok());
  EXPECT_EQ((*store_->GetIdempotencyClaim("t1", "notify:two"))->instance_id, leases[1].instance_id);
  owner.state = StepState::kPending;  // the race below: neither owner gave up
  failed.steps = {owner};
  ASSERT_TRUE((*store_->Commit({failed}))[0].ok());

  constexpr int kKeys = 40;
  std::vector<absl::Status> first(kKeys), second(kKeys);
  std::thread a([&] {
    for (int i = 0; i < kKeys; ++i) first[i] = claim(leases[0], "race:" + std::to_string(i), 3000);
  });
  std::thread b([&] {
    for (int i = 0; i < kKeys; ++i) second[i] = claim(leases[1], "race:" + std::to_string(i), 3000);
  });
  a.join();
  b.join();
  for (int i = 0; i < kKeys; ++i) {
    SCOPED_TRACE(i);
    EXPECT_NE(first[i].ok(), second[i].ok()) << first[i] << " / " << second[i];
    EXPECT_TRUE(first[i].ok() || IsDeliveryOwned(first[i])) << first[i];
    EXPECT_TRUE(second[i].ok() || IsDeliveryOwned(second[i])) << second[i];
    const auto owner = *store_->GetIdempotencyClaim("t1", "race:" + std::to_string(i));
    ASSERT_TRUE(owner.has_value());
    EXPECT_EQ(owner->instance_id, first[i].ok() ? leases[0].instance_id : leases[1].instance_id);
  }
}

// A delivery owed by a business step's commit (Change::reservations): reserved for
// the reporting channel step with no request hash; another reservation or claim of the
// identity leaves it with its owner; the owner's own claim fills the hash in.
TEST_P(StoreConformanceTest, AReservedDeliveryStaysWithItsOwnerUntilItSends) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  ASSERT_TRUE(store_->StartInstance(Instance("k2")).ok());
  const std::vector<Lease> leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 2u);
  auto commit = [&](const Lease& lease, Millis now, bool reserve, const std::string& hash) {
    Change change;
    change.lease = lease;
    change.now = now;
    change.lease_expires_at = 7000;
    IdempotencyClaim claim{"t1", "notify:owed", hash, lease.instance_id, "two", now + 50'000};
    claim.exclusive = true;
    if (reserve) {
      change.reservations.push_back(claim);
    } else {
      change.idempotency = claim;
    }
    return (*store_->Commit({change}))[0];
  };
  ASSERT_TRUE(commit(leases[0], 2001, true, "").ok());
  auto row = *store_->GetIdempotencyClaim("t1", "notify:owed");
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->instance_id, leases[0].instance_id);
  EXPECT_EQ(row->request_hash, "");
  EXPECT_TRUE(commit(leases[1], 2002, true, "").ok()) << "never an error";
  EXPECT_EQ((*store_->GetIdempotencyClaim("t1", "notify:owed"))->instance_id,
            leases[0].instance_id);
  EXPECT_TRUE(IsDeliveryOwned(commit(leases[1], 2003, false, "h")));
  ASSERT_TRUE(commit(leases[0], 2004, false, "h").ok()) << "its owner sends";
  row = *store_->GetIdempotencyClaim("t1", "notify:owed");
  EXPECT_EQ(row->request_hash, "h");
  EXPECT_TRUE(commit(leases[0], 2005, true, "").ok());
  EXPECT_EQ((*store_->GetIdempotencyClaim("t1", "notify:owed"))->request_hash, "h")
      << "a reservation never erases what was sent";
  ASSERT_TRUE(commit(leases[1], 60'000, true, "").ok());
  EXPECT_EQ((*store_->GetIdempotencyClaim("t1", "notify:owed"))->instance_id, leases[1].instance_id)
      << "once it expired";

  // Reserved by an instance that then ended without sending it (failed, compensated or
  // closed): the delivery passes to another instance that reaches it.
  Change ended;
  ended.lease = leases[1];
  ended.now = 60'001;
  ended.state = InstanceState::kFailed;
  ASSERT_TRUE((*store_->Commit({ended}))[0].ok());
  EXPECT_TRUE(commit(leases[0], 60'002, false, "h2").ok());
  EXPECT_EQ((*store_->GetIdempotencyClaim("t1", "notify:owed"))->instance_id,
            leases[0].instance_id);
}

TEST_P(StoreConformanceTest, AuditLogIsAppendOnly) {
  auto started = store_->StartInstance(Instance("k1"));
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 7000;
  change.audits.push_back({0, 0, "alice", "t1", 0, "retry", "customer called", "{}"});
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  ASSERT_EQ(store_->ListAudit(started->instance.id)->size(), 1u);
  EXPECT_FALSE(RawExec("UPDATE audit_log SET reason = 'changed'"));
  EXPECT_FALSE(RawExec("DELETE FROM audit_log"));
  EXPECT_EQ((*store_->ListAudit(started->instance.id))[0].reason, "customer called");
}

TEST_P(StoreConformanceTest, MigrationsAreIdempotentAndRefuseNewerSchemas) {
  const int newest = NewestMigration();
  EXPECT_GE(newest, 2);
  EXPECT_EQ(SchemaVersion(), newest);
  store_.reset();
  store_ = Open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(SchemaVersion(), newest);
  store_.reset();
  ASSERT_TRUE(RawExec("INSERT INTO schema_migrations VALUES (999, 'future', 0)"));
  StoreOptions options;
  options.path = path_;
  auto refused = OpenStore(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("999"), std::string::npos);
}

TEST_P(StoreConformanceTest, ExpireLeasesFreesADeadOwnersInstances) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  ASSERT_EQ(store_->ClaimRunnable("dead", 2000, 60'000, 10)->size(), 1u);
  EXPECT_EQ(*store_->LeaseOwners(2001), std::vector<std::string>{"dead"});
  EXPECT_TRUE(store_->ClaimRunnable("alive", 2002, 60'000, 10)->empty());
  ASSERT_TRUE(store_->ExpireLeases("dead").ok());
  EXPECT_EQ(store_->ClaimRunnable("alive", 2003, 60'000, 10)->size(), 1u);
}

// The reaper asks which owners hold leases on the work in flight (a question that
// reads every instance ever kept, asked every second, grows with the history): an
// instance a worker drives counts, and one that needs attention while its worker
// still holds it (a branch beside the failed step has a call out), each owner once;
// an operator's lease, held for one action on a finished instance, is left to expire.
TEST_P(StoreConformanceTest, LeaseOwnersAreThoseOfTheInstancesWorkersHold) {
  auto attention_started = store_->StartInstance(Instance("attention"));
  auto failed_started = store_->StartInstance(Instance("failed"));
  ASSERT_TRUE(attention_started.ok() && failed_started.ok());
  auto leases = store_->ClaimRunnable("branching worker", 2000, 60'000, 10);
  ASSERT_TRUE(leases.ok() && leases->size() == 2u) << leases.status();
  const bool attention_first = (*leases)[0].instance_id == attention_started->instance.id;
  Change attention;  // the worker keeps its lease
  attention.lease = (*leases)[attention_first ? 0 : 1];
  attention.now = 2001;
  attention.lease_expires_at = 62'000;
  attention.state = InstanceState::kNeedsAttention;
  Change failed;  // released
  failed.lease = (*leases)[attention_first ? 1 : 0];
  failed.now = 2001;
  failed.lease_expires_at = 0;
  failed.state = InstanceState::kFailed;
  auto committed = store_->Commit({attention, failed});
  ASSERT_TRUE(committed.ok() && (*committed)[0].ok() && (*committed)[1].ok()) << committed.status();
  ASSERT_TRUE(store_->ClaimInstance(failed_started->instance.id, "operator", 2002, 60'000).ok());
  ASSERT_TRUE(store_->StartInstance(Instance("driven")).ok());
  ASSERT_TRUE(store_->StartInstance(Instance("driven too")).ok());
  ASSERT_EQ(store_->ClaimRunnable("worker", 2003, 60'000, 10)->size(), 2u);

  auto owners = store_->LeaseOwners(2004);
  ASSERT_TRUE(owners.ok()) << owners.status();
  std::sort(owners->begin(), owners->end());
  EXPECT_EQ(*owners, (std::vector<std::string>{"branching worker", "worker"}));
}

TEST_P(StoreConformanceTest, MigrationsFromManyConnectionsAtOnceApplyOnce) {
  store_.reset();
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto store = OpenStore({path_});
      results[i] = store.status();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& status : results) EXPECT_TRUE(status.ok()) << status;
  store_ = Open();
  EXPECT_EQ(SchemaVersion(), NewestMigration());
}

// Workers started together on a file none has made yet (verify's two identical
// starts did this): each open waits for the others' switch to WAL and migrations.
TEST(SqliteOpenTest, FirstOpensOfANewFileAtOnceAllSucceed) {
  testing::TempDir dir;
  for (int round = 0; round < 20; ++round) {
    const std::string fresh = dir.File("fresh-" + std::to_string(round) + ".db");
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(3);
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&, i] { results[i] = OpenStore({fresh}).status(); });
    }
    for (auto& t : threads) t.join();
    for (const auto& status : results)
      ASSERT_TRUE(status.ok()) << "round " << round << ": " << status;
  }
}

TEST_P(StoreConformanceTest, FinishingABatchRecordsEachOutcomeAndRefusesOnlyTheLostLease) {
  std::vector<int64_t> ids;
  for (const char* key : {"k1", "k2", "k3"})
    ids.push_back(store_->StartInstance(Instance(key))->instance.id);
  absl::StatusOr<std::vector<EventRecord>> rows;
  testing::WaitFor(
      [&] {
        rows = store_->ReadOutbox(0, 100);
        return !rows.ok() || rows->size() == 3u;
      },
      std::chrono::seconds(10));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  std::vector<std::pair<int64_t, int64_t>> wanted;
  for (const auto& r : *rows) wanted.emplace_back(r.seq, r.instance_id);
  ASSERT_TRUE(store_->AddDeliveries("s", 0, rows->back().seq, wanted, 3000).ok());
  // relay-a's lease on k1 runs out and relay-b claims all three.
  auto a = *store_->ClaimDeliveries("relay-a", 4000, 1000, 1, {"s"});
  ASSERT_EQ(a.size(), 1u);
  auto b = *store_->ClaimDeliveries("relay-b", 5001, 1000, 10, {"s"});
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(b[0].event.instance_id, a[0].event.instance_id);
  EXPECT_EQ(*store_->DeliveryLeaseOwners(5001), std::vector<std::string>{"relay-b"});  // once
  DeliveryUpdate delivered;
  delivered.now = 5002;
  delivered.state = DeliveryState::kDelivered;
  delivered.attempts = 1;
  DeliveryUpdate retry;
  retry.now = 5002;
  retry.state = DeliveryState::kPending;
  retry.attempts = 1;
  retry.next_attempt_at = 9000;
  retry.error = "HTTP 500";
  auto results = store_->FinishDeliveries({{a[0], delivered}, {b[1], delivered}, {b[2], retry}});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_TRUE(absl::IsAborted((*results)[0])) << (*results)[0];
  EXPECT_TRUE((*results)[1].ok()) << (*results)[1];
  EXPECT_TRUE((*results)[2].ok()) << (*results)[2];
  auto state_of = [&](int64_t instance) { return (*store_->ListDeliveries(instance))[0]; };
  EXPECT_EQ(state_of(b[0].event.instance_id).state, DeliveryState::kPending);  // still b's
  EXPECT_EQ(state_of(b[1].event.instance_id).state, DeliveryState::kDelivered);
  EXPECT_EQ(state_of(b[2].event.instance_id).state, DeliveryState::kPending);
  EXPECT_EQ(state_of(b[2].event.instance_id).attempts, 1);
  EXPECT_EQ(state_of(b[2].event.instance_id).last_error, "HTTP 500");
  // Only k2's event is delivered to every sink it is for: its outbox row is marked.
  const std::string kMarked = "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL";
  EXPECT_EQ(RawCount(kMarked), 1);
  // The lost lease left k1 to relay-b, which finishes it; k3 waits for its retry time.
  results = store_->FinishDeliveries({{b[0], delivered}});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].ok());
  EXPECT_EQ(RawCount(kMarked), 2);
  EXPECT_TRUE(store_->ClaimDeliveries("relay-b", 5003, 1000, 10, {"s"})->empty());
  auto stats = *store_->DeliveryStats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].delivered, 2);
  EXPECT_EQ(stats[0].pending, 1);
  EXPECT_TRUE(store_->FinishDeliveries({})->empty());
}

TEST_P(StoreConformanceTest, DeliveriesAreClaimedHeadOfLineAndFenced) {
  auto started = store_->StartInstance(Instance("k1"));
  const int64_t id = started->instance.id;
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 7000;
  change.events = {{0, "second", id, "t1", "waystone.step.completed", "{}", 0},
                   {0, "third", id, "t1", "waystone.step.completed", "{}", 0}};
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  // PostgreSQL hands out rows only once every older transaction in the cluster has
  // ended; other tests sharing the cluster may hold that back for a moment.
  absl::StatusOr<std::vector<EventRecord>> rows;
  testing::WaitFor(
      [&] {
        rows = store_->ReadOutbox(*store_->OutboxCursor("s"), 100);
        return !rows.ok() || rows->size() == 3u;
      },
      std::chrono::seconds(10));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  std::vector<std::pair<int64_t, int64_t>> wanted;
  for (const auto& r : *rows) wanted.emplace_back(r.seq, r.instance_id);
  ASSERT_TRUE(store_->AddDeliveries("s", 0, rows->back().seq, wanted, 3000).ok());
  // A second relay that read the same rows is refused.
  EXPECT_TRUE(absl::IsAborted(store_->AddDeliveries("s", 0, rows->back().seq, wanted, 3000)));
  EXPECT_TRUE(store_->ReadOutbox(*store_->OutboxCursor("s"), 100)->empty());
  // Only the head of the instance is claimable.
  auto a = *store_->ClaimDeliveries("relay-a", 4000, 1000, 10, {"s"});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].event.event_id, "ev-k1");
  EXPECT_TRUE(store_->ClaimDeliveries("relay-b", 4001, 1000, 10, {"s"})->empty());
  // After the lease expires another relay takes it; the first one's finish is refused.
  auto b = *store_->ClaimDeliveries("relay-b", 5001, 1000, 10, {"s"});
  ASSERT_EQ(b.size(), 1u);
  DeliveryUpdate delivered;
  delivered.now = 5002;
  delivered.state = DeliveryState::kDelivered;
  delivered.attempts = 1;
  EXPECT_TRUE(absl::IsAborted(store_->FinishDelivery(a[0], delivered)));
  EXPECT_TRUE(store_->FinishDelivery(b[0], delivered).ok());
  auto next = *store_->ClaimDeliveries("relay-b", 5003, 1000, 10, {"s"});
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].event.event_id, "second");
  // Parking moves the head on and raises the alert with its event, atomically.
  DeliveryUpdate parked;
  parked.now = 5004;
  parked.state = DeliveryState::kParked;
  parked.attempts = 10;
  parked.alert =
      AlertRecord{0, id, "t1", "", AlertKind::kDeliveryParked, AlertState::kOpen, "p", 5004};
  parked.alert_event =
      EventRecord{0, "alert-1", id, "t1", "waystone.alert.delivery_parked", "{}", 0};
  ASSERT_TRUE(store_->FinishDelivery(next[0], parked).ok());
  auto third = *store_->ClaimDeliveries("relay-b", 5005, 1000, 10, {"s"});
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].event.event_id, "third");
  EXPECT_EQ(store_->ListAlerts(id)->size(), 1u);
  auto stats = *store_->DeliveryStats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].delivered, 1);
  EXPECT_EQ(stats[0].parked, 1);
  EXPECT_EQ(stats[0].pending, 1);
  EXPECT_EQ(store_->ListDeliveries(id)->size(), 3u);
}

TEST_P(StoreConformanceTest, DisabledSinksAndStaleUnknownSteps) {
  auto started = store_->StartInstance(Instance("k1"));
  const int64_t id = started->instance.id;
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  StepRecord step = (*store_->GetSteps(id))[0];
  step.state = StepState::kUnknown;
  step.unknown_since = 2001;
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 7000;
  change.steps = {step};
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  EXPECT_TRUE(store_->StaleUnknownSteps(2000)->empty());
  auto stale = *store_->StaleUnknownSteps(3000);
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0].step, "one");
  AlertRecord alert{0,   id,  "t1", "one", AlertKind::kUnknownUnresolved, AlertState::kOpen,
                    "x", 3000};
  ASSERT_TRUE(
      store_->RaiseAlert(alert, {0, "a1", id, "t1", "waystone.alert.unknown_unresolved", "{}", 0})
          .ok());
  EXPECT_TRUE(store_->StaleUnknownSteps(4000)->empty());
  EXPECT_TRUE(store_->DisabledSinks()->empty());
}

TEST_P(StoreConformanceTest, StartingAnInstanceWakesIdleWorkers) {
  if (GetParam() == Backend::kSqlite) {
    EXPECT_TRUE(absl::IsUnimplemented(store_->WaitForWork(10)));  // SQLite workers poll
    return;
  }
  ASSERT_TRUE(store_->WaitForWork(0).ok());  // subscribes
  auto other = Open();
  std::thread starter([&] {
    // Deliberate: the start must come while WaitForWork below is already waiting
    // (what it waits in cannot be observed from here); 200 ms lets it get there.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(other->StartInstance(Instance("wake")).ok());
  });
  const auto begin = std::chrono::steady_clock::now();
  ASSERT_TRUE(store_->WaitForWork(60'000).ok());
  const auto waited = std::chrono::steady_clock::now() - begin;
  starter.join();
  // Woken by the notification, not by the 60 s timeout.
  EXPECT_LT(waited, std::chrono::seconds(30));
}

// A start created leased to its own worker wakes nobody: no other worker can take it.
TEST_P(StoreConformanceTest, AStartLeasedToItsOwnWorkerWakesNobody) {
  if (GetParam() == Backend::kSqlite) GTEST_SKIP() << "SQLite workers poll";
  ASSERT_TRUE(store_->WaitForWork(0).ok());  // subscribes
  auto other = Open();
  NewInstance leased = Instance("leased");
  leased.lease_owner = "worker-a";
  leased.lease_expires_at = 60'000;
  ASSERT_TRUE(other->StartInstance(leased).ok());
  // A notification would have arrived by the time the start returned.
  const auto begin = std::chrono::steady_clock::now();
  ASSERT_TRUE(store_->WaitForWork(1000).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - begin, std::chrono::milliseconds(900));
  // The check can tell: a start for any worker does wake it.
  ASSERT_TRUE(other->StartInstance(Instance("plain")).ok());
  const auto again = std::chrono::steady_clock::now();
  ASSERT_TRUE(store_->WaitForWork(60'000).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - again, std::chrono::seconds(30));
}

TEST_P(StoreConformanceTest, GarbageCollectionKeepsWhatIsStillNeeded) {
  // k1 finished long ago; k2 finished long ago but has an undelivered event; k3 runs.
  for (const char* key : {"k1", "k2", "k3"}) ASSERT_TRUE(store_->StartInstance(Instance(key)).ok());
  auto leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 3u);
  std::vector<Change> changes;
  for (const Lease& lease : leases) {
    Change c;
    c.lease = lease;
    c.now = 2001;
    c.lease_expires_at = 0;
    if (lease.instance_id != leases[2].instance_id) c.state = InstanceState::kCompleted;
    if (lease.instance_id == leases[0].instance_id) {
      c.idempotency = IdempotencyClaim{"t1", "old-key", "h", lease.instance_id, "one", 2500};
    }
    if (lease.instance_id != leases[1].instance_id) {
      c.keep = KeptEvent{0, "never-waited", "/src", "e", "{}", 2001};
    }
    changes.push_back(c);
  }
  ASSERT_TRUE(store_->Commit(changes).ok());
  const int64_t k2 = leases[1].instance_id;
  absl::StatusOr<std::vector<EventRecord>> rows;
  testing::WaitFor(
      [&] {
        rows = store_->ReadOutbox(0, 100);
        return rows.ok() && rows->size() == 3u;
      },
      std::chrono::seconds(10));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  std::vector<std::pair<int64_t, int64_t>> wanted;
  for (const auto& r : *rows) {
    if (r.instance_id == k2) wanted.emplace_back(r.seq, r.instance_id);
  }
  ASSERT_TRUE(store_->AddDeliveries("s", 0, rows->back().seq, wanted, 2002).ok());

  auto dry = store_->CollectGarbage(3000, 3000, /*protect_before=*/0, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(dry->instances, 1);
  EXPECT_EQ(dry->steps, 2);
  EXPECT_EQ(dry->events, 1);
  EXPECT_EQ(dry->idempotency_keys, 1);
  EXPECT_EQ(store_->ListInstances({})->size(), 3u);  // a dry run changes nothing

  auto done = store_->CollectGarbage(3000, 3000, /*protect_before=*/0, /*dry_run=*/false);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->instances, 1);
  auto left = *store_->ListInstances({});
  ASSERT_EQ(left.size(), 2u);
  EXPECT_TRUE(absl::IsNotFound(store_->FindInstance("t1", "k1").status()));
  EXPECT_TRUE(store_->FindInstance("t1", "k2").ok());
  EXPECT_TRUE(store_->FindInstance("t1", "k3").ok());
  EXPECT_FALSE(store_->GetIdempotencyClaim("t1", "old-key")->has_value());
  // k1's kept event went with it; k3's is still there.
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM kept_events"), 1);
  EXPECT_EQ(store_->GetKeptEvents(leases[2].instance_id)->size(), 1u);
  // What is left of k1 answers a late start for its key; nothing is created.
  auto tombstone = store_->FindTombstone("t1", "k1");
  ASSERT_TRUE(tombstone.ok()) << tombstone.status();
  EXPECT_EQ(tombstone->workflow, "wf");
  auto again = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, StartOutcome::kCollected);
  ASSERT_TRUE(again->tombstone.has_value());
  EXPECT_EQ(store_->ListInstances({})->size(), 2u);
  NewInstance changed = Instance("k1");
  changed.input_hash = "other-input";
  EXPECT_EQ(store_->StartInstance(changed).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A gc that buries a key while a start of that key waits for the row the gc deletes:
// the start answers the tombstone and creates nothing. (PostgreSQL only: SQLite's
// writers are serialized, so there a start never waits beside a gc.)
TEST_P(StoreConformanceTest, AStartThatWaitedForAGcBuryingItsKeyAnswersTheTombstone) {
  if (GetParam() == Backend::kSqlite) GTEST_SKIP() << "SQLite's writers are serialized";
  auto first = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->outcome, StartOutcome::kCreated);
  const std::string id = std::to_string(first->instance.id);
  // A gc's transaction, as BuryPicked and the deletes after it leave it, not yet committed.
  PGconn* gc = PQconnectdb(path_.c_str());
  ASSERT_EQ(PQstatus(gc), CONNECTION_OK) << PQerrorMessage(gc);
  auto exec = [&](const std::string& sql) {
    PGresult* result = PQexec(gc, sql.c_str());
    const bool ok = PQresultStatus(result) == PGRES_COMMAND_OK;
    if (!ok) ADD_FAILURE() << sql << ": " << PQerrorMessage(gc);
    PQclear(result);
    return ok;
  };
  bool open = exec("BEGIN") &&
              exec(
                  "INSERT INTO tombstones SELECT tenant, business_key, workflow, input_hash, "
                  "state, '{}', id, updated_at, 5000 FROM instances WHERE id = " +
                  id) &&
              exec("DELETE FROM outbox WHERE instance_id = " + id) &&
              exec("DELETE FROM steps WHERE instance_id = " + id) &&
              exec("DELETE FROM instances WHERE id = " + id);
  absl::StatusOr<StartResult> again = absl::UnknownError("not run");
  std::thread start;
  bool waited = false;
  if (open) {
    start = std::thread([&] { again = store_->StartInstance(Instance("k1")); });
    // The start's insert waits for the row the gc deleted; then the gc commits.
    waited = testing::WaitFor(
        [&] {
          return RawCount(
                     "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = "
                     "current_database() AND wait_event_type = 'Lock'") == 1;
        },
        std::chrono::seconds(10));
    exec("COMMIT");
    start.join();
  }
  PQfinish(gc);
  ASSERT_TRUE(open);
  EXPECT_TRUE(waited) << "the start never waited for the gc";
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, StartOutcome::kCollected);
  ASSERT_TRUE(again->tombstone.has_value());
  EXPECT_EQ(again->instance.id, first->instance.id);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM instances WHERE business_key = 'k1'"), 0);
}

TEST_P(StoreConformanceTest, ApiRequestsClaimReplayAndAreTakenOverWhenAbandoned) {
  ApiRequestRecord r{"t1", "k", "hash-a", false, 0, "", "", 1000, 100000, "host/1/x"};
  auto first = store_->BeginApiRequest(r, 0, "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outcome, ApiRequestOutcome::kNew);
  EXPECT_EQ(store_->BeginApiRequest(r, 0, "")->outcome, ApiRequestOutcome::kInFlight);
  ApiRequestRecord other = r;
  other.request_hash = "hash-b";
  EXPECT_EQ(store_->BeginApiRequest(other, 0, "")->outcome, ApiRequestOutcome::kMismatch);
  // An in-flight claim of a dead owner, or an old one, is taken over.
  EXPECT_EQ(store_->BeginApiRequest(r, 0, "host/1/x")->outcome, ApiRequestOutcome::kNew);
  EXPECT_EQ(store_->BeginApiRequest(r, 2000, "")->outcome, ApiRequestOutcome::kNew);
  ApiRequestRecord done = r;
  done.status = 201;
  done.content_type = "application/json";
  done.body = "{}";
  ASSERT_TRUE(store_->FinishApiRequest(done).ok());
  auto replay = store_->BeginApiRequest(r, 999999, "host/1/x");
  EXPECT_EQ(replay->outcome, ApiRequestOutcome::kReplay);
  EXPECT_EQ(replay->stored.status, 201);
  EXPECT_EQ(replay->stored.body, "{}");
  // Expired: free again.
  ApiRequestRecord later = other;
  later.created_at = 200000;
  later.expires_at = 300000;
  EXPECT_EQ(store_->BeginApiRequest(later, 0, "")->outcome, ApiRequestOutcome::kNew);
  ASSERT_TRUE(store_->AbandonApiRequest("t1", "k").ok());
  EXPECT_EQ(store_->BeginApiRequest(r, 0, "")->outcome, ApiRequestOutcome::kNew);
}

// Events kept for a code workflow's function: numbered in arrival order per
// instance, listed until taken, each taken once (a second take fails its change,
// which writes nothing), and written only under the lease.
TEST_P(StoreConformanceTest, KeptEventsAreNumberedListedAndTakenOnce) {
  const int64_t id = store_->StartInstance(Stepless("kept"))->instance.id;
  const int64_t other = store_->StartInstance(Instance("other"))->instance.id;
  const std::pair<Lease, Lease> leases = ClaimBoth(id, other);
  const Lease& lease = leases.first;
  const Lease& other_lease = leases.second;
  ASSERT_EQ(lease.instance_id, id);
  ASSERT_EQ(other_lease.instance_id, other);
  auto keep = [&](const std::string& type, const std::string& event_id, Millis now,
                  bool on_other = false) {
    Change change;
    change.lease = on_other ? other_lease : lease;
    change.now = now;
    change.lease_expires_at = 7000;
    change.keep = KeptEvent{0, type, "/bank", event_id, R"({"id":")" + event_id + R"("})", now};
    return (*store_->Commit({change}))[0];
  };
  ASSERT_TRUE(keep("paid", "p-1", 2001).ok());
  ASSERT_TRUE(keep("shipped", "s-1", 2002).ok());
  ASSERT_TRUE(keep("paid", "p-2", 2003).ok());
  ASSERT_TRUE(keep("paid", "o-1", 2004, /*on_other=*/true).ok());
  auto kept = *store_->GetKeptEvents(id);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].seq, 1);
  EXPECT_EQ(kept[0].event_id, "p-1");
  EXPECT_EQ(kept[0].event_type, "paid");
  EXPECT_EQ(kept[0].source, "/bank");
  EXPECT_EQ(kept[0].data_json, R"({"id":"p-1"})");
  EXPECT_EQ(kept[0].received_at, 2001);
  EXPECT_EQ(kept[1].seq, 2);
  EXPECT_EQ(kept[2].seq, 3);
  EXPECT_EQ(kept[2].event_id, "p-2");
  auto of_other = *store_->GetKeptEvents(other);  // numbered per instance
  ASSERT_EQ(of_other.size(), 1u);
  EXPECT_EQ(of_other[0].seq, 1);
  EXPECT_EQ(of_other[0].event_id, "o-1");

  auto take = [&](int64_t seq, int index) {
    Change change;
    change.lease = lease;
    change.now = 2010;
    change.lease_expires_at = 7000;
    StepRecord row;
    row.index = index;
    row.name = "$wait:paid";
    row.state = StepState::kCompleted;
    change.added_steps = {row};
    change.take = KeptEventTake{seq, index};
    return (*store_->Commit({change}))[0];
  };
  ASSERT_TRUE(take(1, 0).ok());
  kept = *store_->GetKeptEvents(id);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].event_id, "s-1");
  // Taken before: refused, and its step row is not written.
  EXPECT_FALSE(take(1, 1).ok());
  EXPECT_EQ(store_->GetSteps(id)->size(), 1u);
  EXPECT_EQ(RawCount("SELECT COUNT(*) FROM kept_events WHERE taken_by = 0 AND taken_at = 2010"), 1);
  // A lost lease keeps nothing.
  Change stale;
  stale.lease = lease;
  stale.lease.epoch += 1;
  stale.now = 2011;
  stale.lease_expires_at = 7000;
  stale.keep = KeptEvent{0, "paid", "/bank", "p-3", "{}", 2011};
  EXPECT_TRUE(absl::IsAborted((*store_->Commit({stale}))[0]));
  EXPECT_EQ(store_->GetKeptEvents(id)->size(), 2u);
}

TEST_P(StoreConformanceTest, AChangeClaimsItsInboxEventOnceAndResolvesAlerts) {
  auto started = store_->StartInstance(Instance("k1"));
  const int64_t id = started->instance.id;
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change pause;
  pause.lease = lease;
  pause.now = 2001;
  pause.lease_expires_at = 7000;
  pause.alerts = {{0, id, "t1", "a", AlertKind::kNeedsOperator, AlertState::kOpen, "look", 0}};
  ASSERT_TRUE((*store_->Commit({pause}))[0].ok());
  const int64_t alert = (*store_->ListAlerts(id))[0].id;
  ASSERT_TRUE(
      store_->AcknowledgeAlert(alert, {0, 2002, "op", "t1", id, "acknowledge", "r", ""}).ok());
  EXPECT_EQ(store_->GetAlert(alert)->state, AlertState::kAcknowledged);
  EXPECT_EQ(
      store_->AcknowledgeAlert(alert, {0, 2003, "op", "t1", id, "acknowledge", "r", ""}).code(),
      absl::StatusCode::kFailedPrecondition);

  Change signal;
  signal.lease = lease;
  signal.now = 2004;
  signal.lease_expires_at = 7000;
  signal.inbox = InboxClaim{"t1", "/src", "ev-1", "hash-1"};
  signal.resolve_alerts = true;
  signal.events = {{0, "e-signal", id, "t1", "x", "{}", 0}};
  ASSERT_TRUE((*store_->Commit({signal}))[0].ok());
  auto claimed = store_->LookupInbox("t1", "/src", "ev-1");
  ASSERT_TRUE(claimed.ok() && claimed->has_value());
  EXPECT_EQ((*claimed)->data_hash, "hash-1");
  EXPECT_EQ((*claimed)->instance_id, id);
  EXPECT_FALSE(store_->LookupInbox("t2", "/src", "ev-1")->has_value());  // per tenant
  EXPECT_EQ(store_->GetAlert(alert)->state, AlertState::kResolved);
  // The same event again: that change alone is refused, nothing of it is written.
  signal.events = {{0, "e-signal-2", id, "t1", "x", "{}", 0}};
  Change other;
  other.lease = lease;
  other.now = 2005;
  other.lease_expires_at = 7000;
  other.status_reason = "still here";
  auto results = store_->Commit({signal, other});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE((*results)[1].ok());
  EXPECT_EQ(store_->ListEvents(id)->size(), 2u);  // started + the first signal's
  EXPECT_EQ(store_->ListAudit(id)->size(), 1u);
  EXPECT_EQ(store_->GetInstance(id)->status_reason, "still here");
}

// A change refused after its fence wrote (an event received before, a kept event
// taken before, an idempotency key used for another request) leaves its instance's
// row as it was: the fence's own write goes with the rest of the change, while the
// other change of the batch commits. (A change that can only lose its lease needs
// no savepoint: its fence fails before anything is written.)
TEST_P(StoreConformanceTest, AChangeRefusedAfterItsFenceLeavesItsInstanceRowAsItWas) {
  const int64_t id = store_->StartInstance(Stepless("k1"))->instance.id;
  const int64_t other = store_->StartInstance(Instance("k2"))->instance.id;
  const std::pair<Lease, Lease> leases = ClaimBoth(id, other);
  const Lease& lease = leases.first;
  const Lease& other_lease = leases.second;
  ASSERT_EQ(lease.instance_id, id);
  ASSERT_EQ(other_lease.instance_id, other);
  // What each refusal needs stored first: an inbox event claimed, a kept event
  // taken, a key used for one request.
  Change setup;
  setup.lease = lease;
  setup.now = 2001;
  setup.lease_expires_at = 7000;
  setup.inbox = InboxClaim{"t1", "/src", "ev-1", "hash-1"};
  setup.keep = KeptEvent{0, "paid", "/bank", "p-1", "{}", 2001};
  setup.idempotency = IdempotencyClaim{"t1", "k1:one", "hash-a", id, "one", 100'000};
  ASSERT_TRUE((*store_->Commit({setup}))[0].ok());
  Change take = setup;
  take.inbox.reset();
  take.keep.reset();
  take.idempotency.reset();
  StepRecord row;
  row.name = "$wait:paid";
  row.state = StepState::kCompleted;
  take.added_steps = {row};
  take.take = KeptEventTake{1, 0};
  ASSERT_TRUE((*store_->Commit({take}))[0].ok());

  const std::vector<std::pair<std::string, absl::StatusCode>> refusals = {
      {"inbox", absl::StatusCode::kAlreadyExists},
      {"take", absl::StatusCode::kFailedPrecondition},
      {"key", absl::StatusCode::kFailedPrecondition}};
  for (size_t i = 0; i < refusals.size(); ++i) {
    const auto& [kind, code] = refusals[i];
    const InstanceRecord before = *store_->GetInstance(id);
    Change refused;
    refused.lease = lease;
    refused.now = 3000 + static_cast<Millis>(i);
    refused.lease_expires_at = 9000;
    refused.state = InstanceState::kNeedsAttention;
    refused.status_reason = "must not stay";
    refused.next_run_at = 99'000;
    if (kind == "inbox") refused.inbox = setup.inbox;
    if (kind == "take") {
      row.index = 1;
      refused.added_steps = {row};
      refused.take = KeptEventTake{1, 1};
    }
    if (kind == "key") {
      refused.idempotency = setup.idempotency;
      refused.idempotency->request_hash = "hash-b";
    }
    Change fine;
    fine.lease = other_lease;
    fine.now = refused.now;
    fine.lease_expires_at = 7000;
    fine.status_reason = "applied " + kind;
    auto results = store_->Commit({refused, fine});
    ASSERT_TRUE(results.ok()) << kind << ": " << results.status();
    EXPECT_EQ((*results)[0].code(), code) << kind << ": " << (*results)[0];
    EXPECT_TRUE((*results)[1].ok()) << kind << ": " << (*results)[1];
    const InstanceRecord after = *store_->GetInstance(id);
    EXPECT_EQ(after.state, before.state) << kind;
    EXPECT_EQ(after.status_reason, before.status_reason) << kind;
    EXPECT_EQ(after.next_run_at, before.next_run_at) << kind;
    EXPECT_EQ(after.lease_expires_at, before.lease_expires_at) << kind;
    EXPECT_EQ(after.updated_at, before.updated_at) << kind;
    EXPECT_EQ(store_->GetSteps(id)->size(), 1u) << kind;
    EXPECT_EQ(store_->GetInstance(other)->status_reason, "applied " + kind);
  }
}

TEST_P(StoreConformanceTest, ListsFilterByStepExternalIdHttpStatusUpdatedAndDefinition) {
  ASSERT_TRUE(store_->PutDefinition("0123abcdef", "wf", "wf.yaml", "text", 1).ok());
  for (int i = 0; i < 3; ++i) {
    auto in = Instance("s" + std::to_string(i));
    in.now = 1000;
    if (i == 2) in.definition_hash = "0123abcdef";
    auto started = store_->StartInstance(in);
    ASSERT_TRUE(started.ok()) << started.status();
  }
  // s1: its second step unknown after a 503, with the ERP's number on its first; updated at 9000.
  Lease lease = *store_->ClaimInstance(store_->FindInstance("t1", "s1")->id, "w", 9000, 5000);
  Change change;
  change.lease = lease;
  change.now = 9000;
  change.lease_expires_at = 0;
  std::vector<StepRecord> steps = *store_->GetSteps(lease.instance_id);
  steps[0].state = StepState::kCompleted;
  steps[0].external_id = "ERP-77";
  steps[1].state = StepState::kUnknown;
  change.steps = steps;
  AttemptRecord attempt;
  attempt.step_index = 1;
  attempt.sent = true;
  attempt.status = 503;
  attempt.error_class = ErrorClass::kTransient;
  attempt.started_at = 8990;
  attempt.finished_at = 9000;
  change.attempts = {attempt};
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());

  auto keys = [&](const InstanceFilter& filter) {
    std::vector<std::string> out;
    auto found = store_->ListInstances(filter);
    EXPECT_TRUE(found.ok()) << found.status();
    if (found.ok()) {
      for (const InstanceRecord& r : *found) out.push_back(r.key);
    }
    return out;
  };
  using Keys = std::vector<std::string>;
  InstanceFilter filter;
  filter.step = "two";
  filter.step_state = StepState::kUnknown;
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.step = "one";  // s1's "one" is completed, not unknown
  EXPECT_EQ(keys(filter), Keys{});
  filter.step_state.reset();
  EXPECT_EQ(keys(filter), (Keys{"s0", "s1", "s2"}));  // every instance has a step "one"
  filter = {};
  filter.step_state = StepState::kCompleted;
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter = {};
  filter.external_id = "ERP-77";
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.tenant = "t2";  // the same number in another tenant is not this one
  EXPECT_EQ(keys(filter), Keys{});
  filter.tenant = "t1";
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.tenant.reset();
  filter.external_id = "ERP-7";  // exact, not a prefix
  EXPECT_EQ(keys(filter), Keys{});
  filter.external_id = "";  // the steps without one are not all matches
  EXPECT_EQ(keys(filter), Keys{});
  filter = {};
  filter.http_status = 503;
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.http_status = 200;
  EXPECT_EQ(keys(filter), Keys{});
  filter.http_status = 503;
  filter.step = "two";  // the 503 was "two"'s
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.step = "one";
  EXPECT_EQ(keys(filter), Keys{});
  filter = {};
  filter.updated_from = 5000;
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.updated_from = 0;
  filter.updated_to = 5000;
  EXPECT_EQ(keys(filter), (Keys{"s0", "s2"}));
  filter = {};
  filter.definition_prefix = "0123ab";
  EXPECT_EQ(keys(filter), Keys{"s2"});
  filter.definition_prefix = "0123abcdef";
  EXPECT_EQ(keys(filter), Keys{"s2"});
  filter.definition_prefix = "0123abcdef0";  // longer than the hash
  EXPECT_EQ(keys(filter), Keys{});
  filter = {};
  filter.key_prefix = "s";
  EXPECT_EQ(keys(filter), (Keys{"s0", "s1", "s2"}));
  filter.key_prefix = "s1";
  EXPECT_EQ(keys(filter), Keys{"s1"});
  filter.key_prefix = "s1x";
  EXPECT_EQ(keys(filter), Keys{});
  filter.key_prefix = "%";  // a character, not a pattern
  EXPECT_EQ(keys(filter), Keys{});
  filter.key_prefix = "s";
  filter.external_id = "ERP-77";
  EXPECT_EQ(keys(filter), Keys{"s1"});
}

TEST_P(StoreConformanceTest, ListsFilterByErrorClassAlertAndTimeAndPageById) {
  for (int i = 0; i < 4; ++i) {
    auto in = Instance("k" + std::to_string(i));
    in.now = 1000 + i * 1000;
    ASSERT_TRUE(store_->StartInstance(in).ok());
  }
  Lease lease = *store_->ClaimInstance(store_->FindInstance("t1", "k2")->id, "w", 10000, 5000);
  Change change;
  change.lease = lease;
  change.now = 10001;
  change.lease_expires_at = 15000;  // held, then it runs out
  StepRecord step = (*store_->GetSteps(lease.instance_id))[0];
  step.state = StepState::kUnknown;
  step.error_class = ErrorClass::kUnknown;
  change.steps = {step};
  change.alerts = {
      {0, lease.instance_id, "t1", "a", AlertKind::kNeedsOperator, AlertState::kOpen, "m", 0}};
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());

  InstanceFilter filter;
  filter.error_class = ErrorClass::kUnknown;
  auto found = *store_->ListInstances(filter);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].key, "k2");
  filter = {};
  filter.alert_kind = AlertKind::kNeedsOperator;
  EXPECT_EQ(store_->ListInstances(filter)->size(), 1u);
  filter.alert_kind = AlertKind::kCompensationFailed;
  EXPECT_EQ(store_->ListInstances(filter)->size(), 0u);
  filter = {};
  filter.created_from = 2000;
  filter.created_to = 4000;
  auto window = *store_->ListInstances(filter);
  ASSERT_EQ(window.size(), 2u);
  EXPECT_EQ(window[0].key, "k1");
  filter = {};
  filter.limit = 2;
  auto page = *store_->ListInstances(filter);
  ASSERT_EQ(page.size(), 2u);
  filter.after_id = page[1].id;
  auto next = *store_->ListInstances(filter);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].key, "k2");
  // A lease that ran out unreleased and is claimed again is a takeover.
  ASSERT_TRUE(store_->ClaimInstance(lease.instance_id, "w2", 20000, 5000).ok());
  EXPECT_EQ(store_->Summary()->lease_takeovers, 1);
}

TEST_P(StoreConformanceTest, StartEventsAreClaimedPerTenantWithTheirData) {
  NewInstance a = Instance("k1");
  a.event_source = "/crm";
  a.event_id = "ev-9";
  a.event_data_hash = "data-a";
  auto first = store_->StartInstance(a);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outcome, StartOutcome::kCreated);
  // Another tenant, the same (source, id): its own effect.
  NewInstance b = a;
  b.tenant = "t2";
  b.started_event.event_id = "ev-k1-t2";
  auto second = store_->StartInstance(b);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->outcome, StartOutcome::kCreated);
  EXPECT_NE(second->instance.id, first->instance.id);
  EXPECT_EQ(second->instance.tenant, "t2");
  // Same tenant, same id, same data: a duplicate naming this tenant's instance.
  auto again = store_->StartInstance(a);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, StartOutcome::kDuplicateEvent);
  EXPECT_EQ(again->instance.id, first->instance.id);
  // Same tenant, same id, other data: a conflict naming the stored hash; nothing made.
  NewInstance changed = a;
  changed.key = "k-other";
  changed.event_data_hash = "data-b";
  auto conflict = store_->StartInstance(changed);
  ASSERT_TRUE(conflict.ok()) << conflict.status();
  EXPECT_EQ(conflict->outcome, StartOutcome::kEventConflict);
  EXPECT_EQ(conflict->stored_data_hash, "data-a");
  EXPECT_TRUE(absl::IsNotFound(store_->FindInstance("t1", "k-other").status()));
}

TEST_P(StoreConformanceTest, ABusinessKeyHeldByOneWorkflowIsAConflictForAnother) {
  ASSERT_TRUE(store_->StartInstance(Instance("k1")).ok());
  NewInstance other = Instance("k1");
  other.workflow = "other-wf";
  auto started = store_->StartInstance(other);
  ASSERT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(started.status().message().find("workflow 'wf'"), std::string::npos)
      << started.status();
}

TEST_P(StoreConformanceTest, ABatchAppliesItsChangesInOrder) {
  // Step names a text[] literal must quote: the steps of a start are inserted as one.
  NewInstance first = Instance("k1");
  first.step_names = {"one", "tw\"o", "th,ree", "f{our}", "fi\\ve"};
  auto a = store_->StartInstance(first);
  auto b = store_->StartInstance(Instance("k2"));
  ASSERT_TRUE(a.ok() && b.ok());
  auto steps_of_a = *store_->GetSteps(a->instance.id);
  ASSERT_EQ(steps_of_a.size(), 5u);
  for (size_t i = 0; i < steps_of_a.size(); ++i) {
    EXPECT_EQ(steps_of_a[i].name, first.step_names[i]);
    EXPECT_EQ(steps_of_a[i].index, static_cast<int>(i));
  }
  auto leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 2u);
  const Lease& lease_a = leases[0].instance_id == a->instance.id ? leases[0] : leases[1];
  const Lease& lease_b = leases[0].instance_id == a->instance.id ? leases[1] : leases[0];
  // Two changes of one instance in one batch, the second after the first, with an
  // attempt each on the same step, and a change of another instance between them.
  Change running;
  running.lease = lease_a;
  running.now = 2001;
  running.lease_expires_at = 7000;
  StepRecord step = steps_of_a[0];
  step.state = StepState::kRunning;
  running.steps = {step};
  running.attempts = {{0, 1, AttemptPhase::kCall, true, ConnectionUsed::kNew, 503,
                       ErrorClass::kTransient, "first", 2000, 2001}};
  Change other;
  other.lease = lease_b;
  other.now = 2001;
  other.lease_expires_at = 7000;
  other.events = {{0, "b-event", b->instance.id, "t1", "waystone.step.completed", "{}", 0}};
  Change done = running;
  done.now = 2002;
  done.lease_expires_at = 0;
  done.state = InstanceState::kCompleted;
  step.state = StepState::kCompleted;
  step.external_id = "order-1";
  done.steps = {step};
  done.attempts = {{0, 1, AttemptPhase::kCall, true, ConnectionUsed::kReused, 201,
                    ErrorClass::kNone, "second", 2002, 2002}};
  done.events = {{0, "a-done", a->instance.id, "t1", "waystone.instance.completed", "{}", 0}};
  auto results = store_->Commit({running, other, done});
  ASSERT_TRUE(results.ok()) << results.status();
  for (const absl::Status& r : *results) EXPECT_TRUE(r.ok()) << r;
  EXPECT_EQ(store_->GetInstance(a->instance.id)->state, InstanceState::kCompleted);
  EXPECT_EQ(store_->GetInstance(a->instance.id)->lease_expires_at, 0);
  EXPECT_EQ(store_->GetInstance(b->instance.id)->lease_expires_at, 7000);
  auto stored = (*store_->GetSteps(a->instance.id))[0];
  EXPECT_EQ(stored.state, StepState::kCompleted);
  EXPECT_EQ(stored.external_id, "order-1");
  auto attempts = *store_->ListAttempts(a->instance.id);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].seq, 1);
  EXPECT_EQ(attempts[0].detail, "first");
  EXPECT_EQ(attempts[1].seq, 2);
  EXPECT_EQ(attempts[1].detail, "second");
  // PostgreSQL hands out rows only from transactions older than every open one (of
  // any database of the cluster): wait for the horizon to pass.
  std::vector<EventRecord> events;
  testing::WaitFor(
      [&] {
        auto rows = store_->ReadOutbox(0, 100);
        if (rows.ok()) events = *rows;
        return events.size() == 4u;
      },
      std::chrono::seconds(10));
  ASSERT_EQ(events.size(), 4u);  // two started, then in the batch's order
  EXPECT_EQ(events[2].event_id, "b-event");
  EXPECT_EQ(events[3].event_id, "a-done");
}

TEST_P(StoreConformanceTest, ABatchWhoseLeasesHoldCommitsAtTheFirstTry) {
  // Checkpoints of three instances, each step and event once: PostgreSQL sends the
  // batch as one pipeline. A first try rolled back and applied again would have
  // used outbox sequence numbers it then gave up; none is missing.
  std::vector<int64_t> ids;
  for (const char* key : {"k1", "k2", "k3"}) {
    ids.push_back(store_->StartInstance(Instance(key))->instance.id);
  }
  auto leases = *store_->ClaimRunnable("w", 2000, 5000, 10);
  ASSERT_EQ(leases.size(), 3u);
  std::vector<Change> changes;
  for (const Lease& lease : leases) {
    Change c;
    c.lease = lease;
    c.now = 2001;
    c.lease_expires_at = 7000;
    StepRecord step = (*store_->GetSteps(lease.instance_id))[1];
    step.state = StepState::kCompleted;
    step.response_json = R"({"quote":"\"","list":[1,2]})";
    c.steps = {step};
    c.events = {{0, "done-" + std::to_string(lease.instance_id), lease.instance_id, "t1",
                 "waystone.step.completed", R"({"a":"b,c"})", 0}};
    changes.push_back(c);
  }
  auto results = store_->Commit(changes);
  ASSERT_TRUE(results.ok()) << results.status();
  for (const absl::Status& r : *results) EXPECT_TRUE(r.ok()) << r;
  std::vector<EventRecord> events;  // (the outbox horizon, as above)
  testing::WaitFor(
      [&] {
        auto rows = store_->ReadOutbox(0, 100);
        if (rows.ok()) events = *rows;
        return events.size() == 6u;
      },
      std::chrono::seconds(10));
  ASSERT_EQ(events.size(), 6u);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].seq, events[i - 1].seq + 1);
  EXPECT_EQ(events[5].payload_json, R"({"a":"b,c"})");
  for (int64_t id : ids) {
    auto step = (*store_->GetSteps(id))[1];
    EXPECT_EQ(step.state, StepState::kCompleted);
    EXPECT_EQ(step.response_json, R"({"quote":"\"","list":[1,2]})");
    EXPECT_EQ((*store_->GetSteps(id))[0].state, StepState::kPending);
  }
}

TEST_P(StoreConformanceTest, AttemptsAreRecordedWithTheirChange) {
  auto started = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(started.ok());
  Lease lease = (*store_->ClaimRunnable("w", 2000, 5000, 10))[0];
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 7000;
  change.attempts = {{1, 1, AttemptPhase::kCall, true, ConnectionUsed::kNew, 0,
                      ErrorClass::kUnknown, "Server returned nothing", 2000, 2001},
                     {1, 2, AttemptPhase::kLookup, true, ConnectionUsed::kNew, 200,
                      ErrorClass::kNone, "HTTP 200", 2001, 2001}};
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  auto attempts = store_->ListAttempts(started->instance.id);
  ASSERT_TRUE(attempts.ok()) << attempts.status();
  ASSERT_EQ(attempts->size(), 2u);
  EXPECT_EQ((*attempts)[0].phase, AttemptPhase::kCall);
  EXPECT_TRUE((*attempts)[0].sent);
  EXPECT_EQ((*attempts)[0].connection, ConnectionUsed::kNew);
  EXPECT_EQ((*attempts)[0].error_class, ErrorClass::kUnknown);
  EXPECT_EQ((*attempts)[0].detail, "Server returned nothing");
  EXPECT_EQ((*attempts)[1].phase, AttemptPhase::kLookup);
  EXPECT_EQ((*attempts)[1].status, 200);
  // The store numbers them: a later change never overwrites an earlier request.
  Change later = change;
  later.now = 2002;
  later.attempts = {{1, 1, AttemptPhase::kCall, true, ConnectionUsed::kNew, 201, ErrorClass::kNone,
                     "again", 2002, 2002}};
  ASSERT_TRUE((*store_->Commit({later}))[0].ok());
  attempts = store_->ListAttempts(started->instance.id);
  ASSERT_EQ(attempts->size(), 3u);
  EXPECT_EQ((*attempts)[0].seq, 1);
  EXPECT_EQ((*attempts)[0].detail, "Server returned nothing");
  EXPECT_EQ((*attempts)[2].seq, 3);
  EXPECT_EQ((*attempts)[2].detail, "again");
  // A change whose lease is lost records nothing.
  Change stale = change;
  stale.lease.epoch += 10;
  stale.attempts = {{0, 1, AttemptPhase::kCall, true, ConnectionUsed::kNew, 201, ErrorClass::kNone,
                     "", 2002, 2002}};
  EXPECT_TRUE(absl::IsAborted((*store_->Commit({stale}))[0]));
  EXPECT_EQ(store_->ListAttempts(started->instance.id)->size(), 3u);
}

// Reads every page of `query` (limit as given), following each page's last attempt.
std::vector<AttemptRecord> AllPages(Store& store, AttemptQuery query, int* pages) {
  std::vector<AttemptRecord> all;
  *pages = 0;
  while (*pages < 100) {
    auto page = store.ListAttemptPage(query);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok() || page->empty()) break;
    ++*pages;
    EXPECT_LE(static_cast<int>(page->size()), query.limit);
    all.insert(all.end(), page->begin(), page->end());
    const AttemptRecord& last = page->back();
    query.after = AttemptCursor{last.started_at, last.step_index, last.seq};
  }
  return all;
}

TEST_P(StoreConformanceTest, AttemptsArePagedNewestFirstWithoutGapsOrRepeats) {
  auto started = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(started.ok());
  const int64_t id = started->instance.id;
  Lease lease = (*store_->ClaimRunnable("w", 2000, 60'000, 10))[0];
  // Eleven attempts over both steps in three changes, the steps interleaved in time
  // and two pairs starting in the same millisecond (the step, then seq, decide).
  const std::vector<std::vector<std::pair<int, Millis>>> commits = {
      {{0, 3000}, {0, 3010}, {1, 3010}, {0, 3020}},
      {{1, 3030}, {1, 3040}, {0, 3050}},
      {{1, 3060}, {0, 3060}, {1, 3070}, {0, 3080}}};
  for (const auto& attempts : commits) {
    Change change;
    change.lease = lease;
    change.now = 3100;
    change.lease_expires_at = 60'000;
    for (const auto& [step, at] : attempts) {
      change.attempts.push_back({step, 0, AttemptPhase::kCall, true, ConnectionUsed::kReused, 503,
                                 ErrorClass::kTransient, "at " + std::to_string(at), at, at + 5,
                                 "w", lease.epoch});
    }
    ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  }
  std::vector<AttemptRecord> expected = *store_->ListAttempts(id);
  ASSERT_EQ(expected.size(), 11u);
  std::sort(expected.begin(), expected.end(), [](const AttemptRecord& a, const AttemptRecord& b) {
    return std::tie(a.started_at, a.step_index, a.seq) >
           std::tie(b.started_at, b.step_index, b.seq);
  });
  auto key = [](const std::vector<AttemptRecord>& rows) {
    std::vector<std::pair<int, int>> keys;
    for (const AttemptRecord& a : rows) keys.emplace_back(a.step_index, a.seq);
    return keys;
  };
  // Every step, pages of 3, 4 and 11: the same order, each attempt once.
  for (int limit : {3, 4, 11}) {
    int pages = 0;
    std::vector<AttemptRecord> paged =
        AllPages(*store_, {id, std::nullopt, std::nullopt, limit}, &pages);
    EXPECT_EQ(key(paged), key(expected)) << "limit " << limit;
    EXPECT_EQ(pages, (11 + limit - 1) / limit);
  }
  EXPECT_EQ(expected.front().detail, "at 3080");
  // One step: its seqs, newest first, in pages of 2.
  for (int step : {0, 1}) {
    int pages = 0;
    std::vector<AttemptRecord> paged = AllPages(*store_, {id, step, std::nullopt, 2}, &pages);
    std::vector<int> seqs;
    for (const AttemptRecord& a : paged) {
      EXPECT_EQ(a.step_index, step);
      seqs.push_back(a.seq);
    }
    const std::vector<int> want =
        step == 0 ? std::vector<int>{6, 5, 4, 3, 2, 1} : std::vector<int>{5, 4, 3, 2, 1};
    EXPECT_EQ(seqs, want) << "step " << step;
  }
  // A page of another instance, and a cursor past the oldest, are empty.
  EXPECT_TRUE(store_->ListAttemptPage({id + 1000, std::nullopt, std::nullopt, 10})->empty());
  EXPECT_TRUE(store_->ListAttemptPage({id, std::nullopt, AttemptCursor{3000, 0, 1}, 10})->empty());
  EXPECT_EQ(*store_->CountAttempts(id), (std::vector<StepAttemptCounts>{{0, 6, 6}, {1, 5, 5}}));
}

TEST_P(StoreConformanceTest, EachStepKeepsItsNewestAttemptsAndTheCounts) {
  store_.reset();
  StoreOptions options;
  options.path = path_;
  options.attempts_per_step = 3;
  auto bounded = OpenStore(options);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  store_ = std::move(*bounded);
  auto a = store_->StartInstance(Instance("k1"));
  auto b = store_->StartInstance(Instance("k2"));
  ASSERT_TRUE(a.ok() && b.ok());
  auto leases = *store_->ClaimRunnable("w", 2000, 60'000, 10);
  ASSERT_EQ(leases.size(), 2u);
  auto attempts_of = [](int step, int count, Millis from) {
    std::vector<AttemptRecord> rows;
    for (int i = 0; i < count; ++i) {
      rows.push_back({step, 0, AttemptPhase::kCall, true, ConnectionUsed::kNew, 503,
                      ErrorClass::kTransient, "n" + std::to_string(from + i), from + i, from + i,
                      "w", 1});
    }
    return rows;
  };
  // A batch of both instances: five attempts of a's step 0 (two over the bound at
  // once), one of its step 1, two of b's step 0.
  std::vector<Change> batch;
  for (const Lease& lease : leases) {
    Change c;
    c.lease = lease;
    c.now = 2001;
    c.lease_expires_at = 60'000;
    if (lease.instance_id == a->instance.id) {
      c.attempts = attempts_of(0, 5, 3000);
      c.attempts.push_back(attempts_of(1, 1, 3100)[0]);
    } else {
      c.attempts = attempts_of(0, 2, 3000);
    }
    batch.push_back(c);
  }
  auto results = store_->Commit(batch);
  ASSERT_TRUE(results.ok()) << results.status();
  for (const absl::Status& r : *results) EXPECT_TRUE(r.ok()) << r;
  auto seqs = [&](int64_t id) {
    std::vector<std::pair<int, int>> keys;
    auto rows = store_->ListAttempts(id);
    EXPECT_TRUE(rows.ok()) << rows.status();
    if (!rows.ok()) return keys;
    for (const AttemptRecord& r : *rows) keys.emplace_back(r.step_index, r.seq);
    return keys;
  };
  using Keys = std::vector<std::pair<int, int>>;
  EXPECT_EQ(seqs(a->instance.id), (Keys{{0, 3}, {0, 4}, {0, 5}, {1, 1}}));
  EXPECT_EQ(seqs(b->instance.id), (Keys{{0, 1}, {0, 2}}));
  EXPECT_EQ(*store_->CountAttempts(a->instance.id),
            (std::vector<StepAttemptCounts>{{0, 5, 3}, {1, 1, 1}}));
  // Two more of a's step 0, in a change of its own: the oldest kept go, numbering
  // goes on, and the counts say seven recorded, four dropped.
  const Lease& lease_a = leases[0].instance_id == a->instance.id ? leases[0] : leases[1];
  Change more;
  more.lease = lease_a;
  more.now = 2002;
  more.lease_expires_at = 60'000;
  more.attempts = attempts_of(0, 2, 4000);
  ASSERT_TRUE((*store_->Commit({more}))[0].ok());
  EXPECT_EQ(seqs(a->instance.id), (Keys{{0, 5}, {0, 6}, {0, 7}, {1, 1}}));
  EXPECT_EQ(*store_->CountAttempts(a->instance.id),
            (std::vector<StepAttemptCounts>{{0, 7, 3}, {1, 1, 1}}));
  EXPECT_EQ((*store_->ListAttemptPage({a->instance.id, 0, std::nullopt, 1}))[0].detail, "n4001");
  EXPECT_EQ(*store_->CountAttempts(b->instance.id), (std::vector<StepAttemptCounts>{{0, 2, 2}}));
  // A bound below one is refused.
  options.attempts_per_step = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenStore(options).status()));
}

TEST_P(StoreConformanceTest, AnAttemptKeepsTheWorkerAndLeaseEpochItWasSentUnder) {
  auto started = store_->StartInstance(Instance("k1"));
  ASSERT_TRUE(started.ok());
  Lease lease = (*store_->ClaimRunnable("host-a/17/x1", 2000, 60'000, 10))[0];
  Change change;
  change.lease = lease;
  change.now = 2001;
  change.lease_expires_at = 60'000;
  change.attempts = {{0, 0, AttemptPhase::kCall, true, ConnectionUsed::kNew, 201, ErrorClass::kNone,
                      "sent", 2000, 2001, "host-a/17/x1", lease.epoch},
                     {1, 0, AttemptPhase::kCall, false, ConnectionUsed::kNone, 0,
                      ErrorClass::kUnknown, "interrupted", 1500, 2001, "", 0}};
  ASSERT_TRUE((*store_->Commit({change}))[0].ok());
  auto page = store_->ListAttemptPage({started->instance.id, std::nullopt, std::nullopt, 10});
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].worker, "host-a/17/x1");
  EXPECT_EQ((*page)[0].lease_epoch, lease.epoch);
  EXPECT_GT(lease.epoch, 0);
  EXPECT_EQ((*page)[1].worker, "");  // not known: said so, not guessed
  EXPECT_EQ((*page)[1].lease_epoch, 0);
  EXPECT_EQ((*store_->ListAttempts(started->instance.id))[0].worker, "host-a/17/x1");
}

TEST_P(StoreConformanceTest, AMigrationMissingBelowTheNewestIsApplied) {
  // Branches own migration numbers and land in any order: a database that has 9
  // but not 8 (or any lower one) still gets it. Here 9 itself is undone and
  // forgotten, as if it had landed after the newest.
  store_.reset();
  ASSERT_TRUE(RawExec("DROP INDEX attempts_newest"));
  ASSERT_TRUE(RawExec("ALTER TABLE attempts DROP COLUMN worker"));
  ASSERT_TRUE(RawExec("ALTER TABLE attempts DROP COLUMN lease_epoch"));
  ASSERT_TRUE(RawExec("DELETE FROM schema_migrations WHERE version = 9"));
  store_ = Open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(SchemaVersion(), NewestMigration());
  EXPECT_TRUE(RawExec("UPDATE attempts SET worker = worker, lease_epoch = lease_epoch"));
  EXPECT_FALSE(RawExec("CREATE INDEX attempts_newest ON attempts (instance_id)"));  // it is back
}

TEST_P(StoreConformanceTest, TokensHaveUniqueNamesExpireAndAreRevokedByName) {
  ASSERT_TRUE(store_->PutToken({"h1", "alice", "t1", "operator", 10, 0, 0}).ok());
  ASSERT_TRUE(store_->PutToken({"h2", "bob", "t1", "viewer", 11, 0, 5000}).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(store_->PutToken({"h3", "alice", "t2", "viewer", 12, 0, 0})));
  auto tokens = store_->ListTokens();
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].name, "alice");
  EXPECT_EQ((*tokens)[1].expires_at, 5000);
  auto revocation = [](Millis at, const std::string& name) {
    return AuditRecord{
        0, at, "root", "t1", 0, "revoke_token", "left", "{\"token\":\"" + name + "\"}"};
  };
  ASSERT_TRUE(store_->RevokeToken("alice", revocation(99, "alice")).ok());
  EXPECT_EQ(store_->FindToken("h1")->revoked_at, 99);
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->RevokeToken("alice", revocation(100, "alice"))));
  EXPECT_TRUE(absl::IsNotFound(store_->RevokeToken("carol", revocation(100, "carol"))));
  // One audit record, of the revocation that happened, in the same transaction.
  auto audit = store_->ListAudit(0);
  ASSERT_TRUE(audit.ok()) << audit.status();
  ASSERT_EQ(audit->size(), 1u);
  EXPECT_EQ((*audit)[0].at, 99);
  EXPECT_EQ((*audit)[0].action, "revoke_token");
  EXPECT_EQ((*audit)[0].reason, "left");
  EXPECT_EQ(store_->FindToken("h2")->revoked_at, 0);
}

TEST_P(StoreConformanceTest, TheDatabaseMadeItsOwnPublicIdKey) {
  auto key = store_->ServerKey("public_ids");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->size(), 64u);
  EXPECT_EQ(key->find_first_not_of("0123456789abcdef"), std::string::npos) << *key;
  EXPECT_TRUE(absl::IsNotFound(store_->ServerKey("nothing").status()));
}

// A batch over `count` instances of tenant t1 (started here), created at 1000.
BatchRecord MakeBatch(Store& store, const std::string& public_id, int count,
                      const std::string& tenant = "t1") {
  NewBatch batch;
  batch.batch.public_id = public_id;
  batch.batch.tenant = tenant;
  batch.batch.actor = "alice";
  batch.batch.reason = "the ERP came back";
  batch.batch.action = "retry";
  batch.batch.action_json = R"({"step":"one"})";
  batch.batch.filter_json = R"({"state":"needs_attention"})";
  for (int i = 0; i < count; ++i) {
    batch.items.push_back({1000 + i, public_id + "-key-" + std::to_string(i)});
  }
  batch.now = 1000;
  auto created = store.CreateBatch(batch);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? *created : BatchRecord{};
}

int64_t CountOf(const BatchRecord& batch, BatchItemState state) {
  for (const auto& [s, n] : batch.counts) {
    if (s == state) return n;
  }
  return -1;
}

TEST_P(StoreConformanceTest, ABatchKeepsItsItemsAndMovesThroughItsStates) {
  const BatchRecord first = MakeBatch(*store_, "b1", 3);
  const BatchRecord other = MakeBatch(*store_, "b2", 1, "t2");
  EXPECT_EQ(first.total, 3);
  EXPECT_EQ(CountOf(first, BatchItemState::kPending), 3);
  EXPECT_EQ(first.state, BatchState::kRunning);
  auto found = store_->FindBatch("b1");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->id, first.id);
  EXPECT_EQ(found->reason, "the ERP came back");
  EXPECT_EQ(found->action_json, R"({"step":"one"})");
  EXPECT_TRUE(absl::IsNotFound(store_->FindBatch("nope").status()));
  EXPECT_TRUE(absl::IsNotFound(store_->GetBatch(first.id + 100).status()));

  auto all = store_->ListBatches({});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].public_id, "b2");  // newest first
  BatchFilter of_t1;
  of_t1.tenant = "t1";
  EXPECT_EQ(store_->ListBatches(of_t1)->size(), 1u);
  BatchFilter older;
  older.before_id = other.id;
  EXPECT_EQ(store_->ListBatches(older)->front().public_id, "b1");

  auto page = store_->ListBatchItems(first.id, 0, 2);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].instance_key, "b1-key-0");
  EXPECT_EQ((*page)[0].instance_id, 1000);
  auto rest = store_->ListBatchItems(first.id, page->back().id, 2);
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ(rest->front().instance_key, "b1-key-2");

  // Paused: nothing of it is taken; resumed: its items are.
  ASSERT_TRUE(
      store_->ChangeBatchState(first.id, {BatchState::kRunning}, BatchState::kPaused, 1100).ok());
  ASSERT_TRUE(
      store_->ChangeBatchState(other.id, {BatchState::kRunning}, BatchState::kPaused, 1100).ok());
  EXPECT_TRUE(store_->ClaimBatchItems("r", 1200, 1000, 10)->empty());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      store_->ChangeBatchState(first.id, {BatchState::kRunning}, BatchState::kPaused, 1200)));
  ASSERT_TRUE(
      store_->ChangeBatchState(first.id, {BatchState::kPaused}, BatchState::kRunning, 1300).ok());
  auto claimed = store_->ClaimBatchItems("r", 1400, 1000, 2);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 2u);
  EXPECT_EQ((*claimed)[0].state, BatchItemState::kApplying);
  EXPECT_EQ((*claimed)[0].owner, "r");
  EXPECT_EQ((*claimed)[0].tries, 1);

  // Applied, then judged; the third item stays pending until the cancel.
  BatchItemUpdate applied{(*claimed)[0].id,
                          BatchItemState::kApplying,
                          "r",
                          BatchItemState::kApplied,
                          "running",
                          "",
                          1500};
  ASSERT_TRUE(store_->UpdateBatchItem(applied).ok());
  auto waiting = store_->AppliedBatchItems(10);
  ASSERT_EQ(waiting->size(), 1u);
  EXPECT_EQ(waiting->front().applied_at, 1500);
  BatchItemUpdate judged{(*claimed)[0].id,
                         BatchItemState::kApplied,
                         "",
                         BatchItemState::kSucceeded,
                         "completed",
                         "",
                         1600};
  ASSERT_TRUE(store_->UpdateBatchItem(judged).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->UpdateBatchItem(judged)));  // moved on
  BatchItemUpdate refused{(*claimed)[1].id,
                          BatchItemState::kApplying,
                          "r",
                          BatchItemState::kRefused,
                          "",
                          "instance 'x' is completed",
                          1600};
  ASSERT_TRUE(store_->UpdateBatchItem(refused).ok());
  EXPECT_EQ(store_->GetBatch(first.id)->state, BatchState::kRunning);  // one is pending

  ASSERT_TRUE(store_
                  ->ChangeBatchState(first.id, {BatchState::kRunning, BatchState::kPaused},
                                     BatchState::kCancelled, 1700)
                  .ok());
  auto cancelled = store_->GetBatch(first.id);
  EXPECT_EQ(cancelled->state, BatchState::kCancelled);
  EXPECT_EQ(CountOf(*cancelled, BatchItemState::kSucceeded), 1);
  EXPECT_EQ(CountOf(*cancelled, BatchItemState::kRefused), 1);
  EXPECT_EQ(CountOf(*cancelled, BatchItemState::kCancelled), 1);
  EXPECT_EQ(CountOf(*cancelled, BatchItemState::kPending), 0);
  auto items = store_->ListBatchItems(first.id, 0, 10);
  EXPECT_EQ((*items)[0].result_state, "completed");
  EXPECT_EQ((*items)[0].finished_at, 1600);
  EXPECT_EQ((*items)[1].message, "instance 'x' is completed");
  EXPECT_EQ((*items)[2].finished_at, 1700);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      store_->ChangeBatchState(first.id, {BatchState::kPaused}, BatchState::kRunning, 1800)));
  EXPECT_TRUE(store_->ClaimBatchItems("r", 1900, 1000, 10)->empty());
}

TEST_P(StoreConformanceTest, AnExpiredBatchClaimIsTakenAgainAndTheLastItemFinishesTheBatch) {
  const BatchRecord batch = MakeBatch(*store_, "b1", 1);
  auto a = store_->ClaimBatchItems("runner-a", 2000, 100, 10);
  ASSERT_EQ(a->size(), 1u);
  EXPECT_TRUE(store_->ClaimBatchItems("runner-b", 2050, 100, 10)->empty());  // still a's
  auto b = store_->ClaimBatchItems("runner-b", 2100, 100, 10);
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ(b->front().tries, 2);
  EXPECT_EQ(b->front().owner, "runner-b");
  BatchItemUpdate late{
      a->front().id, BatchItemState::kApplying, "runner-a", BatchItemState::kApplied, "", "", 2150};
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->UpdateBatchItem(late)));  // not a's any more
  late.owner = "runner-b";
  late.to = BatchItemState::kStopped;
  ASSERT_TRUE(store_->UpdateBatchItem(late).ok());
  auto finished = store_->GetBatch(batch.id);
  EXPECT_EQ(finished->state, BatchState::kFinished);
  EXPECT_EQ(CountOf(*finished, BatchItemState::kStopped), 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      store_->ChangeBatchState(batch.id, {BatchState::kRunning}, BatchState::kPaused, 2200)));
}

TEST_P(StoreConformanceTest, TwoRunnersClaimingAtOnceNeverTakeTheSameBatchItem) {
  MakeBatch(*store_, "b1", 60);
  auto other = Open();
  std::vector<int64_t> taken[2];
  auto claim = [&](Store* store, const std::string& owner, std::vector<int64_t>* out) {
    for (int round = 0; round < 40; ++round) {
      auto items = store->ClaimBatchItems(owner, 5000, 60'000, 3);
      ASSERT_TRUE(items.ok()) << items.status();
      for (const BatchItemRecord& item : *items) out->push_back(item.id);
    }
  };
  std::thread a(claim, store_.get(), "a", &taken[0]);
  std::thread b(claim, other.get(), "b", &taken[1]);
  a.join();
  b.join();
  std::set<int64_t> distinct(taken[0].begin(), taken[0].end());
  distinct.insert(taken[1].begin(), taken[1].end());
  EXPECT_EQ(taken[0].size() + taken[1].size(), 60u);
  EXPECT_EQ(distinct.size(), 60u);
}

// --- Protected targets (TargetStore) --------------------------------------------

TargetCallAsk Ask(const std::string& permit, Millis now, TargetLimits limits) {
  TargetCallAsk ask;
  ask.tenant = "t1";
  ask.target = "erp";
  ask.limits = limits;
  ask.now = now;
  ask.horizon = 1000;
  ask.call_lease = 30'000;
  ask.permit = permit;
  return ask;
}

TEST_P(StoreConformanceTest, TwoConnectionsShareOneConcurrencyCapAndPermitsExpire) {
  auto other = Open();
  TargetLimits limits;
  limits.concurrency = 3;
  std::mutex mu;
  std::vector<std::string> admitted;
  auto admit_many = [&](Store* store, const std::string& who) {
    for (int i = 0; i < 10; ++i) {
      auto a = store->AdmitTargetCall(Ask(who + std::to_string(i), 1000, limits));
      ASSERT_TRUE(a.ok()) << a.status();
      std::lock_guard<std::mutex> lock(mu);
      if (a->admitted) admitted.push_back(who + std::to_string(i));
    }
  };
  std::thread a([&] { admit_many(store_.get(), "a"); });
  std::thread b([&] { admit_many(other.get(), "b"); });
  a.join();
  b.join();
  ASSERT_EQ(admitted.size(), 3u);
  auto listed = store_->ListTargetControls("t1", 1000);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].calls, 3);
  // Settling one frees its place, and only its own.
  ASSERT_TRUE(
      other->SettleTargetCall({"t1", "erp", limits, admitted[0], false, CallHealth::kHealthy, 1100})
          .ok());
  EXPECT_EQ(store_->ListTargetControls("t1", 1100)->at(0).calls, 2);
  EXPECT_TRUE(store_->AdmitTargetCall(Ask("c1", 1200, limits))->admitted);
  EXPECT_FALSE(store_->AdmitTargetCall(Ask("c2", 1200, limits))->admitted);
  // A worker that died holding permits holds them only until they expire.
  EXPECT_TRUE(store_->AdmitTargetCall(Ask("c3", 1000 + 30'000, limits))->admitted);
  EXPECT_EQ(store_->ListTargetControls("t1", 31'100)->at(0).calls, 2) << "c1 and c3";
}

TEST_P(StoreConformanceTest, TwoConnectionsTakeDistinctRateSlots) {
  auto other = Open();
  TargetLimits limits;
  limits.rate = 10;
  std::vector<Millis> slots[2];
  auto admit_many = [&](Store* store, int who) {
    for (int i = 0; i < 20; ++i) {
      auto a =
          store->AdmitTargetCall(Ask(std::to_string(who) + "-" + std::to_string(i), 0, limits));
      ASSERT_TRUE(a.ok()) << a.status();
      if (a->admitted) slots[who].push_back(a->send_at);
    }
  };
  std::thread a([&] { admit_many(store_.get(), 0); });
  std::thread b([&] { admit_many(other.get(), 1); });
  a.join();
  b.join();
  std::vector<Millis> all = slots[0];
  all.insert(all.end(), slots[1].begin(), slots[1].end());
  std::sort(all.begin(), all.end());
  std::vector<Millis> expected;
  for (Millis at = 0; at <= 1000; at += 100) expected.push_back(at);
  EXPECT_EQ(all, expected) << "one slot every 100 ms up to the horizon, none shared";
}

// A call whose slot passed before it could leave takes the next free one: after the
// slots given out (none of them shared), or now when those have passed too.
TEST_P(StoreConformanceTest, ALateCallRetakesTheNextFreeRateSlot) {
  TargetLimits limits;
  limits.rate = 10;
  for (int i = 0; i < 3; ++i) {  // slots 0, 100 and 200
    auto a = store_->AdmitTargetCall(Ask("held-" + std::to_string(i), 0, limits));
    ASSERT_TRUE(a.ok() && a->admitted) << i;
  }
  auto ask = Ask("held-0", 150, limits);
  auto retaken = store_->RetakeRateSlot(ask);
  ASSERT_TRUE(retaken.ok()) << retaken.status();
  EXPECT_EQ(*retaken, 300) << "after the slots given out";
  EXPECT_EQ(store_->AdmitTargetCall(Ask("next", 150, limits))->send_at, 400);
  ask.now = 2000;  // all of them passed: now, and the next one a slot later
  EXPECT_EQ(store_->RetakeRateSlot(ask).value_or(-1), 2000);
  EXPECT_EQ(store_->AdmitTargetCall(Ask("after", 2000, limits))->send_at, 2100);
  // The permits are the five admissions' (a retake takes none): a cap of 6 admits a
  // sixth call, and then no seventh.
  TargetLimits capped = limits;
  capped.concurrency = 6;
  EXPECT_TRUE(store_->AdmitTargetCall(Ask("sixth", 2000, capped))->admitted);
  EXPECT_FALSE(store_->AdmitTargetCall(Ask("seventh", 2000, capped))->admitted);
}

TEST_P(StoreConformanceTest, APauseIsAuditedStopsAdmissionsAndIsNotRepeated) {
  AuditRecord pause;
  pause.at = 5000;
  pause.actor = "alice";
  pause.tenant = "t1";
  pause.action = "target.pause";
  pause.reason = "ERP maintenance";
  pause.detail_json = R"({"target":"erp"})";
  auto paused = store_->PauseTarget("t1", "erp", true, pause);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_TRUE(paused->paused);
  EXPECT_EQ(paused->paused_by, "alice");
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->PauseTarget("t1", "erp", true, pause).status()));
  auto refused = store_->AdmitTargetCall(Ask("p1", 5100, {}));
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE(refused->admitted);
  EXPECT_NE(refused->reason.find("paused by alice"), std::string::npos) << refused->reason;
  // Another tenant's target of the same name is not paused.
  TargetCallAsk elsewhere = Ask("p2", 5100, {});
  elsewhere.tenant = "t2";
  EXPECT_TRUE(store_->AdmitTargetCall(elsewhere)->admitted);
  AuditRecord resume = pause;
  resume.at = 6000;
  resume.action = "target.resume";
  resume.reason = "back";
  auto resumed = store_->PauseTarget("t1", "erp", false, resume);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->paused);
  EXPECT_TRUE(store_->AdmitTargetCall(Ask("p3", 6100, {}))->admitted);
  auto audit = store_->ListAudit(0);
  ASSERT_TRUE(audit.ok());
  std::vector<std::string> actions;
  for (const AuditRecord& a : *audit)
    actions.push_back(a.action + " by " + a.actor + ": " + a.reason);
  EXPECT_EQ(actions, (std::vector<std::string>{"target.pause by alice: ERP maintenance",
                                               "target.resume by alice: back"}));
}

TEST_P(StoreConformanceTest, SettledFailuresOpenTheSharedCircuit) {
  auto other = Open();
  TargetLimits limits;
  limits.breaker_failures = 2;
  limits.cool_down = 10'000;
  for (Store* store : {store_.get(), other.get()}) {
    auto a = store->AdmitTargetCall(Ask(store == other.get() ? "o" : "s", 100, limits));
    ASSERT_TRUE(a.ok() && a->admitted);
  }
  ASSERT_TRUE(
      store_->SettleTargetCall({"t1", "erp", limits, "s", false, CallHealth::kFailing, 200}).ok());
  ASSERT_TRUE(
      other->SettleTargetCall({"t1", "erp", limits, "o", false, CallHealth::kFailing, 300}).ok());
  auto open = store_->AdmitTargetCall(Ask("x", 400, limits));
  ASSERT_TRUE(open.ok());
  EXPECT_FALSE(open->admitted);
  EXPECT_EQ(open->retry_at, 10'300);
  auto probe = other->AdmitTargetCall(Ask("y", 10'300, limits));
  ASSERT_TRUE(probe.ok());
  EXPECT_TRUE(probe->admitted && probe->probe);
  EXPECT_FALSE(store_->AdmitTargetCall(Ask("z", 10'301, limits))->admitted);
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreConformanceTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         testing::BackendName);

}  // namespace
}  // namespace waystone
