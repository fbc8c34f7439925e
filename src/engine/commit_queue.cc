#include "engine/commit_queue.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "base/mutex.h"
#include "engine/redaction.h"

namespace waystone {

CommitQueue::CommitQueue(InstanceStore* store, CommitQueueOptions options)
    : store_(store), options_(options) {}

CommitQueue::~CommitQueue() { Stop(); }

void CommitQueue::Start() {
  MutexLock lock(mu_);
  if (running_) return;
  running_ = true;
  start_thread_ = std::jthread([this](std::stop_token stop) { StartLoop(stop); });
}

void CommitQueue::Stop() {
  {
    MutexLock lock(mu_);
    if (!running_) return;
    running_ = false;
    // What was queued before is committed by its callers; wait until it is.
    while (committing_ || !queue_.empty()) idle_.wait(lock.native());
  }
  start_thread_.request_stop();
  start_wake_.notify_all();
  if (start_thread_.joinable()) start_thread_.join();
}

absl::Status CommitQueue::Commit(const Change& change) {
  Pending pending{&change};
  {
    MutexLock lock(mu_);
    if (!running_) return absl::UnavailableError("commit queue is stopped");
    queue_.push_back(&pending);
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
    for (Pending& p : pending) queue_.push_back(&p);
  }
  std::vector<absl::Status> results;
  results.reserve(pending.size());
  for (Pending& p : pending) {
    Settle(p);
    results.push_back(p.result);
  }
  return results;
}

int CommitQueue::Queued() {
  MutexLock lock(mu_);
  return static_cast<int>(queue_.size());
}

void CommitQueue::Settle(Pending& mine) {
  std::vector<Pending*> batch;
  while (true) {
    {
      MutexLock lock(mu_);
      while (!mine.done && committing_) mine.settled.wait(lock.native());
      if (mine.done) return;
      // Nobody commits: this caller commits the oldest changes queued, its own among
      // them or ahead of it.
      committing_ = true;
      batch.clear();
      while (!queue_.empty() && static_cast<int>(batch.size()) < options_.max_batch) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    CommitBatch(batch);
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
  committing_ = false;
  // The caller of the oldest change still queued commits next. (Its caller waits on
  // it now, or is on its way to: a CommitAll settles its changes in order, and the
  // ones before this are done.)
  if (!queue_.empty()) {
    queue_.front()->settled.notify_one();
  } else {
    idle_.notify_all();
  }
}

absl::StatusOr<StartResult> CommitQueue::Start(const NewInstance& start) {
  PendingStart pending{&start};
  {
    MutexLock lock(mu_);
    if (!running_) return absl::UnavailableError("commit queue is stopped");
    starts_.push_back(&pending);
    start_wake_.notify_one();
    while (!pending.done) pending.settled.wait(lock.native());
  }
  // The shared transaction failed as a whole: this start runs again alone, on the
  // caller's thread, beside the others (and the next batches).
  if (pending.alone) return store_->StartInstance(start);
  return std::move(pending.result);
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
}

void CommitQueue::StartLoop(std::stop_token stop) {
  std::vector<PendingStart*> batch;
  while (true) {
    {
      MutexLock lock(mu_);
      start_wake_.wait(lock.native(), stop,
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !starts_.empty(); });
      if (starts_.empty()) return;  // stopped with nothing left to start
      batch.clear();
      while (!starts_.empty() && static_cast<int>(batch.size()) < kMaxStartBatch) {
        batch.push_back(starts_.front());
        starts_.pop_front();
      }
    }
    StartAll(batch);
  }
}

}  // namespace waystone
