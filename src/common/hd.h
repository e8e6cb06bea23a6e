// Marks functions shared by host and device code; plain inline when nvcc is absent.
#pragma once
#if defined(__CUDACC__)
#define ESCALA_HD __host__ __device__ __forceinline__
#else
#define ESCALA_HD inline
#endif
