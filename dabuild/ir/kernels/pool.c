/* Max and average pooling over a channels-last float32 tensor (N, H, W, C) into (N, OH, OW, C), for the
 * interpreter: the same floats as dabuild.ir.ops.pool's numpy loops over the kernel taps, bit for bit.
 *
 * Max: a tap outside the input (padding, or the ceil-mode overhang) is skipped, which is what numpy's padding
 * with -inf gives ("padding never wins"). Each output starts at -inf and takes the taps in (kh, kw) order as
 * numpy.maximum(y, tap) does: y stays where y > tap or y is NaN, else becomes the tap (so a NaN tap wins,
 * and of two equal values, +0 and -0 say, the later one is kept).
 *
 * Average: numpy pads with zeros, copies the first tap and adds the others in (kh, kw) order, then divides
 * by each output's count; so here a tap outside the input is a +0 that is still added (-0 + 0 is +0), and
 * the sum is divided by divisors[oh * OW + ow], the counts numpy computes. The loops over channels are
 * elementwise and vectorised.
 */
#include <math.h>
#include <stddef.h>

typedef struct {
    const float *x;
    ptrdiff_t height, width, channels;
    float *y;
    ptrdiff_t out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
    const float *divisors;  /* (OH, OW) counts for an average pool; unused by the max pool */
} Pool;

/* The input pixel of tap (kh, kw) of output (n, oh, ow), or NULL where the tap lies outside the input. */
static inline const float *tap(const Pool *p, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t kh, ptrdiff_t kw)
{
    ptrdiff_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
    ptrdiff_t iw = ow * p->stride_w - p->pad_left + kw * p->dilation_w;
    if (ih < 0 || ih >= p->height || iw < 0 || iw >= p->width)
        return NULL;
    return p->x + ((n * p->height + ih) * p->width + iw) * p->channels;
}

/* Rows [row0, row1) of the flattened (N * OH) output rows. */
void max_pool_nhwc(const Pool *p, ptrdiff_t row0, ptrdiff_t row1)
{
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / p->out_h, oh = row % p->out_h;
        for (ptrdiff_t ow = 0; ow < p->out_w; ow++) {
            float *restrict y = p->y + ((n * p->out_h + oh) * p->out_w + ow) * p->channels;
            for (ptrdiff_t c = 0; c < p->channels; c++)
                y[c] = -INFINITY;
            for (ptrdiff_t kh = 0; kh < p->kernel_h; kh++)
                for (ptrdiff_t kw = 0; kw < p->kernel_w; kw++) {
                    const float *restrict x = tap(p, n, oh, ow, kh, kw);
                    if (x)
                        for (ptrdiff_t c = 0; c < p->channels; c++)
                            y[c] = y[c] > x[c] || y[c] != y[c] ? y[c] : x[c];
                }
        }
    }
}

/* Rows [row0, row1) of the flattened (N * OH) output rows. */
void avg_pool_nhwc(const Pool *p, ptrdiff_t row0, ptrdiff_t row1)
{
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / p->out_h, oh = row % p->out_h;
        for (ptrdiff_t ow = 0; ow < p->out_w; ow++) {
            float *restrict y = p->y + ((n * p->out_h + oh) * p->out_w + ow) * p->channels;
            for (ptrdiff_t kh = 0; kh < p->kernel_h; kh++)
                for (ptrdiff_t kw = 0; kw < p->kernel_w; kw++) {
                    const float *restrict x = tap(p, n, oh, ow, kh, kw);
                    int first = kh == 0 && kw == 0;
                    if (first && x)
                        for (ptrdiff_t c = 0; c < p->channels; c++)
                            y[c] = x[c];
                    else if (first)
                        for (ptrdiff_t c = 0; c < p->channels; c++)
                            y[c] = 0.0f;
                    else if (x)
                        for (ptrdiff_t c = 0; c < p->channels; c++)
                            y[c] += x[c];
                    else
                        for (ptrdiff_t c = 0; c < p->channels; c++)
                            y[c] += 0.0f;
                }
            float divisor = p->divisors[oh * p->out_w + ow];
            for (ptrdiff_t c = 0; c < p->channels; c++)
                y[c] /= divisor;
        }
    }
}
