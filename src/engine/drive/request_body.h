#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "connectors/http/http_client.h"
#include "model/definition.h"
#include "model/template.h"

namespace waystone {

// Renders the body of `spec` into `request`, by its kind: JSON (`body`), form fields
// (`form`), multipart/form-data (`multipart`) or one file's raw bytes (`body_file`).
// A file comes from a path relative to `files_dir` that stays inside it (no
// absolute path, no "..", no symbolic link leading out), streamed when sent, or from
// base64 decoded now; either way it is pinned by its SHA-256 and size here.
//
// Returns the body's identity for the request hash: the JSON or form text itself;
// for files a description holding each file's SHA-256 and size, so a file that
// changes between attempts changes the hash (an idempotency conflict, never a
// different upload under the same key). InvalidArgument naming the field when a
// template, a path or base64 is wrong; NotFound when a file is missing.
absl::StatusOr<std::string> RenderBody(const RequestSpec& spec, const TemplateScope& context,
                                       const std::string& files_dir, HttpRequest& request);

// The folder of `tenant`'s files: `<files_dir>/<tenant>`, so that a tenant's uploads
// read only its own (no configuration lets two tenants share one). Empty when
// `files_dir` is (no file may be sent); InvalidArgument for a tenant name that is not
// one folder name.
absl::StatusOr<std::string> TenantFilesFolder(const std::string& files_dir,
                                              const std::string& tenant);

}  // namespace waystone
