#pragma once

// Codec (waystone/workflow.h) for every type nlohmann::json converts: a struct with
// to_json/from_json (or NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE), std::vector, std::map,
// std::optional of those, nlohmann::json itself. Optional: include it where the
// program has nlohmann/json.hpp (Debian's nlohmann-json3-dev); Waystone's other
// headers do not need it. Decoding does not throw: a document that is not a T is
// InvalidArgument.

#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "waystone/workflow.h"

namespace waystone::api {

template <typename T>
struct Codec<T, std::enable_if_t<!std::is_arithmetic_v<T> && !std::is_same_v<T, std::string> &&
                                 !std::is_same_v<T, Json> &&
                                 std::is_constructible_v<nlohmann::json, const T&>>> {
  static std::string Encode(const T& value) {
    return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  static Result<T> Decode(const std::string& text) {
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return Status(Status::Code::kInvalidArgument, "not JSON: " + text.substr(0, 80));
    }
#if defined(__cpp_exceptions)
    try {
      return parsed.get<T>();
    } catch (const nlohmann::json::exception& e) {
      return Status(Status::Code::kInvalidArgument, e.what());
    }
#else
    return parsed.get<T>();
#endif
  }
};

}  // namespace waystone::api
