#include "base/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/hex.h"

namespace waystone {

namespace {

std::string Hex(const unsigned char* digest, unsigned int length) {
  return HexOf(std::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest, &length);
  return Hex(digest, length);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  return Hex(digest, length);
}

Sha256Stream::Sha256Stream() : context_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(context_), EVP_sha256(), nullptr);
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(context_)); }

void Sha256Stream::Add(std::string_view bytes) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(context_), bytes.data(), bytes.size());
}

std::string Sha256Stream::Finish() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  auto* context = static_cast<EVP_MD_CTX*>(context_);
  EVP_DigestFinal_ex(context, digest, &length);
  EVP_DigestInit_ex(context, EVP_sha256(), nullptr);
  return Hex(digest, length);
}

FILE* OpenPinnable(const char* path) {
  // O_NONBLOCK: a FIFO put in a file's place must not block the reader.
  const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    errno = EISDIR;  // "not a regular file"
    return nullptr;
  }
  FILE* file = fdopen(fd, "rb");
  if (file == nullptr) close(fd);
  return file;
}

void Sha256Stream::Reset() {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(context_), EVP_sha256(), nullptr);
}

absl::StatusOr<FileDigest> Sha256File(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(OpenPinnable(path.c_str()), &std::fclose);
  if (file == nullptr) {
    const std::string why = "cannot read " + path + ": " + std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError(why);
    if (errno == EACCES) return absl::PermissionDeniedError(why);
    if (errno == ELOOP || errno == EISDIR) return absl::InvalidArgumentError(why);
    return absl::InternalError(why);
  }
  Sha256Stream hash;
  FileDigest digest;
  struct stat info {};
  fstat(fileno(file.get()), &info);
  digest.device = static_cast<uint64_t>(info.st_dev);
  digest.inode = static_cast<uint64_t>(info.st_ino);
  char buffer[64 * 1024];
  while (true) {
    const size_t got = std::fread(buffer, 1, sizeof(buffer), file.get());
    if (got > 0) {
      hash.Add(std::string_view(buffer, got));
      digest.size += static_cast<int64_t>(got);
    }
    if (got < sizeof(buffer)) break;
  }
  if (std::ferror(file.get()) != 0) {
    return absl::InternalError("cannot read " + path + ": " + std::strerror(errno));
  }
  digest.sha256 = hash.Finish();
  return digest;
}

}  // namespace waystone
