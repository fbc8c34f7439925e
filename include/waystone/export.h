#pragma once

// What the shared library exports: the public API's classes and functions, and
// nothing of the engine inside (it is built with hidden visibility).
#if defined(WAYSTONE_BUILDING_LIBRARY)
#define WAYSTONE_API [[gnu::visibility("default")]]
#else
#define WAYSTONE_API
#endif
