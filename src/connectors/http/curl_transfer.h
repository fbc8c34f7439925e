#pragma once

// Inside the curl client (curl_http_client.cc only): one request on its way as a
// libcurl easy handle — how it is set up (HTTP or an email, TLS, a body from memory,
// a pinned file or a multipart form, the request's last word before it is sent) and
// how its end is read as an HttpResponse. The client's loop (curl_http_client.cc)
// only adds, drives and finishes these.

#include <curl/curl.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/sha256.h"
#include "connectors/http/curl_mail.h"
#include "connectors/http/http_client.h"

namespace waystone::curl_transfer {

struct EasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};

struct HeaderState {
  std::optional<Millis> retry_after;
  std::vector<std::pair<std::string, std::string>> headers;  // of the last response
};

// Streams a pinned file to libcurl, checking it on the way (see FileContent): the
// last piece is handed over only once the whole file was read and still has its
// pinned size and SHA-256, so a changed file never reaches the target complete.
struct FileStream {
  explicit FileStream(const FileContent* c) : content(c) {}
  ~FileStream() {
    if (file != nullptr) std::fclose(file);
  }
  FileStream(const FileStream&) = delete;
  FileStream& operator=(const FileStream&) = delete;

  const FileContent* content;
  FILE* file = nullptr;
  int64_t delivered = 0;
  Sha256Stream hash;
  bool changed = false;
};

// One request on its way: the easy handle and everything libcurl points into
// while it runs (the body is sent from `request.body`, not copied).
struct Transfer {
  HttpRequest request;
  HttpDone done;
  std::unique_ptr<CURL, EasyDeleter> easy{curl_easy_init()};
  curl_slist* headers = nullptr;
  HeaderState header_state;
  HttpResponse response;
  bool held_back = false;                            // request.may_send said no: nothing left
  char error_detail[CURL_ERROR_SIZE] = {};           // libcurl's own words on a failure
  curl_mime* mime = nullptr;                         // a multipart body
  std::vector<std::unique_ptr<FileStream>> streams;  // files sent from disk
  curl_mail::MailTransfer mail;                      // an email's message and replies

  Transfer(HttpRequest r, HttpDone d) : request(std::move(r)), done(std::move(d)) {}
  ~Transfer() {
    easy.reset();  // before the body it may still point into
    curl_mime_free(mime);
    curl_slist_free_all(headers);
  }

  // The stream of the file that no longer matches its pin, or null.
  const FileStream* Changed() const {
    for (const auto& stream : streams) {
      if (stream->changed) return stream.get();
    }
    return nullptr;
  }
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
};

// libcurl's last call before the request is written (the connection is up): the

// Sets up `transfer`'s easy handle for its request, HTTP or an email.
void Configure(Transfer& transfer, const HttpClientOptions& options);

// Fills in `transfer.response` from how its transfer ended.
void Conclude(Transfer& transfer, CURLcode rc);

// Hands a finished transfer's response to its caller, after freeing the handle.
void Deliver(std::unique_ptr<Transfer> transfer);

// A response for a request that never left.
void Refuse(std::unique_ptr<Transfer> transfer, std::string why);

}  // namespace waystone::curl_transfer
