# Cross-compiling the CPU library for 64-bit Windows with MinGW-w64 (Debian/Ubuntu:
# apt-get install mingw-w64), from the source tree:
#   cmake -S . -B build-windows -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake -DPYROUNDLIB_WITH_CUDA=OFF
#   cmake --build build-windows
# gives build-windows/pyroundlib.dll and prl_abi_test.exe (`make windows` runs it under Wine).
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(PRL_MINGW_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${PRL_MINGW_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${PRL_MINGW_TRIPLE}-g++)
set(CMAKE_RC_COMPILER ${PRL_MINGW_TRIPLE}-windres)

# Headers and libraries from the MinGW sysroot only; programs (cmake's tools) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${PRL_MINGW_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
