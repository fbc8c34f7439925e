#include "engine/drive/request_body.h"

#include <sys/stat.h>

#include <climits>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "base/base64.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "engine/drive/mail_message.h"
#include "model/json_text.h"
#include "model/template.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> RenderString(const std::string& text, const TemplateScope& context,
                                         const std::string& what) {
  if (text.empty()) return std::string();
  WS_ASSIGN_OR_RETURN(Template parsed, Template::Parse(text));
  auto rendered = parsed.RenderText(context);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(what + ": " + std::string(rendered.status().message()));
  }
  return rendered;
}

// The fields of `fields_json` rendered, ordered by name (a JSON object keeps no other
// order); a non-string value as JSON text.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> RenderFields(
    const std::string& fields_json, const TemplateScope& context) {
  std::vector<std::pair<std::string, std::string>> fields;
  if (fields_json.empty()) return fields;
  WS_ASSIGN_OR_RETURN(Json rendered, RenderTree(Json::parse(fields_json), context));
  for (const auto& [name, value] : rendered.items()) {
    fields.emplace_back(name, value.is_string() ? value.get<std::string>() : JsonText(value));
  }
  return fields;
}

// Returns the file `relative` names inside `files_dir`, resolved (symbolic links
// followed), when it stays inside.
absl::StatusOr<std::string> FileInside(const std::string& files_dir, const std::string& relative,
                                       const std::string& what) {
  if (files_dir.empty()) {
    return absl::FailedPreconditionError(
        what + ": no folder for files is configured (start the worker with --files DIR)");
  }
  if (relative.empty() || relative.front() == '/') {
    return absl::InvalidArgumentError(what + ": '" + relative +
                                      "' must be a path relative to the files folder");
  }
  for (size_t at = 0; at <= relative.size();) {
    const size_t end = std::min(relative.find('/', at), relative.size());
    if (relative.substr(at, end - at) == "..") {
      return absl::InvalidArgumentError(what + ": '" + relative + "' may not contain '..'");
    }
    at = end + 1;
  }
  char root[PATH_MAX];
  char file[PATH_MAX];
  if (realpath(files_dir.c_str(), root) == nullptr) {
    return absl::FailedPreconditionError(what + ": the files folder " + files_dir +
                                         " cannot be opened (each tenant's files are in a "
                                         "folder named after it, inside --files)");
  }
  const std::string joined = std::string(root) + "/" + relative;
  if (realpath(joined.c_str(), file) == nullptr) {
    return absl::NotFoundError(what + ": no file '" + relative + "' in the files folder");
  }
  const std::string inside = std::string(root) == "/" ? "/" : std::string(root) + "/";
  if (!std::string_view(file).starts_with(inside)) {
    return absl::InvalidArgumentError(what + ": '" + relative + "' leads out of the files folder");
  }
  struct stat info {};
  if (stat(file, &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(what + ": '" + relative + "' is not a regular file");
  }
  return std::string(file);
}

// A file's content, pinned, and how it appears in the request hash.
struct Pinned {
  FileContent content;
  std::string filename;
  std::string content_type;
};

absl::StatusOr<Pinned> PinFile(const FileSpec& spec, const TemplateScope& context,
                               const std::string& files_dir, const std::string& what) {
  Pinned pinned;
  WS_ASSIGN_OR_RETURN(pinned.filename, RenderString(spec.filename, context, what + " filename"));
  WS_ASSIGN_OR_RETURN(pinned.content_type,
                      RenderString(spec.content_type, context, what + " content_type"));
  // Both travel in header lines (the part's, or the request's Content-Type).
  for (const std::string* text : {&pinned.filename, &pinned.content_type}) {
    if (text->find_first_of(std::string_view("\r\n\0\"", 4)) != std::string::npos) {
      return absl::InvalidArgumentError(what +
                                        ": filename and content_type may not contain a "
                                        "line break, NUL or '\"'");
    }
  }
  if (pinned.content_type.empty()) pinned.content_type = "application/octet-stream";
  if (!spec.path.empty()) {
    WS_ASSIGN_OR_RETURN(std::string relative, RenderString(spec.path, context, what + " path"));
    WS_ASSIGN_OR_RETURN(pinned.content.path, FileInside(files_dir, relative, what));
    WS_ASSIGN_OR_RETURN(FileDigest digest, Sha256File(pinned.content.path));
    pinned.content.sha256 = digest.sha256;
    pinned.content.size = digest.size;
    pinned.content.device = digest.device;
    pinned.content.inode = digest.inode;
    if (pinned.filename.empty()) pinned.filename = relative.substr(relative.rfind('/') + 1);
    return pinned;
  }
  WS_ASSIGN_OR_RETURN(std::string text, RenderString(spec.base64, context, what + " base64"));
  std::optional<std::string> bytes = Base64Decode(text);
  if (!bytes) return absl::InvalidArgumentError(what + ": 'base64' is not valid base64");
  pinned.content.sha256 = Sha256Hex(*bytes);
  pinned.content.size = static_cast<int64_t>(bytes->size());
  pinned.content.bytes = std::move(*bytes);
  if (pinned.filename.empty()) pinned.filename = spec.part;
  return pinned;
}

Json Identity(const Pinned& pinned) {
  return {{"sha256", pinned.content.sha256},
          {"size", pinned.content.size},
          {"filename", pinned.filename},
          {"content_type", pinned.content_type}};
}

bool HasHeader(const HttpRequest& request, std::string_view name) {
  for (const auto& [key, value] : request.headers) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> TenantFilesFolder(const std::string& files_dir,
                                              const std::string& tenant) {
  if (files_dir.empty()) return std::string();
  if (tenant.empty() || tenant == "." || tenant == ".." ||
      tenant.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
    return absl::InvalidArgumentError("tenant '" + tenant + "' cannot name a files folder");
  }
  return files_dir + "/" + tenant;
}

absl::StatusOr<std::string> RenderBody(const RequestSpec& spec, const TemplateScope& context,
                                       const std::string& files_dir, HttpRequest& request) {
  switch (spec.body_kind) {
    case BodyKind::kJson:
      if (!spec.body_json.empty()) {
        WS_ASSIGN_OR_RETURN(Json body, RenderTree(Json::parse(spec.body_json), context));
        request.body = JsonText(body);
      }
      return request.body;
    case BodyKind::kForm: {
      WS_ASSIGN_OR_RETURN(auto fields, RenderFields(spec.fields_json, context));
      for (const auto& [name, value] : fields) {
        request.body +=
            (request.body.empty() ? "" : "&") + FormEncode(name) + "=" + FormEncode(value);
      }
      if (!HasHeader(request, "content-type")) {
        request.headers.emplace_back("Content-Type", "application/x-www-form-urlencoded");
      }
      return request.body;
    }
    case BodyKind::kMultipart: {
      Json identity = Json::array();
      WS_ASSIGN_OR_RETURN(auto fields, RenderFields(spec.fields_json, context));
      for (auto& [name, value] : fields) {
        identity.push_back({{"field", name}, {"value", value}});
        FormPart part;
        part.name = name;
        part.value = std::move(value);
        request.multipart.push_back(std::move(part));
      }
      for (const FileSpec& file : spec.files) {
        WS_ASSIGN_OR_RETURN(
            Pinned pinned, PinFile(file, context, files_dir, "multipart file '" + file.part + "'"));
        Json described = Identity(pinned);
        described["file"] = file.part;
        identity.push_back(std::move(described));
        FormPart part;
        part.name = file.part;
        part.is_file = true;
        part.filename = std::move(pinned.filename);
        part.content_type = std::move(pinned.content_type);
        part.file = std::move(pinned.content);
        request.multipart.push_back(std::move(part));
      }
      return "multipart " + JsonText(identity);
    }
    case BodyKind::kMail: {
      const MailSpec& mail = spec.mail;
      MailFields fields;
      WS_ASSIGN_OR_RETURN(fields.from, RenderString(mail.from, context, "email from"));
      WS_ASSIGN_OR_RETURN(fields.to, RenderString(mail.to, context, "email to"));
      WS_ASSIGN_OR_RETURN(fields.subject, RenderString(mail.subject, context, "email subject"));
      WS_ASSIGN_OR_RETURN(fields.text, RenderString(mail.text, context, "email text"));
      WS_ASSIGN_OR_RETURN(fields.message_id,
                          RenderString(mail.message_id, context, "email message id"));
      WS_ASSIGN_OR_RETURN(fields.delivery, RenderString(mail.delivery, context, "email delivery"));
      WS_ASSIGN_OR_RETURN(request.body, ComposeMail(fields));
      MailEnvelope& envelope = request.mail.Mutable();
      envelope.from = fields.from;
      envelope.to = {fields.to};
      WS_ASSIGN_OR_RETURN(envelope.user, RenderString(mail.user, context, "email user"));
      WS_ASSIGN_OR_RETURN(envelope.password,
                          RenderString(mail.password, context, "email password"));
      return request.body;  // the same on every attempt (the sender adds the Date)
    }
    case BodyKind::kFile: {
      WS_ASSIGN_OR_RETURN(Pinned pinned,
                          PinFile(spec.files.front(), context, files_dir, "body_file"));
      const std::string identity = "file " + JsonText(Identity(pinned));
      if (!HasHeader(request, "content-type")) {
        request.headers.emplace_back("Content-Type", pinned.content_type);
      }
      if (pinned.content.path.empty()) {
        request.body = std::move(pinned.content.bytes);
      } else {
        request.body_file = std::move(pinned.content);
      }
      return identity;
    }
  }
  return request.body;
}

}  // namespace waystone
