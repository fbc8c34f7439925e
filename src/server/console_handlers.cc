#include <algorithm>

#include "server/api_handlers.h"
#include "server/console_assets.h"
#include "server/request_helpers.h"

// GET /console and /console/{file}: the operations console's static files, from
// the binary. They are public (no token): the console asks for one on its login
// form and sends it with every API call; the files themselves hold no data.

namespace waystone {

namespace {

// The console's files come only from this server and run no inline script; its API
// calls go to this origin only.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace

void ServeConsole(const ApiContext&, const std::string& file, const ServerRequest& req,
                  ServerResponse& res) {
  if (req.path == "/console") {
    res.status = 301;
    res.SetHeader("Location", "/console/");
    return res.SetContent("", "text/plain");
  }
  const std::string name = file.empty() ? "index.html" : file;
  const auto& assets = ConsoleAssets();
  auto asset = std::find_if(assets.begin(), assets.end(),
                            [&](const ConsoleAsset& a) { return a.name == name; });
  if (asset == assets.end()) return Send(res, NotFound("no console file " + req.path), req.path);
  res.SetHeader("ETag", std::string(asset->etag));
  // Revalidated on every load (a 304 costs one round trip), so a new binary's
  // console is picked up at once and never mixed with an old module.
  res.SetHeader("Cache-Control", "no-cache");
  res.SetHeader("X-Content-Type-Options", "nosniff");
  res.SetHeader("Referrer-Policy", "no-referrer");
  res.SetHeader("Content-Security-Policy", kContentSecurityPolicy);
  const std::string* if_none_match = req.Header("if-none-match");
  if (if_none_match != nullptr && IfNoneMatchNames(*if_none_match, asset->etag)) {
    res.status = 304;
    return;
  }
  res.SetContent(std::string(asset->body), std::string(asset->content_type));
}

}  // namespace waystone
