# Resolves DSV41RT_WITH_NCCL (AUTO / ON / OFF) and finds nccl.h. Only the header is needed:
# libnccl.so.2 is dlopen'ed at run time (cpp/comm/nccl_loader.h), so CI machines without a GPU
# still compile NcclComm, and the built package imports where NCCL is absent.
#
# nccl.h is looked for in NCCL_INCLUDE_DIR, then in the nvidia-nccl-cu13 package of the Python
# that runs the build (pip's nvidia/nccl/include; torch's CUDA wheels depend on it), then in the
# system include directories. Sets DSV41RT_NCCL_INCLUDE_DIR and, when the package ships the
# library beside the header, DSV41RT_NCCL_LIBRARY_DIR (the loader's build-time fallback).
# Include after DSV41RT_WITH_CUDA is resolved: NCCL needs the CUDA backend.

set(NCCL_INCLUDE_DIR "" CACHE PATH "dsv41rt: directory holding nccl.h (else found automatically)")

set(_dsv41rt_nccl_hints ${NCCL_INCLUDE_DIR})
# The Python the build was given (scikit-build-core passes it), else the first on PATH (an
# activated venv's, as in scripts/test.sh).
if(Python_EXECUTABLE)
  set(_dsv41rt_python "${Python_EXECUTABLE}")
elseif(Python3_EXECUTABLE)
  set(_dsv41rt_python "${Python3_EXECUTABLE}")
else()
  find_program(DSV41RT_NCCL_PYTHON NAMES python3 python DOC "dsv41rt: Python that looks for nccl.h")
  set(_dsv41rt_python "${DSV41RT_NCCL_PYTHON}")
endif()
if(_dsv41rt_python AND NOT DSV41RT_WITH_NCCL STREQUAL "OFF")
  # nvidia.nccl is a namespace package (no __init__.py, __file__ is None): take every entry of
  # __path__ rather than a module file's directory.
  execute_process(
    COMMAND "${_dsv41rt_python}" -c
            "import nvidia.nccl as m; print(';'.join(p + '/include' for p in m.__path__))"
    OUTPUT_VARIABLE _dsv41rt_nccl_pkg_includes
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET
    RESULT_VARIABLE _dsv41rt_nccl_pkg_rc)
  if(_dsv41rt_nccl_pkg_rc EQUAL 0)
    list(APPEND _dsv41rt_nccl_hints ${_dsv41rt_nccl_pkg_includes})
  endif()
endif()

# Cached per build directory; a NOTFOUND result is retried on every configure.
find_path(DSV41RT_NCCL_INCLUDE_DIR nccl.h HINTS ${_dsv41rt_nccl_hints}
          DOC "dsv41rt: directory of the nccl.h NcclComm compiles against")

if(DSV41RT_WITH_NCCL STREQUAL "AUTO")
  if(DSV41RT_WITH_CUDA AND DSV41RT_NCCL_INCLUDE_DIR)
    set(DSV41RT_WITH_NCCL ON)
  else()
    set(DSV41RT_WITH_NCCL OFF)
  endif()
elseif(DSV41RT_WITH_NCCL)
  if(NOT DSV41RT_WITH_CUDA)
    message(FATAL_ERROR "DSV41RT_WITH_NCCL=ON needs the CUDA backend (DSV41RT_WITH_CUDA)")
  endif()
  if(NOT DSV41RT_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "DSV41RT_WITH_NCCL=ON but nccl.h was not found: pip install "
                        "nvidia-nccl-cu13 into the building Python, or set NCCL_INCLUDE_DIR")
  endif()
endif()

set(DSV41RT_NCCL_LIBRARY_DIR "")
if(DSV41RT_WITH_NCCL)
  get_filename_component(_dsv41rt_nccl_libdir "${DSV41RT_NCCL_INCLUDE_DIR}/../lib" ABSOLUTE)
  if(EXISTS "${_dsv41rt_nccl_libdir}/libnccl.so.2")
    set(DSV41RT_NCCL_LIBRARY_DIR "${_dsv41rt_nccl_libdir}")
  endif()
  message(STATUS "dsv41rt: NCCL communicator ON (nccl.h in ${DSV41RT_NCCL_INCLUDE_DIR}; "
                 "libnccl.so.2 loaded at run time)")
else()
  message(STATUS "dsv41rt: NCCL communicator OFF")
endif()
