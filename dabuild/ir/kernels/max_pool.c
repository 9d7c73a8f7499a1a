/* Max pooling over a channels-last float32 tensor (N, H, W, C) into (N, OH, OW, C), for the interpreter.
 *
 * A tap outside the input (padding, or the ceil-mode overhang) is skipped, which is what numpy's padding
 * with -inf gives ("padding never wins"). Each output starts at -inf and takes the taps in (kh, kw) order as
 * numpy.maximum(y, tap) does: y stays where y > tap or y is NaN, else becomes the tap (so a NaN tap wins,
 * and of two equal values, +0 and -0 say, the later one is kept). The loop over channels is elementwise and vectorised.
 */
#include <math.h>
#include <stddef.h>

typedef struct {
    const float *x;
    ptrdiff_t height, width, channels;
    float *y;
    ptrdiff_t out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
} MaxPool;

/* Rows [row0, row1) of the flattened (N * OH) output rows. */
void max_pool_nhwc(const MaxPool *p, ptrdiff_t row0, ptrdiff_t row1)
{
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / p->out_h, oh = row % p->out_h;
        for (ptrdiff_t ow = 0; ow < p->out_w; ow++) {
            float *restrict y = p->y + ((n * p->out_h + oh) * p->out_w + ow) * p->channels;
            for (ptrdiff_t c = 0; c < p->channels; c++)
                y[c] = -INFINITY;
            for (ptrdiff_t kh = 0; kh < p->kernel_h; kh++) {
                ptrdiff_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
                if (ih < 0 || ih >= p->height)
                    continue;
                for (ptrdiff_t kw = 0; kw < p->kernel_w; kw++) {
                    ptrdiff_t iw = ow * p->stride_w - p->pad_left + kw * p->dilation_w;
                    if (iw < 0 || iw >= p->width)
                        continue;
                    const float *restrict x = p->x + ((n * p->height + ih) * p->width + iw) * p->channels;
                    for (ptrdiff_t c = 0; c < p->channels; c++)
                        y[c] = y[c] > x[c] || y[c] != y[c] ? y[c] : x[c];
                }
            }
        }
    }
}
