#include "messaging/delivery_pool.h"

namespace waystone {

DeliveryPool::DeliveryPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

DeliveryPool::~DeliveryPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  threads_.clear();  // joins
}

void DeliveryPool::Start(std::vector<std::function<void()>>& tasks) {
  if (tasks.empty()) return;
  MutexLock lock(mu_);
  tasks_ = &tasks;
  next_ = 0;
  unfinished_ = tasks.size();
  work_.notify_all();
}

void DeliveryPool::Wait() {
  MutexLock lock(mu_);
  while (unfinished_ > 0) done_.wait(lock.native());
  tasks_ = nullptr;
}

void DeliveryPool::Work() {
  MutexLock lock(mu_);
  while (true) {
    while (!stopping_ && (tasks_ == nullptr || next_ >= tasks_->size())) {
      work_.wait(lock.native());
    }
    if (stopping_) return;
    std::function<void()>& task = (*tasks_)[next_++];
    // The batch outlives its tasks: Wait returns only once `unfinished_` is 0.
    lock.native().unlock();
    task();
    lock.native().lock();
    if (--unfinished_ == 0) done_.notify_all();
  }
}

}  // namespace waystone
