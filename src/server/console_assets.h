#pragma once

// The operations console's files (src/console/assets), compiled into the binary
// by src/console/embed_assets.py. Immutable; safe from any thread.

#include <string_view>
#include <vector>

namespace waystone {

struct ConsoleAsset {
  std::string_view name;          // file name, e.g. "app.js"
  std::string_view content_type;  // with charset for text
  std::string_view body;
  std::string_view etag;  // strong, quoted: from the file's SHA-256
};

// Every asset, sorted by name.
const std::vector<ConsoleAsset>& ConsoleAssets();

}  // namespace waystone
