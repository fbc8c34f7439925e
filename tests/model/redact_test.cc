#include "base/redact.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/json_text.h"

namespace waystone {
namespace {

// The registry is process-wide: each test registers values of its own.
TEST(RedactSecretsTest, EveryFormAJsonEncoderWritesIsReplaced) {
  RegisterSecretValue("s3cr3t-\"value\"/x");
  EXPECT_EQ(RedactSecrets("token s3cr3t-\"value\"/x here"), "token *** here");
  EXPECT_EQ(RedactSecrets(R"({"echo":"s3cr3t-\"value\"/x"})"), R"({"echo":"***"})");
  EXPECT_EQ(RedactSecrets(R"({"echo":"s3cr3t-\"value\"\/x"})"), R"({"echo":"***"})");
  EXPECT_EQ(RedactSecrets(R"({"echo":"s3cr3t\u002d\u0022value\u0022\u002fx"})"),
            R"({"echo":"***"})");
  // Other forms (percent-encoded in a URL) are registered as values of their own
  // (TemplateEnvironment does); unregistered, they stay.
  EXPECT_EQ(RedactSecrets("q=s3cr3t-%22value%22%2Fx"), "q=s3cr3t-%22value%22%2Fx");
  RegisterSecretValue("abc12");  // too short to tell apart: not registered
  EXPECT_EQ(RedactSecrets("abc12"), "abc12");
}

TEST(RedactSecretsTest, JsonStaysJsonWhateverTheSecretLooksLike) {
  RegisterSecretValue("20242024");
  const std::string redacted =
      RedactJsonText(R"({"n":20242024,"s":"x20242024","20242024":[1,"20242024"]})");
  const nlohmann::json value = nlohmann::json::parse(redacted, nullptr, false);
  ASSERT_FALSE(value.is_discarded()) << redacted;
  EXPECT_EQ(value["n"], 20242024);  // a number is not a string: kept
  EXPECT_EQ(value["s"], "x***");
  EXPECT_EQ(value["***"][1], "***");
  EXPECT_EQ(RedactJsonText("not json 20242024"), "not json ***");
}

}  // namespace
}  // namespace waystone
