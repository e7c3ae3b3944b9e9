/*
 * rng.h: the one splitmix64 of the library (Steele, Lea, Flood 2014): its finalizer, the
 * generator step built on it, and the uniform double on (0, 1) that the seeded writers draw.
 * The synthetic checkpoint writer (checkpoint.c), the synthetic workloads and request seeds
 * (workload.c) and the sampling hash (sampling_internal.h, host and device) all use these, so
 * one seed gives the same numbers everywhere. Static inline, compiled for host and device
 * under nvcc.
 */
#ifndef GDP_RNG_H
#define GDP_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define GDP_RNG_FN static inline __host__ __device__
#else
#define GDP_RNG_FN static inline
#endif

/* The golden-ratio increment of the splitmix64 state (an odd constant: the state visits every
 * 64-bit value once). */
#define GDP_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64's finalizer: a bijective 64-bit mix, so neighbouring inputs give unrelated outputs. */
GDP_RNG_FN uint64_t gdp_splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One splitmix64 step: advances *state by the gamma and returns the mixed new state. */
GDP_RNG_FN uint64_t gdp_splitmix64_next(uint64_t *state) { return gdp_splitmix64_mix(*state += GDP_SPLITMIX64_GAMMA); }

/* Uniform on the open interval (0, 1) from the top 53 bits: never 0 or 1, so log() of it and
 * of 1 - it is finite. */
GDP_RNG_FN double gdp_splitmix64_open01(uint64_t *state) {
    return ((double)(gdp_splitmix64_next(state) >> 11) + 0.5) * 0x1.0p-53;
}

#endif /* GDP_RNG_H */
