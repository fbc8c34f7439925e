#include "engine/commit_queue.h"

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status_macros.h"
#include "engine/redaction.h"

namespace waystone {

CommitQueue::CommitQueue(InstanceStore* store, CommitQueueOptions options)
    : store_(store), options_(options), one_writer_(store->OneWriter()) {
  options_.max_batch = std::max(1, options_.max_batch);
}

CommitQueue::~CommitQueue() { Stop(); }

void CommitQueue::Start() {
  MutexLock lock(mu_);
  running_ = true;
}

void CommitQueue::Stop() {
  MutexLock lock(mu_);
  running_ = false;
  // What was queued before is committed by its callers; wait until it is.
  while (changes_.busy || !changes_.queued.empty() || starts_.busy || !starts_.queued.empty()) {
    idle_.wait(lock.native());
  }
}

template <>
CommitQueue::Lane<CommitQueue::Pending>& CommitQueue::LaneOf() {
  return changes_;
}

template <>
CommitQueue::Lane<CommitQueue::PendingStart>& CommitQueue::LaneOf() {
  return starts_;
}

template <typename P>
bool& CommitQueue::BusyOf() {
  return one_writer_ ? changes_.busy : LaneOf<P>().busy;
}

namespace {

// Moves the oldest of `queued`, up to `most`, into `batch`.
template <typename P>
void TakeOldest(std::deque<P*>& queued, int most, std::vector<P*>& batch) {
  while (!queued.empty() && static_cast<int>(batch.size()) < most) {
    batch.push_back(queued.front());
    batch.back()->taken = true;
    queued.pop_front();
  }
}

// Wakes the caller of the oldest of `queued` to take a turn; false when nothing is
// queued. (Under the queue's mutex: what is queued is not yet taken, so its caller
// still waits and the Pending lives.)
template <typename P>
bool WakeOldest(const std::deque<P*>& queued) {
  if (queued.empty()) return false;
  P& oldest = *queued.front();
  MutexLock lock(oldest.m);
  oldest.turn = true;
  oldest.settled.notify_one();
  return true;
}

// Answers `pending` under its own mutex: its caller may leave as soon as that is let
// go, so nothing touches it afterwards.
template <typename P, typename Result>
void Settled(P& pending, Result&& result, bool alone) {
  MutexLock lock(pending.m);
  pending.result = std::forward<Result>(result);
  pending.alone = alone;
  pending.done = true;
  pending.settled.notify_one();
}

}  // namespace

template <typename P>
void CommitQueue::AwaitAnswer(P& mine) {
  Turn turn;
  try {
    while (TakeTurn(mine, turn)) RunTurn<P>(turn);
  } catch (...) {
    Withdraw(mine);
    throw;
  }
}

template <typename P>
bool CommitQueue::TakeTurn(P& mine, Turn& turn) {
  while (true) {
    {
      MutexLock lock(mu_);
      bool& busy = BusyOf<P>();
      if (!mine.taken && !busy) {
        // Nobody commits in this lane: this caller takes the oldest queued, its own
        // among them or ahead of it (with one writer, of both lanes). (Room first:
        // nothing below throws once the lane is busy.)
        turn.changes.clear();
        turn.starts.clear();
        turn.changes.reserve(options_.max_batch);
        turn.starts.reserve(kMaxStartBatch);
        busy = true;
        if (one_writer_ || std::is_same_v<P, Pending>) {
          TakeOldest(changes_.queued, options_.max_batch, turn.changes);
        }
        if (one_writer_ || std::is_same_v<P, PendingStart>) {
          TakeOldest(starts_.queued, kMaxStartBatch, turn.starts);
        }
        return true;
      }
    }
    // Somebody commits now, perhaps `mine` with it: wait for the answer, or (oldest
    // queued) for the turn to end.
    MutexLock lock(mine.m);
    while (!mine.done && !mine.turn) mine.settled.wait(lock.native());
    if (mine.done) return false;
    mine.turn = false;
  }
}

template <typename P>
void CommitQueue::EndTurn() {
  BusyOf<P>() = false;
  WakeNext<P>();
}

template <typename P>
void CommitQueue::WakeNext() {
  // The caller of the oldest still queued takes the next turn. (It waits on it now,
  // or is on its way to: a CommitAll settles its changes in order, and the ones
  // before this are done.) With one writer, the oldest of each lane is woken, and
  // whichever comes first takes both.
  bool queued = false;
  if (one_writer_ || std::is_same_v<P, Pending>) queued |= WakeOldest(changes_.queued);
  if (one_writer_ || std::is_same_v<P, PendingStart>) queued |= WakeOldest(starts_.queued);
  if (!queued) idle_.notify_all();
}

absl::Status CommitQueue::Commit(const Change& change) {
  Pending pending{&change};
  {
    MutexLock lock(mu_);
    if (!running_) return absl::UnavailableError("commit queue is stopped");
    changes_.queued.push_back(&pending);
  }
  return Settle(pending);
}

std::vector<absl::Status> CommitQueue::CommitAll(const std::vector<Change>& changes) {
  // A deque: a Pending (its condition) neither moves nor copies.
  std::deque<Pending> pending;
  for (const Change& change : changes) pending.emplace_back().change = &change;
  {
    MutexLock lock(mu_);
    if (!running_) {
      return std::vector<absl::Status>(changes.size(),
                                       absl::UnavailableError("commit queue is stopped"));
    }
    for (Pending& p : pending) changes_.queued.push_back(&p);
  }
  std::vector<absl::Status> results;
  results.reserve(pending.size());
  try {
    for (Pending& p : pending) results.push_back(Settle(p));
  } catch (...) {
    // Settle withdrew the change that threw; the later ones leave the queue too
    // before their Pendings go.
    for (size_t i = results.size() + 1; i < pending.size(); ++i) Withdraw(pending[i]);
    throw;
  }
  return results;
}

absl::StatusOr<StartResult> CommitQueue::Start(const NewInstance& start) {
  PendingStart pending{&start};
  {
    MutexLock lock(mu_);
    if (!running_) return absl::UnavailableError("commit queue is stopped");
    starts_.queued.push_back(&pending);
  }
  AwaitAnswer(pending);
  {
    MutexLock lock(pending.m);
    if (!pending.alone) return std::move(pending.result);
  }
  // The shared transaction failed as a whole: this start runs again alone, on the
  // caller's thread, beside the others (and the next batches).
  return store_->StartInstance(start);
}

int CommitQueue::Queued() {
  MutexLock lock(mu_);
  return static_cast<int>(changes_.queued.size() + starts_.queued.size());
}

template <typename P>
void CommitQueue::RunTurn(const Turn& turn) {
  std::vector<size_t> start_order;
  absl::StatusOr<InstanceStore::Committed> committed;
  try {
    committed = CommitTurn(turn, start_order);
  } catch (...) {
    // What threw (an allocation, the store) leaves before the turn was answered:
    // the next caller takes a turn and these are answered, so no caller waits for
    // a turn that never ends. The exception goes on to this caller.
    {
      MutexLock lock(mu_);
      EndTurn<P>();
    }
    const absl::Status threw =
        absl::InternalError("the commit threw; it may or may not have been written");
    for (Pending* p : turn.changes) Settled(*p, threw, false);
    for (PendingStart* p : turn.starts) Settled(*p, threw, false);
    throw;
  }
  {
    MutexLock lock(mu_);
    EndTurn<P>();  // the next turn begins while this one's callers are woken
  }
  Answer(turn, start_order, std::move(committed));
}

absl::Status CommitQueue::Settle(Pending& mine) {
  AwaitAnswer(mine);
  {
    MutexLock lock(mine.m);
    if (!mine.alone) return mine.result;
  }
  // Its shared transaction with starts failed as a whole: committed again by
  // itself, so that a start's trouble is not this change's.
  std::vector<Change> alone = {*mine.change};
  RedactChange(alone.back());
  auto results = store_->Commit(alone);
  if (!results.ok()) return results.status();
  return results->front();
}

template <typename P>
void CommitQueue::Withdraw(P& mine) {
  {
    MutexLock lock(mu_);
    if (!mine.taken) {
      std::deque<P*>& queued = LaneOf<P>().queued;
      queued.erase(std::find(queued.begin(), queued.end(), &mine));
      // It may have been woken for a turn it will not take: the next takes it.
      if (!BusyOf<P>()) WakeNext<P>();
      return;
    }
  }
  // In a batch another caller commits: its answer comes; the Pending lives until then.
  MutexLock lock(mine.m);
  while (!mine.done) mine.settled.wait(lock.native());
}

absl::StatusOr<InstanceStore::Committed> CommitQueue::CommitTurn(const Turn& turn,
                                                                 std::vector<size_t>& start_order) {
  std::vector<Change> changes;
  changes.reserve(turn.changes.size());
  for (const Pending* p : turn.changes) {
    changes.push_back(*p->change);
    RedactChange(changes.back());  // nothing stored carries a secret a downstream echoed
  }
  // Starts in (tenant, key) order, so that two processes batching the same keys
  // take their locks in the same order.
  start_order.resize(turn.starts.size());
  for (size_t i = 0; i < start_order.size(); ++i) start_order[i] = i;
  std::stable_sort(start_order.begin(), start_order.end(), [&](size_t a, size_t b) {
    const NewInstance& x = *turn.starts[a]->start;
    const NewInstance& y = *turn.starts[b]->start;
    return std::tie(x.tenant, x.key) < std::tie(y.tenant, y.key);
  });
  std::vector<NewInstance> starts;
  starts.reserve(start_order.size());
  for (size_t i : start_order) starts.push_back(*turn.starts[i]->start);

  InstanceStore::Committed committed;
  if (!starts.empty() && !changes.empty()) {
    WS_ASSIGN_OR_RETURN(committed, store_->StartAndCommit(starts, changes));
  } else if (!changes.empty()) {
    WS_ASSIGN_OR_RETURN(committed.applied, store_->Commit(changes));
  } else if (starts.size() == 1) {
    committed.started.push_back(store_->StartInstance(starts.front()));  // its own answer
  } else if (!starts.empty()) {
    WS_ASSIGN_OR_RETURN(committed.started, store_->StartInstances(starts));
  }
  if (committed.applied.size() != changes.size() || committed.started.size() != starts.size()) {
    return absl::InternalError("the store answered " + std::to_string(committed.applied.size()) +
                               " of " + std::to_string(changes.size()) + " changes and " +
                               std::to_string(committed.started.size()) + " of " +
                               std::to_string(starts.size()) + " starts");
  }
  return committed;
}

void CommitQueue::Answer(const Turn& turn, const std::vector<size_t>& start_order,
                         absl::StatusOr<InstanceStore::Committed> committed) {
  for (size_t i = 0; i < turn.changes.size(); ++i) {
    if (committed.ok()) {
      Settled(*turn.changes[i], committed->applied[i], false);
    } else {
      // Failed as a whole beside starts: maybe for a start's sake, so it goes again alone.
      Settled(*turn.changes[i], committed.status(), !turn.starts.empty());
    }
  }
  for (size_t n = 0; n < start_order.size(); ++n) {
    PendingStart& pending = *turn.starts[start_order[n]];
    if (committed.ok()) {
      Settled(pending, std::move(committed->started[n]), false);
    } else {
      // The shared transaction failed as a whole (a lone start answers its own
      // error through StartInstance): the start runs again by itself.
      Settled(pending, committed.status(), true);
    }
  }
}

}  // namespace waystone
