#include "engine/drive/lookup_pages.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "model/json_text.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

std::string WithoutQuery(const std::string& url) { return url.substr(0, url.find_first_of("?#")); }

}  // namespace

std::string OriginOf(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return "";
  const size_t authority_end = url.find_first_of("/?#", scheme_end + 3);
  std::string origin = url.substr(0, authority_end);
  std::transform(origin.begin(), origin.end(), origin.begin(),
                 [](unsigned char c) { return std::tolower(c); });  // scheme and host
  if (!origin.starts_with("http://") && !origin.starts_with("https://")) return "";
  return origin;
}

std::string WithQueryParam(const std::string& url, const std::string& name,
                           const std::string& value) {
  const std::string base = url.substr(0, url.find('#'));
  const size_t question = base.find('?');
  const std::string path = base.substr(0, question);
  std::string query = question == std::string::npos ? "" : base.substr(question + 1);
  std::string out;
  bool replaced = false;
  size_t at = 0;
  while (at <= query.size() && !query.empty()) {
    size_t end = query.find('&', at);
    if (end == std::string::npos) end = query.size();
    const std::string pair = query.substr(at, end - at);
    const std::string key = pair.substr(0, pair.find('='));
    std::string kept = pair;
    if (key == name) {
      kept = replaced ? "" : name + "=" + value;
      replaced = true;
    }
    if (!kept.empty()) out += (out.empty() ? "" : "&") + kept;
    at = end + 1;
  }
  if (!replaced) out += (out.empty() ? "" : "&") + name + "=" + value;
  return path + "?" + out;
}

LookupPages::LookupPages(const LookupSpec& spec, std::string first_url)
    : spec_(spec), url_(std::move(first_url)) {}

absl::StatusOr<std::optional<std::string>> LookupPages::Add(const std::string& body) {
  ++pages_read_;
  if (JsonNestsDeeperThan(body)) {
    return absl::InvalidArgumentError("page " + std::to_string(pages_read_) +
                                      " of the answer nests deeper than " +
                                      std::to_string(kMaxJsonDepth) + " levels");
  }
  const Json page = Json::parse(body, nullptr, false);
  const Json* items = page.is_discarded() ? nullptr : AtPointer(page, spec_.items);
  if (items == nullptr || !items->is_array()) {
    return absl::InvalidArgumentError("page " + std::to_string(pages_read_) +
                                      " of the answer has no array at " + spec_.items);
  }
  for (const Json& item : *items) {
    items_.push_back(JsonText(item));
    kept_bytes_ += items_.back().size();
  }
  if (kept_bytes_ > kMostCandidateBytes) {
    return absl::ResourceExhaustedError("the pages hold more than " +
                                        std::to_string(kMostCandidateBytes >> 20) +
                                        " MiB of candidates; the rest was not read");
  }
  last_body_ = body;

  std::string next;
  if (!spec_.next_pointer.empty()) {
    const Json* link = AtPointer(page, spec_.next_pointer);
    const std::string parent = spec_.next_pointer.substr(0, spec_.next_pointer.rfind('/'));
    if (link == nullptr && !parent.empty() && AtPointer(page, parent) == nullptr) {
      // "/links/next" without any "/links": more likely a wrong pointer than a last page.
      return absl::InvalidArgumentError("the answer has nothing at " + parent +
                                        ", where lookup.pages.next " + spec_.next_pointer +
                                        " should be");
    }
    if (link == nullptr || link->is_null() ||
        (link->is_string() && link->get_ref<const std::string&>().empty())) {
      return std::nullopt;
    }
    if (!link->is_string()) {
      return absl::InvalidArgumentError("the next-page link at " + spec_.next_pointer +
                                        " is not a string");
    }
    const std::string text = link->get<std::string>();
    const std::string origin = OriginOf(url_);
    if (text.starts_with("/") && !text.starts_with("//")) {
      next = origin + text;
    } else if (text.starts_with("?")) {
      next = WithoutQuery(url_) + text;
    } else if (!origin.empty() && OriginOf(text) == origin) {
      next = text;
    } else {
      return absl::InvalidArgumentError("the next-page link '" + text.substr(0, 200) +
                                        "' leaves the lookup's origin " + origin +
                                        "; it is not followed");
    }
  } else {
    if (items->empty()) return std::nullopt;  // the page after the last holds nothing
    next = WithQueryParam(url_, spec_.page_param, std::to_string(spec_.first_page + pages_read_));
  }
  if (pages_read_ >= spec_.max_pages) {
    return absl::ResourceExhaustedError("the answer has more than " +
                                        std::to_string(spec_.max_pages) +
                                        " pages (lookup.pages.max); the rest was not read");
  }
  url_ = next;
  return std::optional<std::string>(next);
}

std::string LookupPages::Merged() const {
  Json page = Json::parse(last_body_, nullptr, false);
  Json all = Json::array();
  for (const std::string& item : items_) all.push_back(Json::parse(item));
  try {
    page[Json::json_pointer(spec_.items)] = std::move(all);
  } catch (const Json::exception&) {
    return last_body_;  // Add checked the pointer resolves; not reached
  }
  return JsonText(page);
}

}  // namespace waystone
