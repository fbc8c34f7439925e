#pragma once

#include <string>

namespace waystone::testing {

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes `text` to `path`, replacing it.
void WriteFile(const std::string& path, const std::string& text);

// Returns the whole of the file at `path`; empty when it cannot be read.
std::string ReadFile(const std::string& path);

}  // namespace waystone::testing
