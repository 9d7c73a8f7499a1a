/* Calibration histograms: per-channel extremes and bin counts of a float32 tensor, in one pass each.
 *
 * The tensor is seen as (outer, channels, inner) with element strides (so, sc, 1) when inner > 1, or
 * (outer, channels) with strides (so, 1) when inner == 1 (channels-last memory). Counting mirrors
 * dabuild.quant.histogram.Histogram.add exactly: bin = floor(value / width) - offset in double
 * precision (width a power of two, so multiplying by its reciprocal is the same exact division), or in
 * float32 a whole vector at a time where that gives the same bins (block_bins), bin 0 for a channel whose
 * width is still 0. Only channels [c0, c1) are touched, so threads can share a tensor.
 *
 * A channel's counts are int32 (half the memory and cache of int64: a ResNet-50's rows take 0.5 GB, not 1;
 * dabuild.quant.calibrate widens them, and counts in numpy, before any row could pass 2^31 - 1); the
 * whole-tensor row, which gathers every channel, is int64.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "vectors.h"
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#define HISTOGRAM_BINS 2048

typedef struct {
    const float *x;
    ptrdiff_t outer, channels, inner, outer_stride, channel_stride;
} TensorView;

static inline const float *element(const TensorView *v, ptrdiff_t o, ptrdiff_t c)
{
    return v->x + o * v->outer_stride + c * v->channel_stride;
}

typedef float floats __attribute__((vector_size(VBYTES)));  /* FLOAT_LANES lanes: vectors.h's path */
typedef int ints __attribute__((vector_size(VBYTES)));
typedef float floats_unaligned __attribute__((vector_size(VBYTES), aligned(4)));

/* One vector into running extremes: `value < low ? value : low` lane by lane as the scalar loop does (a NaN never
 * replaces an extreme), and 1 into *nonfinite's lane for each value that is NaN or infinite. */
static inline void fold_extremes(floats values, floats *lo, floats *hi, ints *nonfinite)
{
    floats magnitude = (floats)((ints)values & 0x7fffffff);
    *nonfinite += (magnitude < (INFINITY - (floats){0})) + 1;  /* a comparison gives -1 where true */
    ints below = values < *lo, above = values > *hi;
    *lo = (floats)(((ints)values & below) | ((ints)*lo & ~below));
    *hi = (floats)(((ints)values & above) | ((ints)*hi & ~above));
}

/* The extremes of n values, FLOAT_LANES lanes at a time (fold_extremes), the NaN and infinite ones counted in
 * *bad. */
static void run_extremes(const float *x, ptrdiff_t n, float *low, float *high, ptrdiff_t *bad)
{
    floats lo = *low - (floats){0}, hi = *high - (floats){0};
    ints nonfinite = {0};
    ptrdiff_t i = 0;
    for (; i + FLOAT_LANES <= n; i += FLOAT_LANES)
        fold_extremes(*(const floats_unaligned *)(x + i), &lo, &hi, &nonfinite);
    float l = *low, h = *high;
    for (int lane = 0; lane < FLOAT_LANES; lane++) {
        l = lo[lane] < l ? lo[lane] : l;
        h = hi[lane] > h ? hi[lane] : h;
        *bad += nonfinite[lane];
    }
    for (; i < n; i++) {
        *bad += !(fabsf(x[i]) < INFINITY);
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    *low = l;
    *high = h;
}

#define EXTREMES_VECTORS 4  /* vectors of channels whose extremes stay in registers over a block of pixels */
#define EXTREMES_BLOCK_BYTES 65536  /* the pixels whose channels every tile passes before the next (in L2 meanwhile) */
#define EXTREMES_BLOCK_PIXELS 16    /* fewest pixels a block holds, however many channels a pixel has */

/* The extremes of channels [c, c + FLOAT_LANES * EXTREMES_VECTORS) of channels-last pixels [o0, o1), kept in
 * registers while those pixels pass (lane by lane the scalar loop's comparisons, in the same pixel order). */
static void tile_extremes(const TensorView *v, ptrdiff_t c, ptrdiff_t o0, ptrdiff_t o1, float *low, float *high,
                          ptrdiff_t *bad)
{
    floats lo[EXTREMES_VECTORS], hi[EXTREMES_VECTORS];
    ints nonfinite = {0};
    for (int k = 0; k < EXTREMES_VECTORS; k++) {
        lo[k] = *(const floats_unaligned *)(low + c + FLOAT_LANES * k);
        hi[k] = *(const floats_unaligned *)(high + c + FLOAT_LANES * k);
    }
    for (ptrdiff_t o = o0; o < o1; o++) {
        const float *x = element(v, o, c);
        for (int k = 0; k < EXTREMES_VECTORS; k++)
            fold_extremes(*(const floats_unaligned *)(x + FLOAT_LANES * k), &lo[k], &hi[k], &nonfinite);
    }
    for (int k = 0; k < EXTREMES_VECTORS; k++) {
        *(floats_unaligned *)(low + c + FLOAT_LANES * k) = lo[k];
        *(floats_unaligned *)(high + c + FLOAT_LANES * k) = hi[k];
    }
    for (int lane = 0; lane < FLOAT_LANES; lane++)
        *bad += nonfinite[lane];
}

/* low[c] = min(low[c], values of channel c), high[c] likewise; returns how many values are NaN or infinite.
 *
 * Channels-last memory passes a block of pixels (EXTREMES_BLOCK_BYTES) at a time: every tile of channels, then
 * the channels left over pixel by pixel, reads the block before the next block is read. A tile passing every
 * pixel of a wide tensor (a ResNet-50 layer has 256 to 2048 channels) would read a few lines of each pixel, the
 * whole tensor once per tile at a stride the hardware prefetchers follow poorly; by blocks, memory is read in
 * order, once. Each channel still sees its values in pixel order, so the extremes (and which zero a tie keeps)
 * are the same. */
ptrdiff_t channel_extremes(const TensorView *v, float *restrict low, float *restrict high, ptrdiff_t c0, ptrdiff_t c1)
{
    ptrdiff_t bad = 0;
    if (v->inner == 1) {
        ptrdiff_t block = EXTREMES_BLOCK_BYTES / (ptrdiff_t)sizeof(float) / (v->outer_stride > 0 ? v->outer_stride : 1);
        block = block < EXTREMES_BLOCK_PIXELS ? EXTREMES_BLOCK_PIXELS : block;
        ptrdiff_t tiled = c0 + (c1 - c0) / (FLOAT_LANES * EXTREMES_VECTORS) * (FLOAT_LANES * EXTREMES_VECTORS);
        for (ptrdiff_t o0 = 0; o0 < v->outer; o0 += block) {
            ptrdiff_t o1 = v->outer - o0 < block ? v->outer : o0 + block;
            for (ptrdiff_t c = c0; c < tiled; c += FLOAT_LANES * EXTREMES_VECTORS)
                tile_extremes(v, c, o0, o1, low, high, &bad);
            for (ptrdiff_t o = o0; o < o1 && tiled < c1; o++) {
                const float *restrict x = element(v, o, 0);
                for (ptrdiff_t c = tiled; c < c1; c++) {  /* elementwise across channels: the compiler vectorises it */
                    float value = x[c];
                    bad += !(fabsf(value) < INFINITY);  /* NaN compares false */
                    low[c] = value < low[c] ? value : low[c];
                    high[c] = value > high[c] ? value : high[c];
                }
            }
        }
        return bad;
    }
    for (ptrdiff_t o = 0; o < v->outer; o++)
        for (ptrdiff_t c = c0; c < c1; c++)
            run_extremes(element(v, o, c), v->inner, &low[c], &high[c], &bad);
    return bad;
}

static inline int64_t bin(float value, double reciprocal, int64_t offset)
{
    return reciprocal > 0.0 ? (int64_t)floor((double)value * reciprocal) - offset : 0;
}

#define COUNT_BLOCK 64  /* values whose bins are computed together (vectorised) before they are counted */

typedef int ints_unaligned __attribute__((vector_size(VBYTES), aligned(4)));

/* floor(x) lane by lane. */
static inline floats floor_lanes(floats x)
{
#if VBYTES == 64 && defined(__AVX512F__)
    return (floats)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#elif VBYTES == 32 && defined(__AVX__)
    return (floats)_mm256_floor_ps((__m256)x);
#elif VBYTES == 16 && defined(__SSE4_1__)
    return (floats)_mm_floor_ps((__m128)x);
#elif VBYTES == 16 && defined(__aarch64__)
    return (floats)vrndmq_f32((float32x4_t)x);
#else
    floats y;
    for (int lane = 0; lane < FLOAT_LANES; lane++)
        y[lane] = floorf(x[lane]);
    return y;
#endif
}

/* Whether every lane of a comparison's result is true. */
static inline int all_lanes(ints holds)
{
#if VBYTES == 64 && defined(__AVX512F__)
    return _mm512_cmpneq_epi32_mask((__m512i)holds, _mm512_setzero_si512()) == 0xffff;
#elif VBYTES == 32 && defined(__AVX__)
    return _mm256_movemask_ps((__m256)holds) == 0xff;
#elif VBYTES == 16 && defined(__aarch64__)
    return vminvq_u32((uint32x4_t)holds) != 0;
#elif VBYTES == 16 && defined(__SSE2__)
    return _mm_movemask_ps((__m128)holds) == 0xf;
#else
    int all = -1;
    for (int lane = 0; lane < FLOAT_LANES; lane++)
        all &= holds[lane];
    return all != 0;
#endif
}

static inline ptrdiff_t vector_bins(const float *x, ptrdiff_t n, double r, int64_t first, int32_t *bins);

/* bins[i] = bin(x[i]) for n <= COUNT_BLOCK values, a vector at a time in float32 where that is exact: with a
 * power-of-two width whose reciprocal and width are normal floats, value * reciprocal is exact unless it
 * overflows or loses bits below the normal range (multiplying back by the width detects both), floor of it is
 * exact, and its difference from an offset that is a float (as an offset of a window around float32 values
 * is: past 2^24 the width is below the values' own spacing) is exact wherever the true difference is a bin of
 * the row (an integer in [0, BINS) is a float), which the range check asks. A vector with a lane that fails
 * (values outside the row only arise from a window a caller did not extend) and the last values take bin()'s
 * double arithmetic. */
static inline void block_bins(const float *x, ptrdiff_t n, double r, int64_t first, int32_t *bins)
{
    if (!(r > 0.0)) {
        for (ptrdiff_t i = 0; i < n; i++)
            bins[i] = 0;
        return;
    }
    for (ptrdiff_t i = vector_bins(x, n, r, first, bins); i < n; i++)
        bins[i] = (int32_t)bin(x[i], r, first);
}

/* The vector part of block_bins: bins[i] for the first values, a whole vector at a time, as long as every lane
 * passes the checks (so each bin lies in [0, BINS)); returns how many it binned. */
static inline ptrdiff_t vector_bins(const float *x, ptrdiff_t n, double r, int64_t first, int32_t *bins)
{
    ptrdiff_t i = 0;
    if (r >= 0x1p-125 && r <= 0x1p125 && fabs((double)first) < 0x1p62 && (int64_t)(float)first == first) {
        floats reciprocal = (float)r - (floats){0}, width = (float)(1.0 / r) - (floats){0};
        floats offset = (float)first - (floats){0};
        for (; i + FLOAT_LANES <= n; i += FLOAT_LANES) {
            floats values = *(const floats_unaligned *)(x + i);
            floats scaled = values * reciprocal;
            floats index = floor_lanes(scaled) - offset;
            ints holds = (scaled * width == values) & (index >= 0) & (index < (float)HISTOGRAM_BINS);
            if (!all_lanes(holds))
                break;
            *(ints_unaligned *)(bins + i) = __builtin_convertvector(index, ints);
        }
    }
    return i;
}

#if VBYTES == 32 && defined(__AVX2__)
/* compress_order[mask]: the lanes whose bit is set in mask, in order (then zeros), one byte each. */
static uint8_t compress_order[256][8];

__attribute__((constructor)) static void fill_compress_order(void)
{
    for (int mask = 0; mask < 256; mask++)
        for (int lane = 0, kept = 0; lane < 8; lane++)
            if (mask >> lane & 1)
                compress_order[mask][kept++] = (uint8_t)lane;
}
#endif

/* The values of x[0:n] that are not zero, in order, into out (room for n + 16), and how many; with AVX-512 or AVX2,
 * else every value (zeros are then counted like the others). ReLU outputs are half zeros, and counting them
 * one by one would make every increment of their bin wait for the previous one. */
static inline ptrdiff_t nonzero_values(const float *x, ptrdiff_t n, float *out)
{
    ptrdiff_t kept = 0, i = 0;
#if VBYTES == 64 && defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        __m512 values = _mm512_loadu_ps(x + i);
        __mmask16 nonzero = _mm512_cmp_ps_mask(values, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_storeu_ps(out + kept, _mm512_maskz_compress_ps(nonzero, values));  /* register form: fast */
        kept += __builtin_popcount(nonzero);
    }
#elif VBYTES == 32 && defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {  /* AVX2 has no compress: a permutation per 8-bit mask from compress_order */
        __m256 values = _mm256_loadu_ps(x + i);
        int nonzero = _mm256_movemask_ps(_mm256_cmp_ps(values, _mm256_setzero_ps(), _CMP_NEQ_UQ));
        __m256i order = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)compress_order[nonzero]));
        _mm256_storeu_ps(out + kept, _mm256_permutevar8x32_ps(values, order));
        kept += __builtin_popcount(nonzero);
    }
#endif
    for (; i < n; i++)
        out[kept++] = x[i];
    return kept;
}

/* row[bin] += 1 and (unless whole is NULL) whole[whole bin] += 1 for `count` consecutive values of one channel;
 * the zeros that nonzero_values set aside go to the bins of 0 at once (-0 bins as +0). */
static inline void count_run(const float *x, ptrdiff_t count, double r, int64_t first, int32_t *row,
                             double whole_reciprocal, int64_t whole_offset, int64_t *whole)
{
    float values[COUNT_BLOCK + 16];
    int32_t bins[COUNT_BLOCK], whole_bins[COUNT_BLOCK];
    for (ptrdiff_t i0 = 0; i0 < count; i0 += COUNT_BLOCK) {
        ptrdiff_t n = count - i0 < COUNT_BLOCK ? count - i0 : COUNT_BLOCK;
        ptrdiff_t kept = nonzero_values(x + i0, n, values);
        if (kept < n) {
            row[bin(0.0f, r, first)] += n - kept;
            if (whole)
                whole[bin(0.0f, whole_reciprocal, whole_offset)] += n - kept;
        }
        block_bins(values, kept, r, first, bins);
        if (!whole) {
            for (ptrdiff_t i = 0; i < kept; i++)
                row[bins[i]]++;
            continue;
        }
        block_bins(values, kept, whole_reciprocal, whole_offset, whole_bins);
        for (ptrdiff_t i = 0; i < kept; i++) {
            row[bins[i]]++;
            whole[whole_bins[i]]++;
        }
    }
}

/* zip_low(a, b) = a0 b0 a1 b1 ... (the low halves interleaved), zip_high the high halves. */
#if FLOAT_LANES == 16
#define ZIP_LOW 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define ZIP_HIGH 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#elif FLOAT_LANES == 8
#define ZIP_LOW 0, 8, 1, 9, 2, 10, 3, 11
#define ZIP_HIGH 4, 12, 5, 13, 6, 14, 7, 15
#else
#define ZIP_LOW 0, 4, 1, 5
#define ZIP_HIGH 2, 6, 3, 7
#endif

/* rows[0..FLOAT_LANES) transposed in place: log2(lanes) rounds of zipping row i with row i + lanes / 2 (the
 * perfect shuffle), each moving the index bits one place; a value is moved, never changed. */
static inline void transpose_lanes(floats rows[FLOAT_LANES])
{
    for (int round = 1; round < FLOAT_LANES; round *= 2) {
        floats zipped[FLOAT_LANES];
        for (int i = 0; i < FLOAT_LANES / 2; i++) {
            zipped[2 * i] = __builtin_shufflevector(rows[i], rows[i + FLOAT_LANES / 2], ZIP_LOW);
            zipped[2 * i + 1] = __builtin_shufflevector(rows[i], rows[i + FLOAT_LANES / 2], ZIP_HIGH);
        }
        for (int i = 0; i < FLOAT_LANES; i++)
            rows[i] = zipped[i];
    }
}

#define COUNT_TILE 16        /* channels counted together */
_Static_assert(COUNT_TILE % FLOAT_LANES == 0, "a tile of channels is whole vectors");
#define COUNT_PIXELS 512     /* pixels gathered at once: a COUNT_TILE x COUNT_PIXELS float scratch is 32 KiB */
#define SCRATCH_ROW (COUNT_PIXELS + 16)  /* a scratch row's floats: rows 2 KiB apart would share cache sets, and
                                          * their stores alias the next pixel's loads modulo 4 KiB */
#define PREFETCH_PIXELS 16   /* how far ahead the gather fetches a pixel's line: it reads one line a pixel, a
                              * stride the hardware prefetchers do not follow across pages */
#define DERIVE_VALUES 8192   /* a channel with at least this many values has its whole-tensor counts derived */

/* counts[c][bin] += 1 for each value of channel c, with each channel's reciprocal width and offset; the same
 * values also into `whole` (one histogram of every channel). Channels [c0, c1), in tiles of COUNT_TILE.
 *
 * Channels-last memory (inner == 1) is gathered a block of pixels at a time into a small channel-major
 * scratch, so each channel's values are counted in one run against its own table (counting across channels
 * pixel by pixel would jump between tables that share cache sets), without a transposed copy of the tensor.
 *
 * The whole-tensor counts of a channel with many values are derived from what its own row gained instead of
 * counted value by value: both grids are anchored at zero with power-of-two widths, so where the channel's
 * width w divides the whole's W, channel bin k lies inside whole bin ((offset + k) >> log2(W / w)) - W's
 * offset, exactly as rebinning merges bins. A channel without a grid yet, or one finer than nothing can be
 * derived from, is counted into `whole` directly. */
void channel_counts(const TensorView *v, const double *reciprocal, const int64_t *offset, int32_t *counts,
                    double whole_reciprocal, int64_t whole_offset, int64_t *whole, ptrdiff_t c0, ptrdiff_t c1)
{
    static _Thread_local float scratch[COUNT_TILE][SCRATCH_ROW];
    static _Thread_local int32_t before[COUNT_TILE][HISTOGRAM_BINS];
    int many = v->outer * v->inner >= DERIVE_VALUES;
    for (ptrdiff_t t0 = c0; t0 < c1; t0 += COUNT_TILE) {
        ptrdiff_t width = c1 - t0 < COUNT_TILE ? c1 - t0 : COUNT_TILE;
        int derive[COUNT_TILE];
        for (ptrdiff_t j = 0; j < width; j++) {
            double r = reciprocal[t0 + j];
            derive[j] = many && whole_reciprocal > 0.0 && r >= whole_reciprocal;  /* w <= W, both powers of two */
            if (derive[j])
                memcpy(before[j], counts + (t0 + j) * HISTOGRAM_BINS, sizeof before[j]);
        }
        if (v->inner == 1) {
            for (ptrdiff_t o0 = 0; o0 < v->outer; o0 += COUNT_PIXELS) {
                ptrdiff_t pixels = v->outer - o0 < COUNT_PIXELS ? v->outer - o0 : COUNT_PIXELS;
                ptrdiff_t p = 0;
                if (width == COUNT_TILE)  /* FLOAT_LANES pixels x FLOAT_LANES channels at a time, transposed */
                    for (; p + FLOAT_LANES <= pixels; p += FLOAT_LANES) {
                        if (o0 + p + FLOAT_LANES + PREFETCH_PIXELS <= v->outer)
                            for (int i = 0; i < FLOAT_LANES; i++)
                                __builtin_prefetch(element(v, o0 + p + i + PREFETCH_PIXELS, t0));
                        for (int g = 0; g < COUNT_TILE; g += FLOAT_LANES) {
                            floats rows[FLOAT_LANES];
                            for (int i = 0; i < FLOAT_LANES; i++)
                                rows[i] = *(const floats_unaligned *)element(v, o0 + p + i, t0 + g);
                            transpose_lanes(rows);
                            for (int j = 0; j < FLOAT_LANES; j++)
                                *(floats_unaligned *)&scratch[g + j][p] = rows[j];
                        }
                    }
                for (; p < pixels; p++) {
                    const float *x = element(v, o0 + p, t0);
                    if (o0 + p + PREFETCH_PIXELS < v->outer)
                        __builtin_prefetch(element(v, o0 + p + PREFETCH_PIXELS, t0));
                    for (ptrdiff_t j = 0; j < width; j++)
                        scratch[j][p] = x[j];
                }
                for (ptrdiff_t j = 0; j < width; j++)
                    count_run(scratch[j], pixels, reciprocal[t0 + j], offset[t0 + j],
                              counts + (t0 + j) * HISTOGRAM_BINS, whole_reciprocal, whole_offset,
                              derive[j] ? NULL : whole);
            }
        } else {
            for (ptrdiff_t j = 0; j < width; j++)
                for (ptrdiff_t o = 0; o < v->outer; o++)
                    count_run(element(v, o, t0 + j), v->inner, reciprocal[t0 + j], offset[t0 + j],
                              counts + (t0 + j) * HISTOGRAM_BINS, whole_reciprocal, whole_offset,
                              derive[j] ? NULL : whole);
        }
        for (ptrdiff_t j = 0; j < width; j++) {
            if (!derive[j])
                continue;
            const int32_t *row = counts + (t0 + j) * HISTOGRAM_BINS;
            int shift = ilogb(reciprocal[t0 + j]) - ilogb(whole_reciprocal);
            for (ptrdiff_t k = 0; k < HISTOGRAM_BINS; k++)
                if (row[k] != before[j][k])
                    whole[((offset[t0 + j] + k) >> shift) - whole_offset] += (int64_t)(row[k] - before[j][k]);
        }
    }
}

#define WHOLE_BLOCK 256  /* values whose extremes, zeros and bins are taken together before they are counted */
#define WHOLE_TABLES 4  /* int32 tables a whole-tensor count spreads its values over, merged after: consecutive
                         * values in one bin then add to different counters instead of each waiting on the last */

/* bin(value), or -1 where that bin lies outside the row [0, BINS): computed in double as bin() does, without its
 * cast of a far value to int64 (exact wherever the result can lie in the row: |offset| < 2^52, and a product past
 * 2^53 is far out). */
static inline ptrdiff_t bin_in_row(float value, double r, int64_t offset)
{
    double at = floor((double)value * r) - (double)offset;
    return at >= 0.0 && at < HISTOGRAM_BINS ? (ptrdiff_t)at : -1;
}

/* tables[i % WHOLE_TABLES][bin] += 1 for the finite values x[0:n] outside [skip_low, skip_high) whose bin lies in
 * the row; the others outside the skip go to *outside. */
static inline void whole_block(const float *x, ptrdiff_t n, double r, int64_t offset, int32_t (*tables)[HISTOGRAM_BINS],
                               double skip_low, double skip_high, int64_t *outside)
{
    float values[WHOLE_BLOCK + 16];
    int32_t bins[WHOLE_BLOCK];
    int skipping = skip_low < skip_high;
    ptrdiff_t kept = nonzero_values(x, n, values);
    if (kept < n && !(skipping && 0.0 >= skip_low && 0.0 < skip_high)) {
        ptrdiff_t zero = bin_in_row(0.0f, r, offset);
        if (zero >= 0)
            tables[0][zero] += (int32_t)(n - kept);
        else
            *outside += n - kept;
    }
    ptrdiff_t binned = r > 0.0 ? vector_bins(values, kept, r, offset, bins) : 0;
    if (skipping) {
        for (ptrdiff_t i = 0; i < binned; i++)
            if (!(values[i] >= skip_low && values[i] < skip_high))
                tables[i % WHOLE_TABLES][bins[i]]++;
    } else {
        ptrdiff_t i = 0;
        for (; i + WHOLE_TABLES <= binned; i += WHOLE_TABLES)
            for (int t = 0; t < WHOLE_TABLES; t++)
                tables[t][bins[i + t]]++;
        for (; i < binned; i++)
            tables[0][bins[i]]++;
    }
    for (ptrdiff_t i = binned; i < kept; i++) {
        if (skipping && values[i] >= skip_low && values[i] < skip_high)
            continue;
        ptrdiff_t at = bin_in_row(values[i], r, offset);
        if (at >= 0)
            tables[0][at]++;
        else
            (*outside)++;
    }
}

/* counts[bin] += every table's count of it; the tables back to zero. */
static void merge_tables(int32_t (*tables)[HISTOGRAM_BINS], int64_t *counts)
{
    for (int t = 0; t < WHOLE_TABLES; t++)
        for (ptrdiff_t k = 0; k < HISTOGRAM_BINS; k++)
            counts[k] += tables[t][k];
    memset(tables, 0, sizeof(int32_t) * WHOLE_TABLES * HISTOGRAM_BINS);
}

/* One histogram of all n values of x, in whatever order memory holds them (a histogram of the whole tensor
 * does not depend on it), with the extremes: extremes[0] = min(extremes[0], values), extremes[1] likewise (lane
 * by lane as channel_extremes compares), and tallies[0] += the values that are NaN or infinite (a block of
 * WHOLE_BLOCK values holding one is not counted: the caller rejects the tensor). With `count` 0 that is all.
 * Otherwise each finite value outside [skip_low, skip_high) is counted in counts[bin], bin = floor(value *
 * reciprocal) - offset as bin() computes it, where that bin lies in [0, BINS); one outside the row (the window
 * has not yet been widened to a new extreme) is left out and added to tallies[1]. The caller widens the window
 * and calls again skipping what the old window took, whose counts the widening merged exactly (see
 * dabuild.quant.histogram): one pass over the values when a batch stays within the window, as it mostly does
 * after the first, with the extremes in the same pass. */
void whole_counts(const float *x, ptrdiff_t n, double reciprocal, int64_t offset, int64_t *counts, double skip_low,
                  double skip_high, ptrdiff_t count, float *extremes, int64_t *tallies)
{
    static _Thread_local int32_t tables[WHOLE_TABLES][HISTOGRAM_BINS];
    if (count)
        memset(tables, 0, sizeof tables);
    floats lo = extremes[0] - (floats){0}, hi = extremes[1] - (floats){0};
    ints nonfinite = {0};
    ptrdiff_t i0 = 0, unmerged = 0;
    for (; i0 + WHOLE_BLOCK <= n; i0 += WHOLE_BLOCK) {
        ints block_nonfinite = {0};
        for (int k = 0; k < WHOLE_BLOCK; k += FLOAT_LANES)
            fold_extremes(*(const floats_unaligned *)(x + i0 + k), &lo, &hi, &block_nonfinite);
        nonfinite += block_nonfinite;
        if (!count || !all_lanes(block_nonfinite == 0))
            continue;
        whole_block(x + i0, WHOLE_BLOCK, reciprocal, offset, tables, skip_low, skip_high, &tallies[1]);
        if ((unmerged += WHOLE_BLOCK) >= ((ptrdiff_t)1 << 30)) {  /* before an int32 table could pass 2^31 - 1 */
            merge_tables(tables, counts);
            unmerged = 0;
        }
    }
    float l = extremes[0], h = extremes[1];
    for (int lane = 0; lane < FLOAT_LANES; lane++) {
        l = lo[lane] < l ? lo[lane] : l;
        h = hi[lane] > h ? hi[lane] : h;
        tallies[0] += nonfinite[lane];
    }
    if (i0 < n) {  /* the last values, fewer than a block */
        ptrdiff_t bad = 0;
        run_extremes(x + i0, n - i0, &l, &h, &bad);
        tallies[0] += bad;
        if (count && !bad)
            whole_block(x + i0, n - i0, reciprocal, offset, tables, skip_low, skip_high, &tallies[1]);
    }
    extremes[0] = l;
    extremes[1] = h;
    if (count)
        merge_tables(tables, counts);
}

/* Re-binning of the channels listed in `channels` (n of them) to wider or slid windows, in place: old bin k
 * of a channel moves to ((old_offset + k) >> doublings) - new_offset, which merges pairs exactly (see
 * dabuild.quant.histogram). */
void rebin_channels(int32_t *counts, const int64_t *channels, ptrdiff_t n, const int64_t *old_offset,
                    const int64_t *doublings, const int64_t *new_offset)
{
    int32_t moved[HISTOGRAM_BINS];
    for (ptrdiff_t i = 0; i < n; i++) {
        int32_t *row = counts + channels[i] * HISTOGRAM_BINS;
        memset(moved, 0, sizeof moved);
        for (ptrdiff_t k = 0; k < HISTOGRAM_BINS; k++)
            if (row[k])
                moved[((old_offset[i] + k) >> doublings[i]) - new_offset[i]] += row[k];
        memcpy(row, moved, sizeof moved);
    }
}
