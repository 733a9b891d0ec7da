// Symbol visibility for libdsv41rt.so.
//
// The library is built with -fvisibility=hidden so that only the intended API is exported (keeps
// the dynamic symbol table small and lets the optimiser treat internals as local). Every public
// class and free function is marked DSV41RT_API so the Python extension and the C++ tests can link
// against the shared library.
#pragma once

#if defined(_WIN32)
#if defined(DSV41RT_BUILDING_LIBRARY)
#define DSV41RT_API __declspec(dllexport)
#else
#define DSV41RT_API __declspec(dllimport)
#endif
#else
#define DSV41RT_API __attribute__((visibility("default")))
#endif
