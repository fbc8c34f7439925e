#include "store/sqlite/sqlite_store.h"
#include "store/store.h"

namespace waystone {

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const StoreOptions& options) {
  if (options.path.starts_with("postgres://") || options.path.starts_with("postgresql://")) {
    return absl::UnimplementedError(
        "PostgreSQL stores are not available in this build yet; use a SQLite file path");
  }
  auto store = SqliteStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(std::move(*store));
}

}  // namespace waystone
