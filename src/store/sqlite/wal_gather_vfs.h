#pragma once

namespace waystone {

// The name of the VFS RegisterWalGatherVfs registers.
inline constexpr char kWalGatherVfs[] = "waystone-wal-gather";

// Registers, once per process, a VFS over the default one that gathers the appends
// to a WAL file in memory and writes them in one piece before the file is synced,
// read, sized, truncated, closed or written elsewhere. SQLite writes each WAL frame
// as two writes (header, page), so a group commit of 40 pages costs 80 system calls
// without it and one with it. Only for connections where every commit syncs the WAL
// (synchronous FULL or EXTRA): SQLite publishes a commit's frames to other
// connections after that sync, so they never read the file before the gathered
// writes reach it. Returns false when the default VFS cannot be wrapped.
bool RegisterWalGatherVfs();

}  // namespace waystone
