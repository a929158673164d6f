# llama.cpp's CPU target, for every build of llama-cpp-python: the Makefile's (`make test`) and
# deploy/Dockerfile's, passed as CMAKE_ARGS="-C <this file>" (a CMake initial-cache script).
#
# llama.cpp builds for the build machine's own CPU by default (GGML_NATIVE): such a build crashed
# on another CPU of our machine kind (an Intel Xeon with AMX, where earlier machines were AMD EPYC).
# This is a portable x86-64 target instead: the instruction sets of x86-64-v3 (SSE4.2, AVX, AVX2,
# FMA, F16C, BMI2), which every machine of our kind has, and none of AVX-VNNI, AVX-512 or AMX.
# docs/deploy.md, "GGUF agents", says how to build for one's own CPU instead.
set(GGML_NATIVE OFF CACHE BOOL "")
set(GGML_SSE42 ON CACHE BOOL "")
set(GGML_AVX ON CACHE BOOL "")
set(GGML_AVX2 ON CACHE BOOL "")
set(GGML_FMA ON CACHE BOOL "")
set(GGML_F16C ON CACHE BOOL "")
set(GGML_BMI2 ON CACHE BOOL "")
set(GGML_AVX_VNNI OFF CACHE BOOL "")
set(GGML_AVX512 OFF CACHE BOOL "")
set(GGML_AVX512_VBMI OFF CACHE BOOL "")
set(GGML_AVX512_VNNI OFF CACHE BOOL "")
set(GGML_AVX512_BF16 OFF CACHE BOOL "")
set(GGML_AMX_TILE OFF CACHE BOOL "")
set(GGML_AMX_INT8 OFF CACHE BOOL "")
set(GGML_AMX_BF16 OFF CACHE BOOL "")
