#pragma once

namespace waystone {

// The name of the VFS RegisterWalGatherVfs registers.
inline constexpr char kWalGatherVfs[] = "waystone-wal-gather";

// Registers, once per process, a VFS over the default one that gathers the appends
// to a WAL file in memory and writes them in one piece before the file is synced,
// read, sized, truncated, closed or written elsewhere, and before its database file's
// WAL index is locked, unlocked or published (xShmLock, xShmBarrier). SQLite writes
// each WAL frame as two writes (header, page), so a commit of 40 pages costs 80
// system calls without it and one or two with it. Only for connections where every
// commit syncs the WAL (synchronous FULL or EXTRA), and only where the database file
// overwrites power-safely (not `?psow=0`): a commit's frames are then all in the file
// when SQLite publishes them to other connections, and whatever a rolled-back
// transaction spilled is in the file before another writer may append. A write that
// fails fails every later write, read and sync of that WAL until the write lock is
// released, so its transaction cannot commit. Not for a connection whose `synchronous`
// changes after it opens (a commit without a sync would be published with nothing to
// report a failed write to) or that sets `locking_mode=EXCLUSIVE` (its write lock never
// passes through xShmLock, so a failed write would fail the connection until it
// closes); the store does neither. Returns false when the default VFS cannot be wrapped.
bool RegisterWalGatherVfs();

}  // namespace waystone
