#include "engine/drive/mail_message.h"

#include <string_view>

#include "base/base64.h"

namespace waystone {
namespace {

bool Ascii(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

bool BreaksLine(std::string_view text) {
  return text.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

// An unstructured header's value: as is when printable ASCII, otherwise RFC 2047
// encoded words ("=?UTF-8?B?...?="), each at most 75 characters and never splitting
// a UTF-8 character.
std::string HeaderText(std::string_view value) {
  if (Ascii(value)) return std::string(value);
  constexpr size_t kChunk = 45;  // 45 bytes -> 60 base64 characters + 12 around
  std::string out;
  size_t at = 0;
  while (at < value.size()) {
    size_t end = std::min(value.size(), at + kChunk);
    while (end > at && end < value.size() &&
           (static_cast<unsigned char>(value[end]) & 0xC0) == 0x80) {
      --end;
    }
    if (end == at) end = std::min(value.size(), at + kChunk);  // not UTF-8: cut anywhere
    if (!out.empty()) out += "\r\n ";
    out += "=?UTF-8?B?" + Base64Encode(value.substr(at, end - at)) + "?=";
    at = end;
  }
  return out;
}

// `text` with every line ending CRLF (a lone CR or LF included), ending with one.
std::string CrlfLines(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 32 + 2);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
      out += "\r\n";
    } else if (text[i] == '\n') {
      out += "\r\n";
    } else {
      out += text[i];
    }
  }
  if (!out.ends_with("\r\n")) out += "\r\n";
  return out;
}

// Whether a CRLF text may travel as 7bit: ASCII, no NUL, lines of at most 998 bytes
// (RFC 5322 §2.1.1).
bool SevenBit(std::string_view text) {
  size_t line = 0;
  for (const char c : text) {
    if (c == '\0' || static_cast<unsigned char>(c) >= 0x80) return false;
    line = c == '\n' ? 0 : line + 1;
    if (line > 998) return false;
  }
  return true;
}

std::string Base64Lines(std::string_view bytes) {
  const std::string encoded = Base64Encode(bytes);
  std::string out;
  for (size_t at = 0; at < encoded.size(); at += 76) out += encoded.substr(at, 76) + "\r\n";
  return out;
}

}  // namespace

bool PlainAddress(const std::string& address) {
  if (address.empty() || address.size() > 254) return false;
  const size_t at = address.find('@');
  if (at == 0 || at == std::string::npos || at + 1 == address.size() ||
      address.find('@', at + 1) != std::string::npos) {
    return false;
  }
  for (const char c : address) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte >= 0x7F ||
        std::string_view("<>,;:\"()[]\\").find(c) != std::string_view::npos) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::string> ComposeMail(const MailFields& fields) {
  if (!PlainAddress(fields.from)) {
    return absl::InvalidArgumentError("email from '" + fields.from +
                                      "' is not one plain address (name@domain)");
  }
  if (!PlainAddress(fields.to)) {
    return absl::InvalidArgumentError("email to '" + fields.to +
                                      "' is not one plain address (name@domain)");
  }
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string&>{"subject", fields.subject},
        {"message id", fields.message_id},
        {"delivery", fields.delivery}}) {
    if (BreaksLine(value)) {
      return absl::InvalidArgumentError(std::string("email ") + name +
                                        " would contain a line break or NUL; refused");
    }
  }
  if (fields.message_id.empty() || !Ascii(fields.message_id) ||
      fields.message_id.find_first_of(" <>@") != std::string::npos) {
    return absl::InvalidArgumentError("email message id '" + fields.message_id +
                                      "' is not a plain ASCII word");
  }
  const std::string domain = fields.from.substr(fields.from.rfind('@') + 1);
  const std::string body = CrlfLines(fields.text);
  const bool seven_bit = SevenBit(body);
  std::string message;
  message += "From: " + fields.from + "\r\n";
  message += "To: " + fields.to + "\r\n";
  message += "Subject: " + HeaderText(fields.subject) + "\r\n";
  message += "Message-ID: <" + fields.message_id + "@" + domain + ">\r\n";
  if (!fields.delivery.empty()) {
    message += "X-Waystone-Delivery: " + HeaderText(fields.delivery) + "\r\n";
  }
  message += "MIME-Version: 1.0\r\n";
  message += "Content-Type: text/plain; charset=UTF-8\r\n";
  message += std::string("Content-Transfer-Encoding: ") + (seven_bit ? "7bit" : "base64") + "\r\n";
  message += "\r\n";
  message += seven_bit ? body : Base64Lines(body);
  return message;
}

}  // namespace waystone
