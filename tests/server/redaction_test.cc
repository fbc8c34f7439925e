// What a token without see_redacted is shown of an instance (server/redaction.h), from
// hand-made records: the value wherever it is quoted, as its encoders write it.

#include "server/redaction.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace waystone {
namespace {

using Json = nlohmann::json;

TEST(RedactionTest, AValueIsHiddenWhereAnAnswerQuotesItEscaped) {
  InstanceRecord instance;
  instance.input_json = R"({"name":"Zoë Ångström","dob":"1984-02-29","ref":"r1"})";
  // A downstream that escapes every non-ASCII character (Python's json.dumps), one
  // that writes them upper-case, and one that escapes nothing.
  Json shown = {
      {"input", Json::parse(instance.input_json)},
      {"status_reason", R"(HTTP 422: {"detail": "Zo\u00eb \u00c5ngstr\u00f6m is not allowed"})"},
      {"alerts", {{{"message", R"(HTTP 409: {"who":"Zo\u00EB \u00C5ngstr\u00F6m"})"}}}},
      {"steps", {{{"error", "HTTP 400: {\"who\":\"Zoë Ångström\",\"dob\":\"1984-02-29\"}"}}}}};
  RedactValues({"/name", "/dob"}, instance, {}, shown);
  const std::string text = shown.dump();
  for (const char* leaked : {"Zo", "ngstr", "1984-02-29"}) {
    EXPECT_EQ(text.find(leaked), std::string::npos) << leaked << " in " << text;
  }
  EXPECT_EQ(shown["input"]["name"], kRedactedValue);
  EXPECT_EQ(shown["input"]["ref"], "r1");
  EXPECT_NE(shown["status_reason"].get<std::string>().find("is not allowed"), std::string::npos)
      << shown["status_reason"];
}

TEST(RedactionTest, AValueWithQuotesIsHiddenWhereItIsQuotedInJson) {
  InstanceRecord instance;
  instance.input_json = R"({"note":"say \"hi\" \\ bye"})";
  Json shown = {{"status_reason", R"(HTTP 422: {"note":"say \"hi\" \\ bye"})"}};
  RedactValues({"/note"}, instance, {}, shown);
  EXPECT_EQ(shown["status_reason"].get<std::string>().find("hi"), std::string::npos)
      << shown["status_reason"];
}

}  // namespace
}  // namespace waystone
