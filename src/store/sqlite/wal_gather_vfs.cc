#include "store/sqlite/wal_gather_vfs.h"

#include <sqlite3.h>

#include <cstdlib>
#include <cstring>

namespace waystone {
namespace {

// A file of the gathering VFS: the real file (opened by the default VFS) follows
// this header in the same allocation. Only a WAL file gathers writes, and only where
// the real file overwrites power-safely (SQLite then pads nothing after a commit's sync).
struct GatherFile {
  sqlite3_file base;  // its pMethods: kMethods
  sqlite3_file* real;
  bool gather;
  // A WAL file and its database file know each other: SQLite publishes frames (a barrier
  // in the database file's shared memory) and hands over the write lock (its xShmLock)
  // there, and nothing gathered may outlive either.
  GatherFile* wal_of_db;  // set on a database file while its WAL is open
  GatherFile* db_of_wal;  // set on a WAL file
  char* buffer;           // the appends not yet written, from `offset`
  sqlite3_int64 offset;   // where buffer[0] goes
  int used;
  // The error of a gathered write that failed, answered to every later write, read,
  // sync and size of this WAL until the write lock is released: SQLite believed those
  // bytes written, so the transaction that wrote them must not commit.
  int failed;
};

// The most the unix VFS writes at once (it masks a write's length with 0x1ffff):
// about 30 frames of 4 KiB pages. A transaction that writes more is written in
// several pieces.
constexpr int kBufferBytes = 0x1ffff;

sqlite3_vfs* g_real = nullptr;
sqlite3_vfs g_vfs;
sqlite3_io_methods g_methods;
// For a main database whose real file has no shared memory: SQLite must not be offered
// any (it would call ours, and ours a null method), and such a database's WAL is not
// gathered. (SQLite 3.40's unix VFS gives every main database shared memory; its pager
// itself refuses WAL to `?nolock=1`.)
sqlite3_io_methods g_methods_without_shm;

GatherFile* Of(sqlite3_file* file) { return reinterpret_cast<GatherFile*>(file); }

// Writes what is gathered; SQLITE_OK when there is nothing. A failure sticks (`failed`).
int Flush(GatherFile* f) {
  if (f->failed != SQLITE_OK) return f->failed;
  if (f->used == 0) return SQLITE_OK;
  const int rc = f->real->pMethods->xWrite(f->real, f->buffer, f->used, f->offset);
  f->used = 0;
  f->failed = rc;
  return rc;
}

// Writes what the database file's WAL gathered.
int FlushWalOf(GatherFile* db) {
  return db->wal_of_db != nullptr ? Flush(db->wal_of_db) : SQLITE_OK;
}

int Close(sqlite3_file* file) {
  GatherFile* f = Of(file);
  const int flushed = Flush(f);
  if (f->db_of_wal != nullptr) f->db_of_wal->wal_of_db = nullptr;
  if (f->wal_of_db != nullptr) f->wal_of_db->db_of_wal = nullptr;
  f->db_of_wal = f->wal_of_db = nullptr;
  const int closed = f->real->pMethods->xClose(f->real);
  std::free(f->buffer);
  f->buffer = nullptr;
  return flushed != SQLITE_OK ? flushed : closed;
}

int Read(sqlite3_file* file, void* out, int amount, sqlite3_int64 offset) {
  GatherFile* f = Of(file);
  if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  return f->real->pMethods->xRead(f->real, out, amount, offset);
}

int Write(sqlite3_file* file, const void* data, int amount, sqlite3_int64 offset) {
  GatherFile* f = Of(file);
  if (!f->gather) return f->real->pMethods->xWrite(f->real, data, amount, offset);
  if (f->failed != SQLITE_OK) return f->failed;
  // A WAL is written front to back within a transaction: gather what follows on.
  if (f->used > 0 && (offset != f->offset + f->used || f->used + amount > kBufferBytes)) {
    if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  }
  if (amount > kBufferBytes) return f->real->pMethods->xWrite(f->real, data, amount, offset);
  if (f->buffer == nullptr) {
    f->buffer = static_cast<char*>(std::malloc(kBufferBytes));
    if (f->buffer == nullptr) return SQLITE_IOERR_NOMEM;
  }
  if (f->used == 0) f->offset = offset;
  std::memcpy(f->buffer + f->used, data, static_cast<size_t>(amount));
  f->used += amount;
  return SQLITE_OK;
}

int Truncate(sqlite3_file* file, sqlite3_int64 size) {
  GatherFile* f = Of(file);
  if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  return f->real->pMethods->xTruncate(f->real, size);
}

int Sync(sqlite3_file* file, int flags) {
  GatherFile* f = Of(file);
  if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  return f->real->pMethods->xSync(f->real, flags);
}

int FileSize(sqlite3_file* file, sqlite3_int64* size) {
  GatherFile* f = Of(file);
  if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  return f->real->pMethods->xFileSize(f->real, size);
}

int Lock(sqlite3_file* file, int level) {
  return Of(file)->real->pMethods->xLock(Of(file)->real, level);
}
int Unlock(sqlite3_file* file, int level) {
  GatherFile* f = Of(file);
  const int flushed = FlushWalOf(f);
  const int unlocked = f->real->pMethods->xUnlock(f->real, level);
  return flushed != SQLITE_OK ? flushed : unlocked;
}
int CheckReservedLock(sqlite3_file* file, int* out) {
  return Of(file)->real->pMethods->xCheckReservedLock(Of(file)->real, out);
}
int FileControl(sqlite3_file* file, int op, void* arg) {
  GatherFile* f = Of(file);
  if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  return f->real->pMethods->xFileControl(f->real, op, arg);
}
int SectorSize(sqlite3_file* file) { return Of(file)->real->pMethods->xSectorSize(Of(file)->real); }
int DeviceCharacteristics(sqlite3_file* file) {
  return Of(file)->real->pMethods->xDeviceCharacteristics(Of(file)->real);
}
int ShmMap(sqlite3_file* file, int page, int size, int extend, void volatile** out) {
  return Of(file)->real->pMethods->xShmMap(Of(file)->real, page, size, extend, out);
}
// Every lock of the WAL index goes through here, the write lock's release among them:
// what the WAL gathered is written first, so no other connection or process takes the
// write lock while frames of this one (a rolled-back transaction's spilled pages) are
// still to be written over the frames it will append. A release always happens (SQLite
// ignores its result); a lock is refused when the write failed.
int ShmLock(sqlite3_file* file, int offset, int n, int flags) {
  GatherFile* f = Of(file);
  const int flushed = FlushWalOf(f);
  if ((flags & SQLITE_SHM_LOCK) != 0) {
    if (flushed != SQLITE_OK) return flushed;
    return f->real->pMethods->xShmLock(f->real, offset, n, flags);
  }
  // Slot 0 is the WAL's write lock (WAL_WRITE_LOCK in wal.c): with it goes a failed
  // write's transaction, rolled back by now.
  if (offset == 0 && f->wal_of_db != nullptr) f->wal_of_db->failed = SQLITE_OK;
  return f->real->pMethods->xShmLock(f->real, offset, n, flags);
}
// SQLite calls the barrier between the two copies of a WAL index header it publishes:
// frames it points readers at are in the file by then. (A commit's sync has already
// written them; this holds should anything be gathered after it.)
void ShmBarrier(sqlite3_file* file) {
  GatherFile* f = Of(file);
  (void)FlushWalOf(f);
  f->real->pMethods->xShmBarrier(f->real);
}
int ShmUnmap(sqlite3_file* file, int remove) {
  return Of(file)->real->pMethods->xShmUnmap(Of(file)->real, remove);
}
int Fetch(sqlite3_file* file, sqlite3_int64 offset, int amount, void** out) {
  GatherFile* f = Of(file);
  if (const int rc = Flush(f); rc != SQLITE_OK) return rc;
  return f->real->pMethods->xFetch(f->real, offset, amount, out);
}
int Unfetch(sqlite3_file* file, sqlite3_int64 offset, void* page) {
  return Of(file)->real->pMethods->xUnfetch(Of(file)->real, offset, page);
}

int Open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file, int flags, int* out_flags) {
  GatherFile* f = Of(file);
  f->real = reinterpret_cast<sqlite3_file*>(f + 1);
  f->gather = false;
  f->wal_of_db = nullptr;
  f->db_of_wal = nullptr;
  f->buffer = nullptr;
  f->offset = 0;
  f->used = 0;
  f->failed = SQLITE_OK;
  const int rc = g_real->xOpen(g_real, name, f->real, flags, out_flags);
  f->base.pMethods = nullptr;  // until the real file is open: SQLite then calls no xClose
  if (f->real->pMethods == nullptr) return rc;
  if (f->real->pMethods->iVersion < 3) {  // ours forward xShm* and xFetch to it
    f->real->pMethods->xClose(f->real);
    return SQLITE_CANTOPEN;
  }
  // (The unix VFS opens every file but a main database without locks or shared memory;
  // only a main database's methods decide whether SQLite may use shared memory.)
  if ((flags & SQLITE_OPEN_MAIN_DB) != 0 && f->real->pMethods->xShmMap == nullptr) {
    f->base.pMethods = &g_methods_without_shm;
    return rc;
  }
  f->base.pMethods = &g_methods;
  if ((flags & SQLITE_OPEN_WAL) != 0) {
    // A WAL opened through this VFS belongs to a database file opened through it.
    sqlite3_file* db = sqlite3_database_file_object(name);
    if (db != nullptr && db->pMethods == &g_methods && Of(db)->wal_of_db == nullptr) {
      f->db_of_wal = Of(db);
      Of(db)->wal_of_db = f;
      // With power-safe overwrite off (`?psow=0`, which SQLite reads from the database
      // file) it pads a commit to a sector and writes part of that after the sync: such
      // a WAL is written as it comes.
      sqlite3_file* real_db = Of(db)->real;
      f->gather = (real_db->pMethods->xDeviceCharacteristics(real_db) &
                   SQLITE_IOCAP_POWERSAFE_OVERWRITE) != 0;
    }
  }
  return rc;
}

int Delete(sqlite3_vfs*, const char* name, int sync_dir) {
  return g_real->xDelete(g_real, name, sync_dir);
}
int Access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_real->xAccess(g_real, name, flags, out);
}
int FullPathname(sqlite3_vfs*, const char* name, int size, char* out) {
  return g_real->xFullPathname(g_real, name, size, out);
}
void* DlOpen(sqlite3_vfs*, const char* name) { return g_real->xDlOpen(g_real, name); }
void DlError(sqlite3_vfs*, int size, char* out) { g_real->xDlError(g_real, size, out); }
void (*DlSym(sqlite3_vfs*, void* handle, const char* symbol))(void) {
  return g_real->xDlSym(g_real, handle, symbol);
}
void DlClose(sqlite3_vfs*, void* handle) { g_real->xDlClose(g_real, handle); }
int Randomness(sqlite3_vfs*, int size, char* out) { return g_real->xRandomness(g_real, size, out); }
int Sleep(sqlite3_vfs*, int micros) { return g_real->xSleep(g_real, micros); }
int CurrentTime(sqlite3_vfs*, double* out) { return g_real->xCurrentTime(g_real, out); }
int GetLastError(sqlite3_vfs*, int size, char* out) {
  return g_real->xGetLastError(g_real, size, out);
}
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* out) {
  return g_real->xCurrentTimeInt64(g_real, out);
}

int Register() {
  g_real = sqlite3_vfs_find(nullptr);
  if (g_real == nullptr || g_real->iVersion < 2 || g_real->xCurrentTimeInt64 == nullptr) {
    return SQLITE_ERROR;
  }
  g_methods = {};
  g_methods.iVersion = 3;
  g_methods.xClose = Close;
  g_methods.xRead = Read;
  g_methods.xWrite = Write;
  g_methods.xTruncate = Truncate;
  g_methods.xSync = Sync;
  g_methods.xFileSize = FileSize;
  g_methods.xLock = Lock;
  g_methods.xUnlock = Unlock;
  g_methods.xCheckReservedLock = CheckReservedLock;
  g_methods.xFileControl = FileControl;
  g_methods.xSectorSize = SectorSize;
  g_methods.xDeviceCharacteristics = DeviceCharacteristics;
  g_methods.xShmMap = ShmMap;
  g_methods.xShmLock = ShmLock;
  g_methods.xShmBarrier = ShmBarrier;
  g_methods.xShmUnmap = ShmUnmap;
  g_methods.xFetch = Fetch;
  g_methods.xUnfetch = Unfetch;
  g_methods_without_shm = g_methods;
  g_methods_without_shm.xShmMap = nullptr;
  g_methods_without_shm.xShmLock = nullptr;
  g_methods_without_shm.xShmBarrier = nullptr;
  g_methods_without_shm.xShmUnmap = nullptr;
  g_vfs = {};
  g_vfs.iVersion = 2;
  g_vfs.szOsFile = static_cast<int>(sizeof(GatherFile)) + g_real->szOsFile;
  g_vfs.mxPathname = g_real->mxPathname;
  g_vfs.zName = kWalGatherVfs;
  g_vfs.xOpen = Open;
  g_vfs.xDelete = Delete;
  g_vfs.xAccess = Access;
  g_vfs.xFullPathname = FullPathname;
  g_vfs.xDlOpen = DlOpen;
  g_vfs.xDlError = DlError;
  g_vfs.xDlSym = DlSym;
  g_vfs.xDlClose = DlClose;
  g_vfs.xRandomness = Randomness;
  g_vfs.xSleep = Sleep;
  g_vfs.xCurrentTime = CurrentTime;
  g_vfs.xGetLastError = GetLastError;
  g_vfs.xCurrentTimeInt64 = CurrentTimeInt64;
  return sqlite3_vfs_register(&g_vfs, 0);
}

}  // namespace

bool RegisterWalGatherVfs() {
  static const int rc = Register();
  return rc == SQLITE_OK;
}

}  // namespace waystone
