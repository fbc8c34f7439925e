#include "engine/commit_queue.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "base/mutex.h"
#include "engine/redaction.h"

namespace waystone {

CommitQueue::CommitQueue(InstanceStore* store, CommitQueueOptions options)
    : store_(store), options_(options) {
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
bool CommitQueue::TakeTurn(P& mine, int max_batch, std::vector<P*>& batch) {
  MutexLock lock(mu_);
  Lane<P>& lane = LaneOf<P>();
  while (!mine.done && lane.busy) mine.settled.wait(lock.native());
  if (mine.done) return false;
  // Nobody commits in this lane: this caller takes the oldest queued, its own among
  // them or ahead of it.
  lane.busy = true;
  batch.clear();
  while (!lane.queued.empty() && static_cast<int>(batch.size()) < max_batch) {
    batch.push_back(lane.queued.front());
    lane.queued.pop_front();
  }
  return true;
}

template <typename P>
void CommitQueue::EndTurn() {
  Lane<P>& lane = LaneOf<P>();
  lane.busy = false;
  // The caller of the oldest still queued takes the next turn. (It waits on it now,
  // or is on its way to: a CommitAll settles its changes in order, and the ones
  // before this are done.)
  if (!lane.queued.empty()) {
    lane.queued.front()->settled.notify_one();
  } else {
    idle_.notify_all();
  }
}

absl::Status CommitQueue::Commit(const Change& change) {
  Pending pending{&change};
  {
    MutexLock lock(mu_);
    if (!running_) return absl::UnavailableError("commit queue is stopped");
    changes_.queued.push_back(&pending);
  }
  Settle(pending);
  return pending.result;
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
  for (Pending& p : pending) {
    Settle(p);
    results.push_back(p.result);
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
  std::vector<PendingStart*> batch;
  while (TakeTurn(pending, kMaxStartBatch, batch)) {
    GuardTurn(batch, [&] { StartAll(batch); });
  }
  // The shared transaction failed as a whole: this start runs again alone, on the
  // caller's thread, beside the others (and the next batches).
  if (pending.alone) return store_->StartInstance(start);
  return std::move(pending.result);
}

int CommitQueue::Queued() {
  MutexLock lock(mu_);
  return static_cast<int>(changes_.queued.size());
}

template <typename P, typename Run>
void CommitQueue::GuardTurn(const std::vector<P*>& batch, Run&& run) {
  try {
    run();
  } catch (...) {
    // What threw (an allocation, the store) leaves before the batch was answered:
    // its callers are answered here and the next one takes a turn, so no caller
    // waits for a turn that never ends. The exception goes on to this caller.
    MutexLock lock(mu_);
    for (P* p : batch) {
      p->result = absl::InternalError("the commit threw; it may or may not have been written");
      p->done = true;
      p->settled.notify_one();
    }
    EndTurn<P>();
    throw;
  }
}

void CommitQueue::Settle(Pending& mine) {
  std::vector<Pending*> batch;
  while (TakeTurn(mine, options_.max_batch, batch)) {
    GuardTurn(batch, [&] { CommitBatch(batch); });
  }
}

void CommitQueue::CommitBatch(const std::vector<Pending*>& batch) {
  std::vector<Change> changes;
  changes.reserve(batch.size());
  for (const Pending* p : batch) {
    changes.push_back(*p->change);
    RedactChange(changes.back());  // nothing stored carries a secret a downstream echoed
  }
  auto results = store_->Commit(changes);
  MutexLock lock(mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->result = results.ok() ? (*results)[i] : results.status();
    batch[i]->done = true;
    batch[i]->settled.notify_one();
  }
  EndTurn<Pending>();
}

void CommitQueue::StartAll(const std::vector<PendingStart*>& batch) {
  // In (tenant, key) order, so that two processes batching the same keys take their
  // locks in the same order.
  std::vector<size_t> order(batch.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const NewInstance& x = *batch[a]->start;
    const NewInstance& y = *batch[b]->start;
    return std::tie(x.tenant, x.key) < std::tie(y.tenant, y.key);
  });
  std::vector<NewInstance> starts;
  starts.reserve(batch.size());
  for (size_t i : order) starts.push_back(*batch[i]->start);
  auto results = batch.size() == 1 ? absl::StatusOr<std::vector<absl::StatusOr<StartResult>>>(
                                         std::vector{store_->StartInstance(starts.front())})
                                   : store_->StartInstances(starts);
  MutexLock lock(mu_);
  for (size_t n = 0; n < order.size(); ++n) {
    PendingStart& pending = *batch[order[n]];
    if (results.ok()) {
      pending.result = std::move((*results)[n]);
    } else {
      pending.alone = batch.size() > 1;  // one start alone: its own error is the answer
      pending.result = results.status();
    }
    pending.done = true;
    pending.settled.notify_one();
  }
  EndTurn<PendingStart>();
}

}  // namespace waystone
