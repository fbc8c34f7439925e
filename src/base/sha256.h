#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace waystone {

// Returns the SHA-256 digest of `data` as 64 lowercase hex characters.
std::string Sha256Hex(std::string_view data);

// Returns HMAC-SHA-256 of `data` under `key` as 64 lowercase hex characters.
std::string HmacSha256Hex(std::string_view key, std::string_view data);

// The SHA-256 and size of a file's content.
struct FileDigest {
  std::string sha256;  // 64 lowercase hex characters
  int64_t size = 0;
  uint64_t device = 0;  // the file read (st_dev, st_ino of what was opened)
  uint64_t inode = 0;
};

// Reads the regular file at `path` in pieces (never whole into memory) and returns its
// digest; a symbolic link as the last component is not followed. NotFound /
// PermissionDenied / InvalidArgument / Internal naming the path when it cannot be read.
absl::StatusOr<FileDigest> Sha256File(const std::string& path);

// Opens `path` for reading when it is a regular file and not a symbolic link (the last
// component), without blocking on a FIFO; null with errno set otherwise.
FILE* OpenPinnable(const char* path);

// SHA-256 over bytes given in pieces. Not thread-safe.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Add(std::string_view bytes);
  // Returns the digest of everything added since construction or the last Finish
  // or Reset, and starts over.
  std::string Finish();
  // Forgets what was added.
  void Reset();

 private:
  void* context_;  // EVP_MD_CTX
};

}  // namespace waystone
