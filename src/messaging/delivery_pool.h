#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace waystone {

// DeliveryPool runs the tasks of one batch on a fixed set of threads. The threads
// live as long as the pool, so each keeps the kept-alive connections it made (the
// HTTP client keeps them per thread). One batch at a time, from one thread: Start,
// then Wait, between which the caller may do other work. The tasks of a
// batch must not depend on each other's order.
class DeliveryPool {
 public:
  explicit DeliveryPool(int threads);
  ~DeliveryPool();
  DeliveryPool(const DeliveryPool&) = delete;
  DeliveryPool& operator=(const DeliveryPool&) = delete;

  // Starts running every task of `tasks` once and returns at once; `tasks` must
  // outlive the Wait that follows.
  void Start(std::vector<std::function<void()>>& tasks);
  // Returns once every task of the batch Start began has run (at once without one).
  void Wait();

 private:
  void Work();

  Mutex mu_;
  std::condition_variable work_;  // a batch arrived, or the pool is stopping
  std::condition_variable done_;  // the last task of a batch ended
  std::vector<std::function<void()>>* tasks_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;        // the next task to hand out
  size_t unfinished_ ABSL_GUARDED_BY(mu_) = 0;  // tasks of the batch not yet ended
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::jthread> threads_;
};

}  // namespace waystone
