#include "store/postgres/pg_store.h"
#include "store/sqlite/sqlite_store.h"
#include "store/store.h"

namespace waystone {

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const StoreOptions& options) {
  if (options.attempts_per_step < 1) {
    return absl::InvalidArgumentError("attempts_per_step must be at least 1");
  }
  if (options.path.starts_with("postgres://") || options.path.starts_with("postgresql://")) {
    auto store = PostgresStore::Open(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(std::move(*store));
  }
  auto store = SqliteStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(std::move(*store));
}

}  // namespace waystone
