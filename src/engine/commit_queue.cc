#include "engine/commit_queue.h"

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
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

void CommitQueue::Stop() {
  {
    MutexLock lock(mu_);
    if (!running_) return;
    running_ = false;
  }
  thread_.request_stop();
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status CommitQueue::Commit(const Change& change) {
  Pending pending{&change};
  MutexLock lock(mu_);
  if (!running_) return absl::UnavailableError("commit queue is stopped");
  queue_.push_back(&pending);
  wake_.notify_one();
  done_.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending.done; });
  return pending.result;
}

absl::StatusOr<StartResult> CommitQueue::Start(const NewInstance& start) {
  PendingStart pending{&start};
  MutexLock lock(mu_);
  if (!running_) return absl::UnavailableError("commit queue is stopped");
  starts_.push_back(&pending);
  wake_.notify_one();
  done_.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending.done; });
  return std::move(pending.result);
}

void CommitQueue::StartAll(const std::vector<PendingStart*>& batch) {
  std::vector<NewInstance> starts;
  starts.reserve(batch.size());
  for (PendingStart* p : batch) starts.push_back(*p->start);
  auto results = batch.size() == 1 ? absl::StatusOr<std::vector<absl::StatusOr<StartResult>>>(
                                         std::vector{store_->StartInstance(starts.front())})
                                   : store_->StartInstances(starts);
  std::vector<absl::StatusOr<StartResult>> each;
  if (results.ok()) {
    each = std::move(*results);
  } else {
    for (const NewInstance& start : starts) each.push_back(store_->StartInstance(start));
  }
  MutexLock lock(mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->result = std::move(each[i]);
    batch[i]->done = true;
  }
}

void CommitQueue::Loop(std::stop_token stop) {
  std::vector<Pending*> batch;
  std::vector<PendingStart*> start_batch;
  std::vector<Change> changes;
  while (true) {
    {
      MutexLock lock(mu_);
      wake_.wait(lock.native(), stop, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || !starts_.empty();
      });
      if (queue_.empty() && starts_.empty()) return;  // stopped with nothing left to commit
      batch.clear();
      while (!queue_.empty() && static_cast<int>(batch.size()) < options_.max_batch) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      start_batch.clear();
      while (!starts_.empty() && static_cast<int>(start_batch.size()) < options_.max_batch) {
        start_batch.push_back(starts_.front());
        starts_.pop_front();
      }
    }
    if (!start_batch.empty()) {
      StartAll(start_batch);
      done_.notify_all();
    }
    if (batch.empty()) continue;
    changes.clear();
    changes.reserve(batch.size());
    for (Pending* p : batch) {
      changes.push_back(*p->change);
      RedactChange(changes.back());  // nothing stored carries a secret a downstream echoed
    }
    auto results = store_->Commit(changes);
    {
      MutexLock lock(mu_);
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i]->result = results.ok() ? (*results)[i] : results.status();
        batch[i]->done = true;
      }
    }
    done_.notify_all();
  }
}

}  // namespace waystone
