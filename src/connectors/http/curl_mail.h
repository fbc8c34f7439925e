#pragma once

// Inside the curl client (curl_http_client.cc only): a request that sends an email
// over SMTP (HttpRequest::IsMail) set up on an easy handle, and how its transfer
// ended read as an HttpResponse.

#include <curl/curl.h>

#include <string>

#include "connectors/http/http_client.h"

namespace waystone::curl_mail {

// One email on its way: the message as libcurl reads it for DATA, and the server's
// last reply.
struct MailTransfer {
  std::string message;  // the request's body, with a Date: when it had none
  size_t offset = 0;
  // libcurl read all of it: it then ends DATA with <CRLF>.<CRLF>, and from here on
  // the server may have taken the message.
  bool handed_over = false;
  std::string last_reply;  // the server's last reply line, e.g. "250 2.0.0 Ok: queued"
  curl_slist* recipients = nullptr;

  MailTransfer() = default;
  ~MailTransfer() { curl_slist_free_all(recipients); }
  MailTransfer(const MailTransfer&) = delete;
  MailTransfer& operator=(const MailTransfer&) = delete;
};

// Sets `curl` up to send `request` (an email) through `mail`, which must outlive the
// transfer. Leaves what every request shares (timeouts, TLS, may_send) to the caller.
void Configure(CURL* curl, const HttpRequest& request, MailTransfer& mail);

// Fills in `response` from how the transfer ended (`rc`), when the caller has not
// already (a withdrawn request, a refused certificate): the server's last reply when
// it gave one that settles the message (2xx taken, 4xx/5xx refused), otherwise
// kNotSent before the whole message was handed over and kLostAfterSend after.
void Conclude(CURL* curl, CURLcode rc, const MailTransfer& mail, const std::string& detail,
              HttpResponse& response);

}  // namespace waystone::curl_mail
