/* Calibration histograms: per-channel extremes and bin counts of a float32 tensor, in one pass each.
 *
 * The tensor is seen as (outer, channels, inner) with element strides (so, sc, 1) when inner > 1, or
 * (outer, channels) with strides (so, 1) when inner == 1 (channels-last memory); counting takes the first
 * form only, since per-channel counts read pixel by pixel across channels miss the cache on nearly every count. Counting mirrors
 * dabuild.quant.histogram.Histogram.add exactly: bin = floor(value / width) - offset in double
 * precision (width a power of two, so multiplying by its reciprocal is the same exact division), bin 0
 * for a channel whose width is still 0. Only channels [c0, c1) are touched, so threads can share a tensor.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

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

/* counts[c][bin] += 1 for each value of channel c, with each channel's reciprocal width and offset; the same
 * values also into `whole` (one histogram of every channel). */
void channel_counts(const TensorView *v, const double *reciprocal, const int64_t *offset, int64_t *counts,
                    double whole_reciprocal, int64_t whole_offset, int64_t *whole, ptrdiff_t c0, ptrdiff_t c1)
{
    for (ptrdiff_t o = 0; o < v->outer; o++)
        for (ptrdiff_t c = c0; c < c1; c++) {
            const float *x = element(v, o, c);
            int64_t *row = counts + c * HISTOGRAM_BINS;
            double r = reciprocal[c];
            int64_t first = offset[c];
            for (ptrdiff_t i = 0; i < v->inner; i++) {
                row[bin(x[i], r, first)]++;
                whole[bin(x[i], whole_reciprocal, whole_offset)]++;
            }
        }
}
