# Cross-compiling the CPU library for 64-bit Windows with MinGW-w64 (Debian/Ubuntu:
# apt-get install mingw-w64), from the source tree:
#   cmake -S . -B build-windows -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake -DPYROUNDLIB_WITH_CUDA=OFF
#   cmake --build build-windows
# gives build-windows/pyroundlib.dll and prl_abi_test.exe (`make windows` runs it under Wine).
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(PRL_MINGW_TRIPLE x86_64-w64-mingw32)
# Debian installs two thread models side by side and points the plain names at "win32",
# whose libstdc++ (before GCC 13) has no std::thread: the library would then run its CPU
# loops on the calling thread alone.  The "posix" compilers (winpthreads, linked statically
# with the rest of the runtime) are taken when they are there.
find_program(PRL_MINGW_POSIX_CXX ${PRL_MINGW_TRIPLE}-g++-posix)
if(PRL_MINGW_POSIX_CXX)
  set(CMAKE_C_COMPILER ${PRL_MINGW_TRIPLE}-gcc-posix)
  set(CMAKE_CXX_COMPILER ${PRL_MINGW_POSIX_CXX})
else()
  set(CMAKE_C_COMPILER ${PRL_MINGW_TRIPLE}-gcc)
  set(CMAKE_CXX_COMPILER ${PRL_MINGW_TRIPLE}-g++)
endif()
set(CMAKE_RC_COMPILER ${PRL_MINGW_TRIPLE}-windres)

# Headers and libraries from the MinGW sysroot only; programs (cmake's tools) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${PRL_MINGW_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
