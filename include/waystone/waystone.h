#pragma once

// Waystone's public C++ API: everything a program that embeds Waystone includes.
// Link with the `waystone` library: find_package(waystone) and waystone::waystone
// in CMake, or `pkg-config --cflags --libs waystone`.

#include "waystone/engine.h"
#include "waystone/status.h"
#include "waystone/version.h"
#include "waystone/workflow.h"
