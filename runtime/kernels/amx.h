// Whether the AMX units (matmul_q4_amx.cc, matmul_w8a8_amx.cc) are built: x86-64 Linux, where the OS
// grants the tile state to a process that asks (ort_glue.cc), and a compiler with AMX intrinsics.
#pragma once

#if defined(__x86_64__) && defined(__linux__) && (__GNUC__ >= 11 || __clang_major__ >= 12)
#define SPECRT_AMX_UNITS 1
#endif
