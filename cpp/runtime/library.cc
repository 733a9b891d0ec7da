// The translation unit of libdsv41rt.so itself: the library is the whole dsv41rt_core archive
// (see cpp/CMakeLists.txt); this file only gives the shared target a source and a version symbol.
#include "core/export.h"

extern "C" DSV41RT_API const char* dsv41rt_version_string() { return "0.1.0"; }
