#pragma once

// What every benchmark's command line is: `--name value` pairs.

#include <cstdio>

namespace waystone::bench {

// Returns false, naming it on stderr, when the last flag has no value: every flag
// takes one, and a lone `--help` or a value forgotten must not run the benchmark
// with its defaults as if it had been asked to.
inline bool EveryFlagHasAValue(int argc, char** argv) {
  if (argc % 2 == 1) return true;
  std::fprintf(stderr, "flag %s needs a value (flags come as --name value)\n", argv[argc - 1]);
  return false;
}

}  // namespace waystone::bench
