#pragma once

// A std::mutex the compiler checks: members marked ABSL_GUARDED_BY(mu_) may only be
// touched while `mu_` is held, and functions marked ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
// only called so. clang's -Wthread-safety proves it (scripts/test.sh compiles the
// libraries that way); other compilers ignore the annotations.
//
//   Mutex mu_;
//   std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
//   ...
//   MutexLock lock(mu_);
//   while (queue_.empty()) wake_.wait(lock.native());  // not a predicate lambda: the
//                                                      // analysis checks the loop

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace waystone {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  std::mutex& native() ABSL_LOCK_RETURNED(this) { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope. `native()` is the std::unique_lock a
// std::condition_variable waits on (it gives the mutex up while waiting and takes it
// back before returning, so the scope still holds it after the wait).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.native()) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace waystone
