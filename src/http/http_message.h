#pragma once

// Inside the HTTP front (http_front.cc and http_message.cc only; Boost.Beast stays
// out of every other file): reading a request's head into a ServerRequest, the
// limits and their refusals, running the screen and the handler, and the bytes of
// an answer. The connections (http_front.cc) and ServeBytes share all of it.

#include <optional>
#include <string>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "http/http_front.h"
#include "http/problem.h"

namespace waystone::http_message {

namespace bhttp = boost::beast::http;
using Parser = bhttp::request_parser<bhttp::string_body>;
using BeastResponse = bhttp::response<bhttp::string_body>;

// The problem+json answer of `kind` (problem.cc's table) for `path`.
ServerResponse ProblemResponse(ProblemKind kind, const std::string& detail,
                               const std::string& path);

// Sets the parser's head and body limits from `options`.
void ConfigureParser(Parser& parser, const HttpFrontOptions& options);

// Reads the parsed head into `out`; the refusal when it is one we do not serve.
std::optional<ServerResponse> ReadHead(const Parser& parser, const HttpFrontOptions& options,
                                       ServerRequest* out);

// The answer to a request that could not be read; nullopt when the connection
// just ends (the client left, or its time ran out).
std::optional<ServerResponse> ReadFailure(const boost::beast::error_code& ec,
                                          const HttpFrontOptions& options);

// Runs the screen; a screen that throws answers 500.
bool RunScreen(const ScreenFn& screen, ServerRequest& head, ServerResponse& res);
// Runs the handler; a handler that throws answers 500.
void RunHandler(const HandleFn& handle, const ServerRequest& req, ServerResponse& res);

// The message for `res`. Never throws: a header Beast refuses (a line break that
// would let a value write headers of its own, a value over its 64 KiB) is left out
// and logged. For HEAD the length is kept and the body dropped.
BeastResponse ToBeast(ServerResponse&& res, unsigned version, bool keep_alive, bool head);

// The bytes of `res` on the wire, as an async write would send them (ServeBytes,
// and the 503 written before a connection is taken).
std::string WireBytes(ServerResponse&& res, unsigned version, bool keep_alive, bool head);

}  // namespace waystone::http_message
