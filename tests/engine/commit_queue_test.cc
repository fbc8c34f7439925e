#include "engine/commit_queue.h"

#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/sha256.h"
#include "engine/engine_parts.h"
#include "support/process.h"

namespace waystone {
namespace {

// The store's instance slice, whose shared start transaction always fails as a
// whole (as a busy or lost database would): every start must then go through alone.
class FailingBatchStore final : public InstanceStore {
 public:
  explicit FailingBatchStore(InstanceStore* real) : real_(real) {}
  std::atomic<int> batches{0};
  std::atomic<int> alone{0};
  std::atomic<int> commits{0};          // transactions with changes
  std::atomic<bool> throw_next{false};  // the next change transaction throws
  // The change transactions let through: the next waits until this grows.
  std::atomic<int> allowed{std::numeric_limits<int>::max()};
  std::mutex mu;
  std::vector<std::thread::id> committed_on;  // the thread of each change transaction

  absl::StatusOr<StartResult> StartInstance(const NewInstance& in) override {
    alone.fetch_add(1);
    return real_->StartInstance(in);
  }
  absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> StartInstances(
      const std::vector<NewInstance>&) override {
    batches.fetch_add(1);
    return absl::UnavailableError("database is locked");
  }
  // With one_writer, the queue commits starts and changes together (StartAndCommit),
  // which fails as a whole when fail_together is set.
  bool one_writer = false;
  std::atomic<bool> fail_together{false};
  std::atomic<int> together{0};        // shared transactions of starts and changes
  std::vector<size_t> together_sizes;  // starts + changes in each

  absl::StatusOr<std::vector<absl::Status>> Commit(const std::vector<Change>& c) override {
    Enter();
    return real_->Commit(c);
  }
  bool OneWriter() const override { return one_writer; }
  absl::StatusOr<Committed> StartAndCommit(const std::vector<NewInstance>& starts,
                                           const std::vector<Change>& changes) override {
    Enter();
    together.fetch_add(1);
    {
      std::lock_guard lock(mu);
      together_sizes.push_back(starts.size() + changes.size());
    }
    if (fail_together) return absl::UnavailableError("database is locked");
    return real_->StartAndCommit(starts, changes);
  }
  absl::StatusOr<InstanceRecord> GetInstance(int64_t id) override { return real_->GetInstance(id); }
  absl::StatusOr<InstanceRecord> FindInstance(const std::string& t, const std::string& k) override {
    return real_->FindInstance(t, k);
  }
  absl::StatusOr<std::vector<StepRecord>> GetSteps(int64_t id) override {
    return real_->GetSteps(id);
  }
  absl::StatusOr<std::vector<KeptEvent>> GetKeptEvents(int64_t id) override {
    return real_->GetKeptEvents(id);
  }
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t id) override {
    return real_->ListAttempts(id);
  }
  absl::StatusOr<std::vector<AttemptRecord>> ListAttemptPage(const AttemptQuery& q) override {
    return real_->ListAttemptPage(q);
  }
  absl::StatusOr<std::vector<StepAttemptCounts>> CountAttempts(int64_t id) override {
    return real_->CountAttempts(id);
  }
  absl::StatusOr<TombstoneRecord> FindTombstone(const std::string& t,
                                                const std::string& k) override {
    return real_->FindTombstone(t, k);
  }
  absl::StatusOr<std::vector<InstanceRecord>> ListInstances(const InstanceFilter& f) override {
    return real_->ListInstances(f);
  }
  absl::StatusOr<std::vector<EventRecord>> ListEvents(int64_t id) override {
    return real_->ListEvents(id);
  }
  absl::StatusOr<std::vector<AuditRecord>> ListAudit(int64_t id) override {
    return real_->ListAudit(id);
  }
  absl::StatusOr<std::optional<IdempotencyClaim>> GetIdempotencyClaim(
      const std::string& t, const std::string& k) override {
    return real_->GetIdempotencyClaim(t, k);
  }
  absl::StatusOr<std::optional<InboxEntry>> LookupInbox(const std::string& t, const std::string& s,
                                                        const std::string& id) override {
    return real_->LookupInbox(t, s, id);
  }

 private:
  // A change transaction begins: recorded, thrown when asked, held at the gate.
  void Enter() {
    {
      std::lock_guard lock(mu);
      committed_on.push_back(std::this_thread::get_id());
    }
    if (throw_next.exchange(false)) throw std::runtime_error("out of something");
    const int n = commits.fetch_add(1) + 1;
    while (n > allowed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  InstanceStore* real_;
};

class CommitQueueTest : public testing::StoreWithInstances {
 protected:
  static Change Finish(const Lease& lease, Millis now) {
    Change change;
    change.lease = lease;
    change.now = now;
    change.state = InstanceState::kCompleted;
    change.lease_expires_at = 0;
    return change;
  }

  // What the callers of CommitWithTwoQueuedBehind were answered.
  struct QueuedBehind {
    absl::Status first = absl::UnknownError("not run");
    absl::Status second = absl::UnknownError("not run");
    absl::StatusOr<StartResult> started = absl::UnknownError("not run");
  };

  // Commits a change finishing `first` while `store` holds its transaction, queues a
  // change finishing `second` and a start of "new" behind it, then lets the store go.
  static QueuedBehind CommitWithTwoQueuedBehind(FailingBatchStore& store, const Lease& first,
                                                const Lease& second) {
    CommitQueue queue(&store, {});
    queue.Start();
    QueuedBehind answered;
    store.allowed = 0;
    std::thread a([&] { answered.first = queue.Commit(Finish(first, 2000)); });
    EXPECT_TRUE(
        testing::WaitFor([&] { return store.commits.load() == 1; }, std::chrono::seconds(10)));
    std::thread b([&] { answered.second = queue.Commit(Finish(second, 2000)); });
    std::thread c([&] { answered.started = queue.Start(StartOf("new")); });
    EXPECT_TRUE(testing::WaitFor([&] { return queue.Queued() == 2; }, std::chrono::seconds(10)))
        << "the start and the change did not both wait behind the held transaction";
    store.allowed = std::numeric_limits<int>::max();
    a.join();
    b.join();
    c.join();
    queue.Stop();
    return answered;
  }
};

TEST_F(CommitQueueTest, ACommitReturnsOnceTheChangeIsInTheStore) {
  const Lease lease = StartAndClaim("a", 1000, 30'000);
  CommitQueue queue(store_.get(), {});
  queue.Start();
  ASSERT_TRUE(queue.Commit(Finish(lease, 2000)).ok());
  const InstanceRecord instance = Get(lease.instance_id);
  EXPECT_EQ(instance.state, InstanceState::kCompleted);
  EXPECT_EQ(instance.lease_expires_at, 0);  // released with the change
}

// A caller that finds nobody committing commits on its own thread: no hand-over.
TEST_F(CommitQueueTest, ALoneCallerCommitsOnItsOwnThread) {
  const Lease lease = StartAndClaim("own", 1000, 30'000);
  FailingBatchStore store(store_.get());
  CommitQueue queue(&store, {});
  queue.Start();
  ASSERT_TRUE(queue.Commit(Finish(lease, 2000)).ok());
  EXPECT_EQ(store.committed_on, (std::vector<std::thread::id>{std::this_thread::get_id()}));
  EXPECT_EQ(Get(lease.instance_id).state, InstanceState::kCompleted);
}

// While one caller commits, another's change waits for the next transaction, which
// its own caller commits; Stop() returns only once both are in the store.
TEST_F(CommitQueueTest, AChangeQueuedBehindACommitIsCommittedNextAndStopWaitsForIt) {
  const Lease first = StartAndClaim("first", 1000, 30'000);
  const Lease second = StartAndClaim("second", 1000, 30'000);
  FailingBatchStore store(store_.get());
  CommitQueue queue(&store, {});
  queue.Start();
  store.allowed = 0;
  absl::Status first_result = absl::UnknownError("not run");
  absl::Status second_result = absl::UnknownError("not run");
  std::thread::id second_thread;
  std::thread a([&] { first_result = queue.Commit(Finish(first, 2000)); });
  ASSERT_TRUE(
      testing::WaitFor([&] { return store.commits.load() == 1; }, std::chrono::seconds(10)));
  std::thread b([&] {
    second_thread = std::this_thread::get_id();
    second_result = queue.Commit(Finish(second, 2000));
  });
  ASSERT_TRUE(testing::WaitFor([&] { return queue.Queued() == 1; }, std::chrono::seconds(10)));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    queue.Stop();
    stopped = true;
  });
  // a's transaction goes through; b's is taken next and held.
  store.allowed = 1;
  a.join();
  EXPECT_TRUE(
      testing::WaitFor([&] { return store.commits.load() == 2; }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(stopped.load()) << "Stop() returned with a queued change not yet committed";
  store.allowed = 2;
  b.join();
  stopper.join();
  EXPECT_TRUE(first_result.ok()) << first_result;
  EXPECT_TRUE(second_result.ok()) << second_result;
  EXPECT_EQ(store.commits.load(), 2);
  ASSERT_EQ(store.committed_on.size(), 2u);
  EXPECT_EQ(store.committed_on[1], second_thread);
  EXPECT_EQ(Get(first.instance_id).state, InstanceState::kCompleted);
  EXPECT_EQ(Get(second.instance_id).state, InstanceState::kCompleted);
  EXPECT_TRUE(absl::IsUnavailable(queue.Commit(Finish(first, 3000))));
}

// A commit that throws reaches its caller, and the next caller still commits: the
// turn it held ends (a regression hangs here).
TEST_F(CommitQueueTest, ACommitThatThrowsLeavesTheQueueToTheNextCaller) {
  const Lease lease = StartAndClaim("throws", 1000, 30'000);
  FailingBatchStore store(store_.get());
  CommitQueue queue(&store, {});
  queue.Start();
  store.throw_next = true;
  EXPECT_THROW((void)queue.Commit(Finish(lease, 2000)), std::runtime_error);
  EXPECT_EQ(Get(lease.instance_id).state, InstanceState::kRunning);
  EXPECT_TRUE(queue.Commit(Finish(lease, 2000)).ok());
  EXPECT_EQ(Get(lease.instance_id).state, InstanceState::kCompleted);
  queue.Stop();
}

TEST_F(CommitQueueTest, AStaleLeaseIsAbortedAndTheOthersStillCommit) {
  std::vector<Lease> leases;
  for (int i = 0; i < 8; ++i) {
    leases.push_back(StartAndClaim("k" + std::to_string(i), 1000, 30'000));
  }
  Lease stale = leases[3];
  stale.epoch += 1;                      // another worker's claim since
  CommitQueue queue(store_.get(), {2});  // several batches, each under savepoints
  queue.Start();
  std::vector<absl::Status> results(leases.size());
  std::vector<std::thread> callers;
  for (size_t i = 0; i < leases.size(); ++i) {
    callers.emplace_back(
        [&, i] { results[i] = queue.Commit(Finish(i == 3 ? stale : leases[i], 2000)); });
  }
  for (auto& t : callers) t.join();
  for (size_t i = 0; i < leases.size(); ++i) {
    if (i == 3) {
      EXPECT_TRUE(absl::IsAborted(results[i])) << results[i];
      EXPECT_EQ(Get(leases[i].instance_id).state, InstanceState::kRunning);
    } else {
      EXPECT_TRUE(results[i].ok()) << i << ": " << results[i];
      EXPECT_EQ(Get(leases[i].instance_id).state, InstanceState::kCompleted) << i;
    }
  }
}

TEST_F(CommitQueueTest, ManyCallersAtOnceAreEachAnsweredWithTheirOwnResult) {
  constexpr int kCallers = 40;
  std::vector<Lease> leases;
  for (int i = 0; i < kCallers; ++i) {
    leases.push_back(StartAndClaim("m" + std::to_string(i), 1000, 30'000));
  }
  CommitQueue queue(store_.get(), {});
  queue.Start();
  std::vector<absl::Status> results(kCallers, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      Change renew;
      renew.lease = leases[i];
      renew.now = 2000;
      renew.lease_expires_at = 2000 + 1000 + i;  // each caller's own, to tell them apart
      results[i] = queue.Commit(renew);
    });
  }
  for (auto& t : callers) t.join();
  for (int i = 0; i < kCallers; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i];
    EXPECT_EQ(Get(leases[i].instance_id).lease_expires_at, 3000 + i);
  }
}

TEST_F(CommitQueueTest, ANotStartedOrStoppedQueueRefusesAndWritesNothing) {
  const Lease lease = StartAndClaim("s", 1000, 30'000);
  CommitQueue queue(store_.get(), {});
  EXPECT_TRUE(absl::IsUnavailable(queue.Commit(Finish(lease, 2000))));
  queue.Start();
  queue.Stop();
  EXPECT_TRUE(absl::IsUnavailable(queue.Commit(Finish(lease, 2000))));
  EXPECT_EQ(Get(lease.instance_id).state, InstanceState::kRunning);
  queue.Stop();  // a second Stop is harmless
}

TEST_F(CommitQueueTest, ConcurrentStartsOfOneKeyMakeOneInstanceAndTheOthersFindIt) {
  CommitQueue queue(store_.get(), {});
  queue.Start();
  constexpr int kCallers = 24;
  std::vector<absl::StatusOr<StartResult>> results(kCallers, absl::UnknownError("not run"));
  {
    std::vector<std::jthread> callers;
    for (int i = 0; i < kCallers; ++i) {
      // Half start "same", half a key of their own.
      callers.emplace_back([&, i] {
        results[i] = queue.Start(StartOf(i % 2 == 0 ? "same" : "own-" + std::to_string(i)));
      });
    }
  }
  int created_same = 0;
  int64_t same_id = 0;
  for (int i = 0; i < kCallers; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    if (i % 2 == 1) {
      EXPECT_EQ(results[i]->outcome, StartOutcome::kCreated) << i;
      continue;
    }
    if (results[i]->outcome == StartOutcome::kCreated) ++created_same;
    if (same_id == 0) same_id = results[i]->instance.id;
    EXPECT_EQ(results[i]->instance.id, same_id) << i;
  }
  EXPECT_EQ(created_same, 1);
  EXPECT_EQ(store_->ListEvents(same_id)->size(), 1u);
  queue.Stop();
  EXPECT_EQ(queue.Start(StartOf("late")).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CommitQueueTest, CommitAllSharesTransactionsAndAnswersEachChangeInOrder) {
  std::vector<Lease> leases;
  for (int i = 0; i < 40; ++i)
    leases.push_back(StartAndClaim("r" + std::to_string(i), 1000, 30'000));
  leases[7].epoch += 1;  // another worker's claim since
  FailingBatchStore counting(store_.get());
  CommitQueue queue(&counting, {16});
  queue.Start();
  std::vector<Change> renewals;
  for (const Lease& lease : leases) {
    Change renew;
    renew.lease = lease;
    renew.now = 2000;
    renew.lease_expires_at = 2000 + 30'000;
    renewals.push_back(renew);
  }
  const std::vector<absl::Status> results = queue.CommitAll(renewals);
  ASSERT_EQ(results.size(), leases.size());
  for (size_t i = 0; i < leases.size(); ++i) {
    if (i == 7) {
      EXPECT_TRUE(absl::IsAborted(results[i])) << results[i];
      EXPECT_EQ(Get(leases[i].instance_id).lease_expires_at, 1000 + 30'000);
    } else {
      EXPECT_TRUE(results[i].ok()) << i << ": " << results[i];
      EXPECT_EQ(Get(leases[i].instance_id).lease_expires_at, 2000 + 30'000) << i;
    }
  }
  // 40 changes in batches of at most 16: three transactions, not forty.
  EXPECT_LE(counting.commits.load(), 3);
  queue.Stop();
}

TEST_F(CommitQueueTest, WhenTheSharedStartTransactionFailsEachStartRunsAgainAlone) {
  FailingBatchStore failing(store_.get());
  CommitQueue queue(&failing, {});
  queue.Start();
  constexpr int kCallers = 16;
  std::vector<absl::StatusOr<StartResult>> results(kCallers, absl::UnknownError("not run"));
  {
    std::vector<std::jthread> callers;
    for (int i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] { results[i] = queue.Start(StartOf("k" + std::to_string(i))); });
    }
  }
  for (int i = 0; i < kCallers; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->outcome, StartOutcome::kCreated);
  }
  // Each start was made exactly once: alone, after its batch (if it had one) failed.
  EXPECT_EQ(failing.alone.load(), kCallers);
  for (int i = 0; i < kCallers; ++i) {
    EXPECT_TRUE(store_->FindInstance("t1", "k" + std::to_string(i)).ok()) << i;
  }
  queue.Stop();
}

// With one writer (SQLite), what queued behind a commit goes in one transaction,
// starts and changes alike, and each caller gets its own answer.
TEST_F(CommitQueueTest, WithOneWriterStartsAndChangesQueuedTogetherShareOneTransaction) {
  const Lease first = StartAndClaim("first", 1000, 30'000);
  const Lease second = StartAndClaim("second", 1000, 30'000);
  FailingBatchStore store(store_.get());
  store.one_writer = true;
  const QueuedBehind answered = CommitWithTwoQueuedBehind(store, first, second);
  EXPECT_TRUE(answered.first.ok()) << answered.first;
  EXPECT_TRUE(answered.second.ok()) << answered.second;
  ASSERT_TRUE(answered.started.ok()) << answered.started.status();
  EXPECT_EQ(answered.started->outcome, StartOutcome::kCreated);
  // first's transaction, then one for second's change and the start together.
  EXPECT_EQ(store.commits.load(), 2);
  EXPECT_EQ(store.together.load(), 1);
  EXPECT_EQ(store.together_sizes, std::vector<size_t>{2});
  EXPECT_EQ(store.alone.load(), 0);
  EXPECT_EQ(store.batches.load(), 0);
  EXPECT_EQ(Get(second.instance_id).state, InstanceState::kCompleted);
  EXPECT_EQ(Get(answered.started->instance.id).state, InstanceState::kRunning);
}

// When the shared transaction fails as a whole (for the start's sake or the
// change's), each runs again alone: a start's trouble is not a change's.
TEST_F(CommitQueueTest, WithOneWriterAFailedSharedTransactionSendsTheStartAndTheChangeEachAlone) {
  const Lease first = StartAndClaim("first", 1000, 30'000);
  const Lease second = StartAndClaim("second", 1000, 30'000);
  FailingBatchStore store(store_.get());
  store.one_writer = true;
  store.fail_together = true;
  const QueuedBehind answered = CommitWithTwoQueuedBehind(store, first, second);
  EXPECT_TRUE(answered.first.ok()) << answered.first;
  EXPECT_TRUE(answered.second.ok()) << answered.second;
  ASSERT_TRUE(answered.started.ok()) << answered.started.status();
  EXPECT_EQ(answered.started->outcome, StartOutcome::kCreated);
  EXPECT_EQ(store.together.load(), 1);
  EXPECT_EQ(store.alone.load(), 1);
  EXPECT_EQ(store.commits.load(), 3);  // first's, the shared one, the change alone
  EXPECT_EQ(Get(second.instance_id).state, InstanceState::kCompleted);
  EXPECT_TRUE(store_->FindInstance("t1", "new").ok());
}

// A CommitAll whose first transaction throws takes its changes still queued out of
// the queue before they go: the next caller commits alone, and nothing it was
// left is a change that no longer exists.
TEST_F(CommitQueueTest, ACommitAllThatThrowsLeavesNothingOfItsOwnQueued) {
  std::vector<Change> changes;
  for (int i = 0; i < 40; ++i) {
    changes.push_back(Finish(StartAndClaim("r" + std::to_string(i), 1000, 30'000), 2000));
  }
  const Lease after = StartAndClaim("after", 1000, 30'000);
  FailingBatchStore store(store_.get());
  CommitQueue queue(&store, {16});
  queue.Start();
  store.throw_next = true;
  EXPECT_THROW((void)queue.CommitAll(changes), std::runtime_error);
  EXPECT_EQ(queue.Queued(), 0);
  store.committed_on.clear();
  EXPECT_TRUE(queue.Commit(Finish(after, 3000)).ok());
  EXPECT_EQ(store.commits.load(), 1);  // `after` alone (the one that threw counts none)
  EXPECT_EQ(Get(after.instance_id).state, InstanceState::kCompleted);
  queue.Stop();
}

}  // namespace
}  // namespace waystone
