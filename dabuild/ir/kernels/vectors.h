/* The float kernels' vector path: how wide a vector is and how many of them the CPU keeps in registers.
 *
 * Chosen at compile time from the compiler's target macros (what -march=native enabled), widest first:
 * 64 bytes where __AVX512F__ (32 registers), 32 bytes where __AVX__ (16 registers), else 16 bytes: NEON on
 * arm64 (32 registers) or SSE2 and anything else (16). DABUILD_VECTOR_BYTES=16|32 forces a narrower path
 * (the tests run every path the machine can run; native.py falls back to it when the wider one fails to
 * compile). A GNU vector wider than the CPU's registers is split by the compiler into several, and a
 * register block sized for 32 wide registers then spills: that is why the width follows the target.
 *
 * The register blocks (output pixels x vectors of output channels) fill the register file without
 * spilling: PIXELS * VECS accumulators, VECS weight vectors and one broadcast input. Every output's terms
 * are added in an order fixed by the source (see conv.c), so each path is deterministic.
 */
#ifndef DABUILD_VECTORS_H
#define DABUILD_VECTORS_H

#if defined(DABUILD_VECTOR_BYTES)
#define VBYTES DABUILD_VECTOR_BYTES
#elif defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif

#if VBYTES == 64 && defined(__AVX512F__)
#define VECTOR_PATH "avx512"
#define VREGISTERS 32
#elif VBYTES == 32 && defined(__AVX2__)
#define VECTOR_PATH "avx2"
#define VREGISTERS 16
#elif VBYTES == 32 && defined(__AVX__)
#define VECTOR_PATH "avx"
#define VREGISTERS 16
#elif VBYTES == 16 && (defined(__ARM_NEON) || defined(__aarch64__))
#define VECTOR_PATH "neon"
#define VREGISTERS 32
#elif VBYTES == 16 && defined(__SSE2__)
#define VECTOR_PATH "sse"
#define VREGISTERS 16
#elif VBYTES == 16
#define VECTOR_PATH "generic-16"
#define VREGISTERS 16
#else
#error "DABUILD_VECTOR_BYTES is wider than this target's vectors (the compiler's target macros lack it)"
#endif

/* conv.c's register block: 6 pixels x 4 vectors with 32 registers, 6 x 2 with 16 (24 or 12 accumulators). */
#if VREGISTERS >= 32
#define CONV_BLOCK_VECS 4
#define DEPTHWISE_PIXELS 8
#define ISLAND_VECS 4
#else
#define CONV_BLOCK_VECS 2
#define DEPTHWISE_PIXELS 4
#define ISLAND_VECS 2
#endif
#define FLOAT_LANES (VBYTES / 4)

#endif
