#include "engine/commit_queue.h"

#include <vector>

#include "engine/redaction.h"

namespace waystone {

CommitQueue::CommitQueue(InstanceStore* store, CommitQueueOptions options)
    : store_(store), options_(options) {}

CommitQueue::~CommitQueue() { Stop(); }

void CommitQueue::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) return;
  running_ = true;
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

void CommitQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
    running_ = false;
  }
  thread_.request_stop();
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status CommitQueue::Commit(const Change& change) {
  Pending pending{&change};
  std::unique_lock<std::mutex> lock(mu_);
  if (!running_) return absl::UnavailableError("commit queue is stopped");
  queue_.push_back(&pending);
  wake_.notify_one();
  done_.wait(lock, [&] { return pending.done; });
  return pending.result;
}

void CommitQueue::Loop(std::stop_token stop) {
  std::vector<Pending*> batch;
  std::vector<Change> changes;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, stop, [&] { return !queue_.empty(); });
      if (queue_.empty()) return;  // stopped with nothing left to commit
      batch.clear();
      while (!queue_.empty() && static_cast<int>(batch.size()) < options_.max_batch) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    changes.clear();
    changes.reserve(batch.size());
    for (Pending* p : batch) {
      changes.push_back(*p->change);
      RedactChange(changes.back());  // nothing stored carries a secret a downstream echoed
    }
    auto results = store_->Commit(changes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i]->result = results.ok() ? (*results)[i] : results.status();
        batch[i]->done = true;
      }
    }
    done_.notify_all();
  }
}

}  // namespace waystone
