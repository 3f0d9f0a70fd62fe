// detops version numbers.
#pragma once

#define DETOPS_VERSION_MAJOR 0
#define DETOPS_VERSION_MINOR 1
#define DETOPS_VERSION_PATCH 0

namespace detops {
/// "0.1.0"
const char* version_string();
}  // namespace detops
