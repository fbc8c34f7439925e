#pragma once

// Store-internal: a status marked as one refusal in particular (a delivery owned
// elsewhere, a lost lease, a sql step's statement refused), so that a batch can take
// it as one item's alone and never mistake the database's own error of the same code
// for it.

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace waystone {

// A status of `code` with `message`, carrying `mark`.
inline absl::Status MarkedStatus(absl::StatusCode code, absl::string_view message,
                                 absl::string_view mark) {
  absl::Status status(code, message);
  status.SetPayload(mark, absl::Cord("1"));
  return status;
}

// Whether `status` is of `code` and carries `mark`.
inline bool HasMark(const absl::Status& status, absl::StatusCode code, absl::string_view mark) {
  return status.code() == code && status.GetPayload(mark).has_value();
}

}  // namespace waystone
