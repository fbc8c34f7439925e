#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/definition.h"

namespace waystone {

// Reads a paginated lookup (`lookup.pages`) one answer at a time and gives
// RecordLookup one answer holding every page's candidates, so that two matches on
// different pages are a contradiction and a match on page 3 is found. Pure: it
// says which URL to ask next; the runner asks. A value; not thread-safe.
class LookupPages {
 public:
  // The most candidate text kept across pages: a worker serves every tenant.
  static constexpr size_t kMostCandidateBytes = 16 << 20;

  // `spec` must outlive this object; `first_url` is the rendered lookup URL.
  LookupPages(const LookupSpec& spec, std::string first_url);

  // Takes the 2xx answer to the page last asked for. Returns the URL of the next
  // page to ask, or nullopt when every page has been read. Errors (the lookup
  // cannot prove anything; nothing more is asked): InvalidArgument for an answer
  // without the `items` array, without the object that should hold the next link,
  // or with a next link that is not a path, "?query" or a URL of the lookup's own
  // origin (the request's headers, credentials included, never go elsewhere);
  // ResourceExhausted when more pages follow `max_pages` or the candidates pass
  // kMostCandidateBytes.
  absl::StatusOr<std::optional<std::string>> Add(const std::string& body);

  // Returns the last page's answer with every page's candidates at `items`.
  std::string Merged() const;

  int pages_read() const { return pages_read_; }

 private:
  const LookupSpec& spec_;
  std::string url_;  // the page last asked for
  std::string last_body_;
  std::vector<std::string> items_;  // each candidate's JSON text, in page order
  size_t kept_bytes_ = 0;           // of items_, held to kMostCandidateBytes
  int pages_read_ = 0;
};

// Returns `url` with query parameter `name` set to `value` (replaced where present,
// appended otherwise; a fragment is dropped).
std::string WithQueryParam(const std::string& url, const std::string& name,
                           const std::string& value);

// Returns "scheme://authority" of an absolute http(s) URL, lower-cased, or "" when
// it is not one.
std::string OriginOf(const std::string& url);

}  // namespace waystone
