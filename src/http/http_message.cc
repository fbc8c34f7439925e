#include "http/http_message.h"

#include <sstream>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>

#include "base/log.h"
#include "base/utf8.h"

namespace waystone {

namespace beast = boost::beast;
namespace net = boost::asio;
using beast::error_code;
using http_message::Parser;

const std::string* ServerRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return &v;
  }
  return nullptr;
}

size_t ServerRequest::QueryCount(std::string_view name) const {
  size_t count = 0;
  for (const auto& [n, v] : query) count += n == name;
  return count;
}

const std::string* ServerRequest::Query(std::string_view name) const {
  for (const auto& [n, v] : query) {
    if (n == name) return &v;
  }
  return nullptr;
}

void ServerResponse::SetHeader(std::string name, std::string value) {
  for (auto& [n, v] : headers) {
    if (beast::iequals(n, name)) {
      v = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

void ServerResponse::SetContent(std::string content, std::string content_type) {
  body = std::move(content);
  SetHeader("Content-Type", std::move(content_type));
}

std::string ServerResponse::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (beast::iequals(n, name)) return v;
  }
  return "";
}

namespace http_message {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `text` ('+' is a space in a query); nullopt on a broken escape,
// a NUL or text that is not UTF-8 once decoded.
std::optional<std::string> Decode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      const int high = HexDigit(text[i + 1]);
      const int low = HexDigit(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      c = static_cast<char>(high * 16 + low);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    if (c == '\0') return std::nullopt;
    out.push_back(c);
  }
  if (FirstInvalidUtf8(out) != std::string::npos) return std::nullopt;
  return out;
}

// Fills path and query from the target (origin form only); the reason otherwise.
std::optional<std::string> SplitTarget(ServerRequest& req) {
  if (req.target.empty() || req.target[0] != '/') {
    return "the request target must be a path such as /v1/instances";
  }
  const size_t mark = req.target.find('?');
  auto path = Decode(std::string_view(req.target).substr(0, mark), false);
  if (!path) return "the path is not percent-encoded UTF-8";
  req.path = std::move(*path);
  if (mark == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(req.target).substr(mark + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view part = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    auto name = Decode(part.substr(0, eq), true);
    auto value =
        Decode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1), true);
    if (!name || !value) return "the query is not percent-encoded UTF-8";
    req.query.emplace_back(std::move(*name), std::move(*value));
  }
  return std::nullopt;
}

ServerResponse Internal(const std::string& path) {
  return ProblemResponse(ProblemKind::kInternal, "an internal error occurred", path);
}

}  // namespace

ServerResponse ProblemResponse(ProblemKind kind, const std::string& detail,
                               const std::string& path) {
  const Problem problem = MakeProblem(kind, detail);
  ServerResponse res;
  res.status = problem.status;
  res.SetContent(problem.ToJson(path), "application/problem+json");
  return res;
}

std::optional<ServerResponse> ReadHead(const Parser& parser, const HttpFrontOptions& options,
                                       ServerRequest* out) {
  const auto& message = parser.get();
  *out = ServerRequest{};
  out->method = std::string(message.method_string());
  out->target = std::string(message.target());
  size_t count = 0;
  for (const auto& field : message) {
    if (++count > options.max_headers) {
      return ProblemResponse(ProblemKind::kHeaderFieldsTooLarge,
                             "at most " + std::to_string(options.max_headers) + " headers", "");
    }
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out->headers.emplace_back(std::move(name), std::string(field.value()));
  }
  if (message.version() != 11 && message.version() != 10) {
    return ProblemResponse(ProblemKind::kHttpVersionNotSupported, "send HTTP/1.1", "");
  }
  if (auto why = SplitTarget(*out)) {
    return ProblemResponse(ProblemKind::kBadRequest, *why, "");
  }
  return std::nullopt;
}

std::optional<ServerResponse> ReadFailure(const error_code& ec, const HttpFrontOptions& options) {
  if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
      ec == net::error::operation_aborted || ec == net::error::connection_reset ||
      ec == bhttp::error::partial_message) {
    return std::nullopt;
  }
  if (ec == bhttp::error::header_limit) {
    return ProblemResponse(ProblemKind::kHeaderFieldsTooLarge,
                           "the request line and headers may take " +
                               std::to_string(options.max_header_bytes) + " bytes",
                           "");
  }
  if (ec == bhttp::error::body_limit) {
    return ProblemResponse(ProblemKind::kPayloadTooLarge,
                           "the body may take " + std::to_string(options.max_body_bytes) + " bytes",
                           "");
  }
  return ProblemResponse(ProblemKind::kBadRequest,
                         "the request could not be read as HTTP/1.1: " + ec.message(), "");
}

bool RunScreen(const ScreenFn& screen, ServerRequest& head, ServerResponse& res) {
  try {
    return screen(head, res);
  } catch (const std::exception& e) {
    Log(LogLevel::kError, std::string("request screen threw: ") + e.what());
  } catch (...) {
    Log(LogLevel::kError, "request screen threw");
  }
  res = Internal(head.path);
  return true;
}

void RunHandler(const HandleFn& handle, const ServerRequest& req, ServerResponse& res) {
  try {
    handle(req, res);
    return;
  } catch (const std::exception& e) {
    Log(LogLevel::kError, "handler of " + req.method + " " + req.path + " threw: " + e.what());
  } catch (...) {
    Log(LogLevel::kError, "handler of " + req.method + " " + req.path + " threw");
  }
  res = Internal(req.path);
}

BeastResponse ToBeast(ServerResponse&& res, unsigned version, bool keep_alive, bool head) {
  BeastResponse out;
  out.version(version == 10 ? 10 : 11);
  if (res.status < 200 || res.status > 599) {
    Log(LogLevel::kError, "a handler answered status " + std::to_string(res.status));
    res = Internal("");
  }
  if (res.status == 204 || res.status == 304) res.body.clear();  // they carry none
  out.result(static_cast<unsigned>(res.status));
  for (auto& [name, value] : res.headers) {
    if (name.find_first_of("\r\n") != std::string::npos ||
        value.find_first_of("\r\n") != std::string::npos || name.size() > 256 ||
        value.size() > 8192) {
      Log(LogLevel::kWarning,
          "response header '" + name.substr(0, 64) + "' left out: a line break or too long");
      continue;
    }
    try {
      out.set(name, value);
    } catch (const std::exception& e) {
      Log(LogLevel::kWarning, "response header '" + name.substr(0, 64) + "' left out: " + e.what());
    }
  }
  const size_t length = res.body.size();
  out.body() = head ? std::string() : std::move(res.body);
  out.keep_alive(keep_alive);
  out.prepare_payload();
  if (head) out.content_length(length);
  return out;
}

std::string WireBytes(ServerResponse&& res, unsigned version, bool keep_alive, bool head) {
  std::ostringstream text;
  text << ToBeast(std::move(res), version, keep_alive, head);
  return text.str();
}

void ConfigureParser(Parser& parser, const HttpFrontOptions& options) {
  parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
  parser.body_limit(options.max_body_bytes);
}

}  // namespace http_message

std::string ServeBytes(std::string_view raw, const HttpFrontOptions& options,
                       const ScreenFn& screen, const HandleFn& handle) {
  using namespace http_message;
  std::string out;
  bool head = false;
  auto emit = [&out, &head](ServerResponse&& res, unsigned version, bool keep_alive) {
    out += WireBytes(std::move(res), version, keep_alive, head);
  };
  // Feeds the parser until `done` holds; false when the bytes ran out or failed.
  size_t offset = 0;
  error_code ec;
  auto feed = [&](Parser& parser, auto done) {
    while (!done()) {
      const size_t used = parser.put(net::buffer(raw.data() + offset, raw.size() - offset), ec);
      offset += used;
      // All that is left was offered: needing more, or taking none of it, means the
      // client sends no more. A connection would wait for its deadline, then close.
      if (ec == bhttp::error::need_more || (!ec && used == 0)) {
        if (used > 0 && offset < raw.size()) {
          ec = {};
          continue;
        }
        ec = {};
        parser.put_eof(ec);
        if (!ec) ec = bhttp::error::partial_message;
        return false;
      }
      if (ec) return false;
    }
    return true;
  };
  for (int requests = 0; requests < 16 && offset < raw.size(); ++requests) {
    Parser parser;
    ConfigureParser(parser, options);
    ServerRequest request;
    if (!feed(parser, [&] { return parser.is_header_done(); })) {
      if (auto answer = ReadFailure(ec, options)) emit(std::move(*answer), 11, false);
      return out;
    }
    const unsigned version = parser.get().version();
    head = parser.get().method() == bhttp::verb::head;
    if (auto refused = ReadHead(parser, options, &request)) {
      emit(std::move(*refused), version, false);
      return out;
    }
    request.earlier_requests = static_cast<size_t>(requests);
    ServerResponse res;
    if (RunScreen(screen, request, res)) {
      emit(std::move(res), version, false);
      return out;
    }
    if (!feed(parser, [&] { return parser.is_done(); })) {
      if (auto answer = ReadFailure(ec, options)) emit(std::move(*answer), version, false);
      return out;
    }
    request.body = std::move(parser.get().body());
    const bool keep_alive = parser.get().keep_alive();
    RunHandler(handle, request, res);
    emit(std::move(res), version, keep_alive);
    if (!keep_alive) return out;
  }
  return out;
}

}  // namespace waystone
