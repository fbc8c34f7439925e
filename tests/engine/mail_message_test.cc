// The email a notify step sends, as bytes: headers that cannot be split by what a
// template renders, an RFC 2047 subject, a 7bit or base64 body.

#include "engine/drive/mail_message.h"

#include <gtest/gtest.h>

#include "base/base64.h"

namespace waystone {
namespace {

MailFields Fields() {
  return {.from = "orders@shop.example",
          .to = "kim@customer.example",
          .subject = "Order ORD-1",
          .text = "Line one\nLine two\r\n",
          .message_id = "0b1c2d3e-0000-8000-8000-000000000001",
          .delivery = "notify:c-1:confirmed@2:default:o-1/create:email"};
}

TEST(MailMessageTest, AnAsciiMessage) {
  auto message = ComposeMail(Fields());
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(*message,
            "From: orders@shop.example\r\n"
            "To: kim@customer.example\r\n"
            "Subject: Order ORD-1\r\n"
            "Message-ID: <0b1c2d3e-0000-8000-8000-000000000001@shop.example>\r\n"
            "X-Waystone-Delivery: notify:c-1:confirmed@2:default:o-1/create:email\r\n"
            "MIME-Version: 1.0\r\n"
            "Content-Type: text/plain; charset=UTF-8\r\n"
            "Content-Transfer-Encoding: 7bit\r\n"
            "\r\n"
            "Line one\r\nLine two\r\n");
}

TEST(MailMessageTest, NonAsciiTravelsEncoded) {
  MailFields fields = Fields();
  // 3-byte characters: 45-byte words split between characters, never inside one.
  fields.subject = "ご注文を承りました。ご注文を承りました。ご注文を承りました。";
  fields.text = "ありがとう\nございます";
  auto message = ComposeMail(fields);
  ASSERT_TRUE(message.ok()) << message.status();
  const size_t subject = message->find("Subject: ");
  const size_t end = message->find("\r\nMessage-ID");
  std::string header = message->substr(subject + 9, end - subject - 9);
  std::string decoded;
  size_t at = 0;
  int words = 0;
  while ((at = header.find("=?UTF-8?B?", at)) != std::string::npos) {
    const size_t close = header.find("?=", at + 10);
    ASSERT_NE(close, std::string::npos);
    EXPECT_LE(close + 2 - at, 75u) << "an encoded word is at most 75 characters";
    auto bytes = Base64Decode(header.substr(at + 10, close - at - 10));
    ASSERT_TRUE(bytes.has_value());
    EXPECT_EQ(bytes->size() % 3, 0u) << "a word ends between characters";
    decoded += *bytes;
    at = close + 2;
    ++words;
  }
  EXPECT_EQ(decoded, fields.subject);
  EXPECT_GT(words, 1);
  EXPECT_NE(message->find("Content-Transfer-Encoding: base64\r\n\r\n"), std::string::npos);
  const std::string body = message->substr(message->find("\r\n\r\n") + 4);
  std::string joined;
  for (size_t i = 0; i < body.size(); i = body.find("\r\n", i) + 2) {
    joined += body.substr(i, body.find("\r\n", i) - i);
  }
  EXPECT_EQ(Base64Decode(joined), "ありがとう\r\nございます\r\n");
}

TEST(MailMessageTest, ALongLineTravelsAsBase64) {
  MailFields fields = Fields();
  fields.text = std::string(1200, 'a');
  auto message = ComposeMail(fields);
  ASSERT_TRUE(message.ok());
  EXPECT_NE(message->find("Content-Transfer-Encoding: base64"), std::string::npos);
}

TEST(MailMessageTest, WhatWouldSplitAHeaderIsRefused) {
  struct Row {
    const char* name;
    void (*change)(MailFields&);
    const char* expected;
  };
  const Row rows[] = {
      {"a subject with a line break",
       [](MailFields& f) { f.subject = "Hi\r\nBcc: all@example.com"; },
       "email subject would contain a line break"},
      {"two recipients", [](MailFields& f) { f.to = "a@x.example, b@y.example"; },
       "email to 'a@x.example, b@y.example' is not one plain address"},
      {"a named address", [](MailFields& f) { f.from = "Shop <orders@shop.example>"; },
       "email from 'Shop <orders@shop.example>' is not one plain address"},
      {"no domain", [](MailFields& f) { f.to = "kim@"; }, "is not one plain address"},
      {"an address with a line break", [](MailFields& f) { f.to = "k@x.example\r\nX: y"; },
       "is not one plain address"},
      {"an empty message id", [](MailFields& f) { f.message_id = ""; },
       "email message id '' is not a plain ASCII word"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    MailFields fields = Fields();
    row.change(fields);
    auto message = ComposeMail(fields);
    ASSERT_FALSE(message.ok());
    EXPECT_NE(message.status().message().find(row.expected), std::string::npos) << message.status();
  }
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

TEST(MailMessageTest, TextThatIsNotUtf8StillEnds) {
  MailFields fields = Fields();
  fields.subject = "x" + std::string(100, '\x80');  // continuation bytes only
  auto message = ComposeMail(fields);
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_LT(message->size(), 2000u);
}

TEST(MailMessageTest, AnAddressIsPlainAscii) {
  EXPECT_TRUE(PlainAddress("kim.lee+orders@customer.example"));
  EXPECT_FALSE(PlainAddress("a@b@c.example"));
  EXPECT_FALSE(PlainAddress("キム@customer.example"));
  EXPECT_FALSE(PlainAddress("@customer.example"));
}

}  // namespace
}  // namespace waystone
