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
// thread. Starts are grouped the same way in a lane of their own (so on PostgreSQL
// a batch of starts commits beside a batch of checkpoints). Owns no thread.
// Thread-safe.
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
  // changes'). When the shared transaction fails as a whole, each start runs again
  // on its own, so one caller's trouble is not another's. Unavailable once stopped.
  absl::StatusOr<StartResult> Start(const NewInstance& start);

  // Changes queued for the next transaction (not in the one being committed).
  int Queued();

 private:
  // Each waiting caller has its own condition, notified under mu_ once its batch
  // settled (or, oldest queued, once it is its turn to commit), so a batch wakes
  // only its own callers and the next to commit, not every caller queued behind
  // it. Notifying under mu_ keeps the condition alive until the notify returns: the
  // caller cannot see `done` and leave before the committer lets mu_ go.
  struct Pending {
    const Change* change;
    absl::Status result;
    bool done = false;
    std::condition_variable settled;
  };
  struct PendingStart {
    const NewInstance* start;
    absl::StatusOr<StartResult> result = absl::UnknownError("not started");
    bool done = false;
    bool alone = false;  // its batch failed: the caller starts it again by itself
    std::condition_variable settled;
  };
  // What waits to be committed in one kind of transaction, and whether one of its
  // callers commits a batch of it now.
  template <typename P>
  struct Lane {
    std::deque<P*> queued;
    bool busy = false;
  };
  // Starts per transaction at most: each runs under a savepoint, and PostgreSQL
  // keeps 64 subtransactions per backend in its fast cache.
  static constexpr int kMaxStartBatch = 32;
  // The lane of changes (Pending) or of starts (PendingStart).
  template <typename P>
  Lane<P>& LaneOf() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `mine` is done (false) or nobody commits in its lane (true: this
  // caller takes the oldest queued into `batch`, commits them, then calls EndTurn).
  template <typename P>
  bool TakeTurn(P& mine, int max_batch, std::vector<P*>& batch);
  // Under mu_, once a turn's batch is answered: lets the next caller take a turn.
  template <typename P>
  void EndTurn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a turn (`run` answers `batch` and ends the turn); when it throws, answers
  // the batch Internal and ends the turn before the exception goes on.
  template <typename P, typename Run>
  void GuardTurn(const std::vector<P*>& batch, Run&& run);
  // Returns once `mine` is committed, committing batches itself whenever nobody
  // else does.
  void Settle(Pending& mine);
  // Commits `batch` (taken from the queue by this caller) and answers its callers.
  void CommitBatch(const std::vector<Pending*>& batch);
  // Runs a batch of starts in one transaction (or each alone when it fails).
  void StartAll(const std::vector<PendingStart*>& batch);

  InstanceStore* store_;
  CommitQueueOptions options_;
  Mutex mu_;
  std::condition_variable idle_;  // Stop(): nothing queued or committing
  Lane<Pending> changes_ ABSL_GUARDED_BY(mu_);
  Lane<PendingStart> starts_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace waystone
