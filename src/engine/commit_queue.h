#pragma once

#include <condition_variable>
#include <deque>
#include <vector>

#include "base/mutex.h"
#include "store/store.h"

namespace waystone {

struct CommitQueueOptions {
  // Most changes put into one transaction.
  int max_batch = 256;
};

// CommitQueue groups the changes of concurrently running instances into shared
// transactions (group commit), so a batch of checkpoints costs one fsync. Callers
// block until their change is durable. Changes are committed by their callers: one
// that finds nobody committing commits the oldest changes queued (its own among
// them) on its own thread, while those arriving meanwhile queue for the next batch
// (leader and followers), so a lone caller's commit needs no hand-over to another
// thread. Starts are grouped the same way in a lane of their own, so on PostgreSQL
// a batch of starts commits beside a batch of checkpoints; where the store has one
// writer (SQLite), a turn takes both lanes into one transaction instead, as two
// would run one after the other anyway. Owns no thread. Thread-safe.
class CommitQueue {
 public:
  CommitQueue(InstanceStore* store, CommitQueueOptions options);
  ~CommitQueue();
  CommitQueue(const CommitQueue&) = delete;
  CommitQueue& operator=(const CommitQueue&) = delete;

  void Start();
  // Waits until what is queued is committed, then stops; later calls return
  // Unavailable. The last callers may still be leaving their Commit when it
  // returns: whoever destroys the queue must have let its callers return first.
  void Stop();

  // Commits `change` with whatever else is waiting. Returns its own status: OK,
  // Aborted (lease lost), FailedPrecondition (idempotency conflict), or the
  // transaction's error (Unavailable: it may or may not have been written; whoever
  // drives the instance next reloads it).
  absl::Status Commit(const Change& change);
  // Commits `changes` as Commit does each, queued at once so that they share
  // transactions (in batches of max_batch); returns each one's status, in order.
  std::vector<absl::Status> CommitAll(const std::vector<Change>& changes);

  // Starts `start` (InstanceStore::StartInstance) in one transaction with the starts
  // of the other callers waiting at the same time (a transaction apart from the
  // changes', unless the store has one writer). When the shared transaction fails
  // as a whole, each start (and each change it held) runs again on its own, so one
  // caller's trouble is not another's. Unavailable once stopped.
  absl::StatusOr<StartResult> Start(const NewInstance& start);

  // Changes and starts queued for the next transaction (not in the one being
  // committed).
  int Queued();

 private:
  // Each waiting caller has its own mutex and condition, notified once its batch
  // settled (or, oldest queued, once it is its turn to commit), so a batch wakes
  // only its own callers and the next to commit, not every caller queued behind
  // it. A batch's callers are answered after its turn ended, outside mu_, so the
  // next turn begins while they are woken. Notifying under the caller's own mutex
  // keeps the condition alive until the notify returns: the caller cannot see
  // `done` and leave before the committer lets that mutex go.
  struct Pending {
    const Change* change;
    bool taken = false;  // under mu_: in a batch being committed
    Mutex m;
    absl::Status result ABSL_GUARDED_BY(m);
    bool done ABSL_GUARDED_BY(m) = false;
    bool turn ABSL_GUARDED_BY(m) = false;  // oldest queued, woken to take a turn
    // Its transaction, shared with starts, failed as a whole: the caller commits it
    // again by itself.
    bool alone ABSL_GUARDED_BY(m) = false;
    std::condition_variable settled;
  };
  struct PendingStart {
    const NewInstance* start;
    bool taken = false;  // under mu_
    Mutex m;
    absl::StatusOr<StartResult> result ABSL_GUARDED_BY(m) = absl::UnknownError("not started");
    bool done ABSL_GUARDED_BY(m) = false;
    bool turn ABSL_GUARDED_BY(m) = false;
    // Its batch failed: the caller starts it again by itself.
    bool alone ABSL_GUARDED_BY(m) = false;
    std::condition_variable settled;
  };
  // What waits to be committed in one kind of transaction, and whether one of its
  // callers commits a batch of it now (with one writer, changes_.busy stands for
  // both lanes).
  template <typename P>
  struct Lane {
    std::deque<P*> queued;
    bool busy = false;
  };
  // What one turn commits: changes or starts, or with one writer both.
  struct Turn {
    std::vector<Pending*> changes;
    std::vector<PendingStart*> starts;
  };
  // Starts per transaction at most: each runs under a savepoint, and PostgreSQL
  // keeps 64 subtransactions per backend in its fast cache.
  static constexpr int kMaxStartBatch = 32;
  // The lane of changes (Pending) or of starts (PendingStart).
  template <typename P>
  Lane<P>& LaneOf() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether somebody commits what `P`'s lane holds now.
  template <typename P>
  bool& BusyOf() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns once `mine` is answered, taking turns whenever nobody commits in its
  // lane; when a turn throws, takes `mine` out of the queue (Withdraw) before the
  // exception goes on.
  template <typename P>
  void AwaitAnswer(P& mine);
  // Waits until `mine` is done (false) or nobody commits in its lane (true: this
  // caller takes the oldest queued into `turn`, commits them, then calls EndTurn).
  template <typename P>
  bool TakeTurn(P& mine, Turn& turn);
  // Under mu_, once a turn is committed: lets the next caller take a turn.
  template <typename P>
  void EndTurn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: wakes the caller of the oldest queued in `P`'s lane (with one
  // writer, in each lane) to take a turn, or Stop() when nothing is queued.
  template <typename P>
  void WakeNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a caller leaving by an exception: takes `mine` out of the queue, or, when
  // another caller's batch holds it, waits for its answer (so nobody touches the
  // Pending after its caller left).
  template <typename P>
  void Withdraw(P& mine);
  // Commits `turn` (taken from the queues by this caller), ends the turn, then
  // answers its callers; when the commit throws, ends the turn, answers them
  // Internal, and the exception goes on.
  template <typename P>
  void RunTurn(const Turn& turn);
  // Returns `mine`'s status once it is committed, committing batches itself
  // whenever nobody else does (and committing it again alone when its transaction
  // shared with starts failed as a whole).
  absl::Status Settle(Pending& mine);
  // Commits the turn's changes, its starts (in `start_order`, which it sets), or
  // both in one transaction.
  absl::StatusOr<InstanceStore::Committed> CommitTurn(const Turn& turn,
                                                      std::vector<size_t>& start_order);
  // Answers each caller of the turn, each under its own mutex (the turn has ended:
  // not under mu_). A transaction that failed as a whole answers each change its
  // error and sends each start to run alone (and, when it held both, each change).
  static void Answer(const Turn& turn, const std::vector<size_t>& start_order,
                     absl::StatusOr<InstanceStore::Committed> committed);

  InstanceStore* store_;
  CommitQueueOptions options_;
  Mutex mu_;
  std::condition_variable idle_;  // Stop(): nothing queued or committing
  Lane<Pending> changes_ ABSL_GUARDED_BY(mu_);
  Lane<PendingStart> starts_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  const bool one_writer_;  // both lanes commit in one transaction (StartAndCommit)
};

}  // namespace waystone
