#pragma once

#include <string>

namespace waystone::testing {

// Where this build's programs and the checkout's sources are. Defined in the build
// folder's test_paths.cc, which tests/CMakeLists.txt generates: no test object names
// a folder, so ccache finds them from a clone anywhere.
std::string WaystoneBinary();         // the waystone binary under test
std::string SourceDir();              // the checkout (examples/, tests/targets/, ...)
std::string OrderSagaBinary();        // examples/embedded/order_saga.cc, built
std::string ExampleConsumerBinary();  // examples' waystone-example-consumer, built

}  // namespace waystone::testing
