#include "base/base64.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

// RFC 4648 §10 test vectors, both ways.
TEST(Base64Test, RfcVectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    EXPECT_EQ(Base64Decode(encoded), std::optional<std::string>(plain)) << encoded;
  }
}

TEST(Base64Test, DecodesBinaryUnpaddedAndWrapped) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  const std::string encoded = Base64Encode(bytes);
  EXPECT_EQ(Base64Decode(encoded), bytes);
  std::string wrapped;
  for (size_t i = 0; i < encoded.size(); i += 76) wrapped += encoded.substr(i, 76) + "\r\n";
  EXPECT_EQ(Base64Decode(wrapped), bytes);
  EXPECT_EQ(Base64Decode("Zm8"), std::optional<std::string>("fo"));
}

TEST(Base64Test, RefusesWhatIsNotBase64) {
  for (const char* bad : {"Zm9v!", "Z", "Zm9vY", "Zg=a", "Zg===", "Z===", "-_-_"}) {
    EXPECT_EQ(Base64Decode(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace waystone
