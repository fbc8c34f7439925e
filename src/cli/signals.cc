#include "cli/signals.h"

#include <csignal>
#include <cstdlib>
#include <ctime>
#include <thread>

namespace waystone::cli {

std::stop_token StopOnSignals() {
  static std::stop_source source;
  static sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Polls with a timeout so the thread can be joined at exit.
  static std::jthread waiter([](std::stop_token stop) {
    int received = 0;
    while (!stop.stop_requested()) {
      const timespec tick{0, 200'000'000};
      if (sigtimedwait(&set, nullptr, &tick) < 0) continue;
      if (++received > 1) std::_Exit(130);  // second signal: leave now
      source.request_stop();
    }
  });
  return source.get_token();
}

}  // namespace waystone::cli
