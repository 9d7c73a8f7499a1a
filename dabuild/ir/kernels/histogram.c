/* Calibration histograms: per-channel extremes and bin counts of a float32 tensor, in one pass each.
 *
 * The tensor is seen as (outer, channels, inner) with element strides (so, sc, 1) when inner > 1, or
 * (outer, channels) with strides (so, 1) when inner == 1 (channels-last memory). Counting mirrors
 * dabuild.quant.histogram.Histogram.add exactly: bin = floor(value / width) - offset in double
 * precision (width a power of two, so multiplying by its reciprocal is the same exact division), bin 0
 * for a channel whose width is still 0. Only channels [c0, c1) are touched, so threads can share a tensor.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HISTOGRAM_BINS 2048

typedef struct {
    const float *x;
    ptrdiff_t outer, channels, inner, outer_stride, channel_stride;
} TensorView;

static inline const float *element(const TensorView *v, ptrdiff_t o, ptrdiff_t c)
{
    return v->x + o * v->outer_stride + c * v->channel_stride;
}

/* low[c] = min(low[c], values of channel c), high[c] likewise; returns how many values are NaN or infinite. */
ptrdiff_t channel_extremes(const TensorView *v, float *low, float *high, ptrdiff_t c0, ptrdiff_t c1)
{
    ptrdiff_t bad = 0;
    for (ptrdiff_t o = 0; o < v->outer; o++) {
        if (v->inner == 1) {
            const float *x = element(v, o, 0);
            for (ptrdiff_t c = c0; c < c1; c++) {
                float value = x[c];
                bad += !(fabsf(value) < INFINITY);  /* NaN compares false */
                low[c] = value < low[c] ? value : low[c];
                high[c] = value > high[c] ? value : high[c];
            }
            continue;
        }
        for (ptrdiff_t c = c0; c < c1; c++) {
            const float *x = element(v, o, c);
            float lo = low[c], hi = high[c];
            for (ptrdiff_t i = 0; i < v->inner; i++) {
                bad += !(fabsf(x[i]) < INFINITY);
                lo = x[i] < lo ? x[i] : lo;
                hi = x[i] > hi ? x[i] : hi;
            }
            low[c] = lo;
            high[c] = hi;
        }
    }
    return bad;
}

static inline int64_t bin(float value, double reciprocal, int64_t offset)
{
    return reciprocal > 0.0 ? (int64_t)floor((double)value * reciprocal) - offset : 0;
}

/* row[bin] += 1 and whole[whole bin] += 1 for `count` consecutive values of one channel. */
static inline void count_run(const float *x, ptrdiff_t count, double r, int64_t first, int64_t *row,
                             double whole_reciprocal, int64_t whole_offset, int64_t *whole)
{
    for (ptrdiff_t i = 0; i < count; i++) {
        row[bin(x[i], r, first)]++;
        whole[bin(x[i], whole_reciprocal, whole_offset)]++;
    }
}

#define COUNT_TILE 16     /* channels gathered at once from channels-last memory */
#define COUNT_PIXELS 512  /* pixels gathered at once: a COUNT_TILE x COUNT_PIXELS float scratch is 32 KiB */

/* counts[c][bin] += 1 for each value of channel c, with each channel's reciprocal width and offset; the same
 * values also into `whole` (one histogram of every channel). Channels-last memory (inner == 1) is gathered
 * a tile of channels and a block of pixels at a time into a small channel-major scratch, so each channel's
 * values are counted in one run against its own table (counting across channels pixel by pixel would jump
 * between tables that share cache sets), without a transposed copy of the whole tensor. */
void channel_counts(const TensorView *v, const double *reciprocal, const int64_t *offset, int64_t *counts,
                    double whole_reciprocal, int64_t whole_offset, int64_t *whole, ptrdiff_t c0, ptrdiff_t c1)
{
    if (v->inner == 1) {
        static _Thread_local float scratch[COUNT_TILE][COUNT_PIXELS];
        for (ptrdiff_t o0 = 0; o0 < v->outer; o0 += COUNT_PIXELS) {
            ptrdiff_t pixels = v->outer - o0 < COUNT_PIXELS ? v->outer - o0 : COUNT_PIXELS;
            for (ptrdiff_t t0 = c0; t0 < c1; t0 += COUNT_TILE) {
                ptrdiff_t width = c1 - t0 < COUNT_TILE ? c1 - t0 : COUNT_TILE;
                for (ptrdiff_t p = 0; p < pixels; p++) {
                    const float *x = element(v, o0 + p, t0);
                    for (ptrdiff_t j = 0; j < width; j++)
                        scratch[j][p] = x[j];
                }
                for (ptrdiff_t j = 0; j < width; j++)
                    count_run(scratch[j], pixels, reciprocal[t0 + j], offset[t0 + j],
                              counts + (t0 + j) * HISTOGRAM_BINS, whole_reciprocal, whole_offset, whole);
            }
        }
        return;
    }
    for (ptrdiff_t o = 0; o < v->outer; o++)
        for (ptrdiff_t c = c0; c < c1; c++)
            count_run(element(v, o, c), v->inner, reciprocal[c], offset[c], counts + c * HISTOGRAM_BINS,
                      whole_reciprocal, whole_offset, whole);
}

/* Re-binning of the channels listed in `channels` (n of them) to wider or slid windows, in place: old bin k
 * of a channel moves to ((old_offset + k) >> doublings) - new_offset, which merges pairs exactly (see
 * dabuild.quant.histogram). */
void rebin_channels(int64_t *counts, const int64_t *channels, ptrdiff_t n, const int64_t *old_offset,
                    const int64_t *doublings, const int64_t *new_offset)
{
    int64_t moved[HISTOGRAM_BINS];
    for (ptrdiff_t i = 0; i < n; i++) {
        int64_t *row = counts + channels[i] * HISTOGRAM_BINS;
        memset(moved, 0, sizeof moved);
        for (ptrdiff_t k = 0; k < HISTOGRAM_BINS; k++)
            if (row[k])
                moved[((old_offset[i] + k) >> doublings[i]) - new_offset[i]] += row[k];
        memcpy(row, moved, sizeof moved);
    }
}
