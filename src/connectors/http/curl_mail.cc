#include "connectors/http/curl_mail.h"

#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string_view>

namespace waystone::curl_mail {
namespace {

size_t ReadMessage(char* buffer, size_t size, size_t count, void* user) {
  auto* mail = static_cast<MailTransfer*>(user);
  const size_t bytes = std::min(size * count, mail->message.size() - mail->offset);
  std::memcpy(buffer, mail->message.data() + mail->offset, bytes);
  mail->offset += bytes;
  // libcurl asks no more once it has the size it was told (CURLOPT_INFILESIZE).
  if (mail->offset == mail->message.size()) mail->handed_over = true;
  return bytes;
}

// libcurl hands every reply line of the server to the header callback. The answer
// to QUIT ("221 Bye", as the connection closes) says nothing of the message.
size_t ReadReply(char* data, size_t size, size_t count, void* user) {
  auto* last = static_cast<std::string*>(user);
  std::string_view line(data, size * count);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (!line.empty() && !line.starts_with("221")) *last = std::string(line.substr(0, 512));
  return size * count;
}

// Returns true when the message's header section has a Date: field.
bool HasDate(std::string_view message) {
  const size_t end = message.find("\r\n\r\n");
  const std::string_view head = message.substr(0, end);
  size_t at = 0;
  while (at < head.size()) {
    if (head.size() - at >= 5 && strncasecmp(head.data() + at, "date:", 5) == 0) return true;
    const size_t next = head.find("\r\n", at);
    if (next == std::string_view::npos) break;
    at = next + 2;
  }
  return false;
}

// Now as RFC 5322 §3.3 writes a date, in UTC: "Wed, 02 Dec 2026 22:40:00 +0000".
std::string DateNow() {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const time_t now = time(nullptr);
  struct tm utc {};
  gmtime_r(&now, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%s, %02d %s %04d %02d:%02d:%02d +0000", kDays[utc.tm_wday],
                utc.tm_mday, kMonths[utc.tm_mon], utc.tm_year + 1900, utc.tm_hour, utc.tm_min,
                utc.tm_sec);
  return text;
}

}  // namespace

void Configure(CURL* curl, const HttpRequest& request, MailTransfer& mail) {
  // The date the message left (RFC 5322 §3.6.1); the rest of it is the same on every
  // attempt, its Message-ID above all.
  mail.message =
      HasDate(request.body) ? request.body : "Date: " + DateNow() + "\r\n" + request.body;
  for (const std::string& to : request.mail->to) {
    mail.recipients = curl_slist_append(mail.recipients, ("<" + to + ">").c_str());
  }
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "smtp,smtps");
  curl_easy_setopt(curl, CURLOPT_MAIL_FROM, ("<" + request.mail->from + ">").c_str());
  curl_easy_setopt(curl, CURLOPT_MAIL_RCPT, mail.recipients);
  curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadMessage);
  curl_easy_setopt(curl, CURLOPT_READDATA, &mail);
  curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(mail.message.size()));
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, ReadReply);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &mail.last_reply);
  if (!request.mail->user.empty() && !request.mail->password.empty()) {
    curl_easy_setopt(curl, CURLOPT_USERNAME, request.mail->user.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, request.mail->password.c_str());
  }
  // smtp://: STARTTLS when the server offers it (verified like any TLS); a server that
  // offers none is spoken to in the clear. smtps:// is TLS from the first byte.
  curl_easy_setopt(curl, CURLOPT_USE_SSL, static_cast<long>(CURLUSESSL_TRY));
}

void Conclude(CURL* curl, CURLcode rc, const MailTransfer& mail, const std::string& detail,
              HttpResponse& response) {
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  response.outcome.smtp = true;
  response.outcome.sent = mail.handed_over;
  response.body.clear();
  // A final reply: 2xx after DATA (taken), or a refusal at any stage (not taken).
  // 354 ("go ahead") is not one: a connection lost after it leaves the message unknown.
  if (rc == CURLE_OK || code >= 400) {
    response.outcome.kind = CallOutcome::Kind::kResponse;
    response.outcome.status = static_cast<int>(code);
    response.body = mail.last_reply;
    if (rc != CURLE_OK) response.error = detail;
    return;
  }
  response.error = detail;
  if (rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT) {
    response.outcome.kind = CallOutcome::Kind::kInvalid;
    return;
  }
  // The server cannot take a message before DATA's final <CRLF>.<CRLF>.
  response.outcome.kind =
      mail.handed_over ? CallOutcome::Kind::kLostAfterSend : CallOutcome::Kind::kNotSent;
  if (mail.handed_over) response.error += " (after the whole message was sent)";
}

}  // namespace waystone::curl_mail
