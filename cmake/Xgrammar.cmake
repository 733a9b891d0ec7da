# xgrammar (https://github.com/mlc-ai/xgrammar, Apache-2.0): grammar-constrained decoding
# (cpp/runtime/engine/grammar.h). Its C++ core is compiled from the release's source distribution
# (the PyPI sdist, pinned by hash) into a static library linked into dsv41rt_core; nothing of its
# Python package is used.
#
#   DSV41RT_WITH_XGRAMMAR   AUTO (default): with xgrammar when its source can be had (downloaded
#                           once into build/_downloads, or DSV41RT_XGRAMMAR_SOURCE), else without
#                           (grammars are then refused at submit, naming why); ON: required; OFF.
#   DSV41RT_XGRAMMAR_SOURCE an unpacked source tree or the .tar.gz, for machines that cannot
#                           download (the GPU machine: bench/device_session.sh carries it).
set(DSV41RT_WITH_XGRAMMAR AUTO CACHE STRING "dsv41rt: grammar-constrained decoding with xgrammar (AUTO, ON, OFF)")
set(DSV41RT_XGRAMMAR_SOURCE "" CACHE PATH "dsv41rt: xgrammar 0.2.9 source tree or .tar.gz (empty: download the pinned sdist)")

set(_xg_version 0.2.9)
set(_xg_sha256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(_xg_url "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${_xg_version}.tar.gz")

function(_dsv41rt_xgrammar_source out)
  set(${out} "" PARENT_SCOPE)
  if(DSV41RT_XGRAMMAR_SOURCE AND IS_DIRECTORY "${DSV41RT_XGRAMMAR_SOURCE}")
    set(${out} "${DSV41RT_XGRAMMAR_SOURCE}" PARENT_SCOPE)
    return()
  endif()
  set(archive "${DSV41RT_XGRAMMAR_SOURCE}")
  if(NOT archive)
    # Shared by every build tree of this checkout (CI configures four).
    set(archive "${PROJECT_SOURCE_DIR}/build/_downloads/xgrammar-${_xg_version}.tar.gz")
    if(NOT EXISTS "${archive}")
      file(DOWNLOAD "${_xg_url}" "${archive}.part" EXPECTED_HASH SHA256=${_xg_sha256} STATUS st TLS_VERIFY ON)
      list(GET st 0 code)
      if(NOT code EQUAL 0)
        file(REMOVE "${archive}.part")
        message(STATUS "dsv41rt: xgrammar download failed (${st})")
        return()
      endif()
      file(RENAME "${archive}.part" "${archive}")
    endif()
  endif()
  if(NOT EXISTS "${archive}")
    message(STATUS "dsv41rt: no xgrammar source at ${archive}")
    return()
  endif()
  file(SHA256 "${archive}" got)
  if(NOT got STREQUAL _xg_sha256)
    message(FATAL_ERROR "dsv41rt: ${archive} is not xgrammar ${_xg_version} (sha256 ${got})")
  endif()
  set(dest "${CMAKE_BINARY_DIR}/_deps")
  if(NOT EXISTS "${dest}/xgrammar-${_xg_version}/include/xgrammar/xgrammar.h")
    file(ARCHIVE_EXTRACT INPUT "${archive}" DESTINATION "${dest}")
  endif()
  set(${out} "${dest}/xgrammar-${_xg_version}" PARENT_SCOPE)
endfunction()

set(DSV41RT_HAVE_XGRAMMAR OFF)
if(NOT DSV41RT_WITH_XGRAMMAR STREQUAL "OFF")
  _dsv41rt_xgrammar_source(_xg_src)
  if(_xg_src)
    file(GLOB_RECURSE _xg_sources CONFIGURE_DEPENDS "${_xg_src}/cpp/*.cc")
    list(FILTER _xg_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
    add_library(dsv41rt_xgrammar STATIC ${_xg_sources})
    target_include_directories(dsv41rt_xgrammar PUBLIC "${_xg_src}/include")
    target_include_directories(dsv41rt_xgrammar SYSTEM PUBLIC
      "${_xg_src}/3rdparty/picojson" "${_xg_src}/3rdparty/dlpack/include")
    target_compile_definitions(dsv41rt_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
    # Its code, its warnings: not ours to fix. Built at -O2 whatever the build type (its matcher is
    # on the decode path).
    target_compile_options(dsv41rt_xgrammar PRIVATE -w -O2)
    set(DSV41RT_HAVE_XGRAMMAR ON)
  elseif(DSV41RT_WITH_XGRAMMAR STREQUAL "ON")
    message(FATAL_ERROR "dsv41rt: DSV41RT_WITH_XGRAMMAR=ON but no xgrammar source (set DSV41RT_XGRAMMAR_SOURCE)")
  endif()
endif()
message(STATUS "dsv41rt: grammar-constrained decoding (xgrammar ${_xg_version}) ${DSV41RT_HAVE_XGRAMMAR}")
