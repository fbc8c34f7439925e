#pragma once

// Store-internal: the parts of the batch statements both dialects share (which
// item states are open, and the states an update lands in), written once.

#include <string>

#include "store/sql_values.h"

namespace waystone {

// Items a batch still waits for: pending, applying, applied.
inline std::string SqlOpenItemStates() {
  return SqlList(BatchItemState::kPending, BatchItemState::kApplying, BatchItemState::kApplied);
}

// True for the item states that end an item (its finished_at is set).
inline bool IsFinalItemState(BatchItemState state) {
  return state != BatchItemState::kPending && state != BatchItemState::kApplying &&
         state != BatchItemState::kApplied;
}

}  // namespace waystone
