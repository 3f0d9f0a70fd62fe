// Version string.
#include "detops/version.h"

#define DETOPS_STR2(x) #x
#define DETOPS_STR(x) DETOPS_STR2(x)

namespace detops {
const char* version_string() {
  return DETOPS_STR(DETOPS_VERSION_MAJOR) "." DETOPS_STR(DETOPS_VERSION_MINOR) "." DETOPS_STR(DETOPS_VERSION_PATCH);
}
}  // namespace detops
