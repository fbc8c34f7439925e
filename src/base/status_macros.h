#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define WS_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                           \
    if (::absl::Status ws_status_ = (expr); !ws_status_.ok()) return ws_status_; \
  } while (0)

#define WS_CONCAT_INNER(a, b) a##b
#define WS_CONCAT(a, b) WS_CONCAT_INNER(a, b)

// Assigns the value of an absl::StatusOr<T> expression to `lhs`, or returns its status.
#define WS_ASSIGN_OR_RETURN(lhs, expr)                                                            \
  auto WS_CONCAT(ws_statusor_, __LINE__) = (expr);                                                \
  if (!WS_CONCAT(ws_statusor_, __LINE__).ok()) return WS_CONCAT(ws_statusor_, __LINE__).status(); \
  lhs = std::move(*WS_CONCAT(ws_statusor_, __LINE__))
