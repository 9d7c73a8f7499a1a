/* Direct 2-D convolution over channels-last float32 tensors, for dabuild's reference interpreter.
 *
 * x (N, H, W, C) and the weight (KH, KW, C, OP) give y (N, OH, OW, O): OP is O rounded up to a whole
 * number of vectors, its extra columns zero. The output channels are innermost, so one vector of
 * VLEN floats holds VLEN output channels of one pixel, and each multiply-add broadcasts one input
 * value against one weight vector. A block of PIXELS neighbouring output pixels times VECS vectors
 * of channels stays in registers over all taps and input channels. The summation order of every
 * output is fixed by this source (tap by tap, channel by channel), whatever the vector width the
 * compiler picks for the target machine.
 *
 * Padding is not copied: a tap that falls outside the input reads a row of C zeros instead.
 * The epilogue adds the bias, then the residual (another (N, OH, OW, O) tensor), then applies relu,
 * the order of the graph nodes it replaces.
 */
#include <stddef.h>
#include <string.h>

#define VLEN 16
/* The register block's loops must unroll completely, or its accumulators live in memory. */
#define UNROLL _Pragma("GCC unroll 16")
#define MAX_PIXELS 8
#define MAX_VECS 4
typedef float vec __attribute__((vector_size(VLEN * sizeof(float))));
typedef int lanes_mask __attribute__((vector_size(VLEN * sizeof(int))));
typedef float vec_unaligned __attribute__((vector_size(VLEN * sizeof(float)), aligned(sizeof(float))));

typedef struct {
    const float *x;
    ptrdiff_t height, width, channels;
    const float *weight;
    ptrdiff_t kernel_h, kernel_w, out_channels, padded_channels;
    const float *bias;      /* (padded_channels,) or NULL */
    const float *residual;  /* (N, OH, OW, out_channels) or NULL */
    float *y;
    ptrdiff_t out_h, out_w;
    ptrdiff_t stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
    int relu;
    const float *zeros;     /* channels zeros: what a tap in the padding reads */
} Conv;

/* max(x, 0) lane by lane, keeping NaN as numpy.maximum does. */
static inline vec relu(vec x)
{
    lanes_mask keep = (x > 0.0f) | (x != x);
    return (vec)((lanes_mask)x & keep);
}

/* y[pixel, first:first + VLEN] = relu?(sum + bias + residual), the channels past out_channels left out. */
static inline __attribute__((always_inline)) void finish(const Conv *c, ptrdiff_t pixel, ptrdiff_t first, vec sum)
{
    if (c->bias)
        sum += *(const vec_unaligned *)(c->bias + first);
    float *y = c->y + pixel * c->out_channels + first;
    const float *residual = c->residual ? c->residual + pixel * c->out_channels + first : NULL;
    if (c->out_channels - first >= VLEN) {
        if (residual)
            sum += *(const vec_unaligned *)residual;
        if (c->relu)
            sum = relu(sum);
        *(vec_unaligned *)y = sum;
        return;
    }
    float lanes[VLEN];  /* the last, partial vector of an O that is not a multiple of VLEN */
    memcpy(lanes, &sum, sizeof lanes);
    for (ptrdiff_t lane = 0; lane < c->out_channels - first; lane++) {
        float value = lanes[lane];
        if (residual)
            value += residual[lane];
        y[lane] = c->relu && !(value > 0.0f) && value == value ? 0.0f : value;
    }
}

/* acc += the products of `count` consecutive (tap, channel) inputs of each pixel p, against the weight rows from
 * w on. The inputs of pixel p are at rows[p], or with SPACED at rows[0] + p * step: one pointer for them all. */
static inline __attribute__((always_inline)) void
taps(vec acc[MAX_PIXELS][MAX_VECS], const float *const *rows, const int SPACED, ptrdiff_t step, const float *w,
     ptrdiff_t count, const Conv *c, const int PIXELS, const int VECS)
{
    for (ptrdiff_t ci = 0; ci < count; ci++, w += c->padded_channels) {
        vec weights[MAX_VECS];
        UNROLL for (int v = 0; v < VECS; v++)
            weights[v] = *(const vec_unaligned *)(w + v * VLEN);
        UNROLL for (int p = 0; p < PIXELS; p++) {
            float value = SPACED ? rows[0][p * step + ci] : rows[p][ci];
            UNROLL for (int v = 0; v < VECS; v++)
                acc[p][v] += value * weights[v];
        }
    }
}

static inline __attribute__((always_inline)) void
block(const Conv *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o, const int PIXELS, const int VECS)
{
    vec acc[MAX_PIXELS][MAX_VECS];  /* fixed sizes: once unrolled, each element is a register */
    UNROLL for (int p = 0; p < PIXELS; p++)
        UNROLL for (int v = 0; v < VECS; v++)
            acc[p][v] = (vec){0};
    const float *rows[MAX_PIXELS];
    for (ptrdiff_t kh = 0; kh < c->kernel_h; kh++) {
        ptrdiff_t ih = oh * c->stride_h - c->pad_top + kh * c->dilation_h;
        int row_inside = ih >= 0 && ih < c->height;
        const float *row = row_inside ? c->x + (n * c->height + ih) * c->width * c->channels : c->zeros;
        const float *w = c->weight + kh * c->kernel_w * c->channels * c->padded_channels + o;
        ptrdiff_t left = ow * c->stride_w - c->pad_left;  /* the first input column of the block's first pixel */
        ptrdiff_t step = c->stride_w * c->channels;
        if (row_inside && c->dilation_w == 1 && left >= 0
                && left + (PIXELS - 1) * c->stride_w + c->kernel_w <= c->width) {
            /* the whole kernel row is inside for every pixel: its taps' channels are one contiguous run */
            rows[0] = row + left * c->channels;
            taps(acc, rows, 1, step, w, c->kernel_w * c->channels, c, PIXELS, VECS);
            continue;
        }
        for (ptrdiff_t kw = 0; kw < c->kernel_w; kw++, w += c->channels * c->padded_channels) {
            int inside = row_inside;
            UNROLL for (int p = 0; p < PIXELS; p++) {
                ptrdiff_t iw = left + p * c->stride_w + kw * c->dilation_w;
                int pixel_inside = row_inside && iw >= 0 && iw < c->width;
                rows[p] = pixel_inside ? row + iw * c->channels : c->zeros;
                inside &= pixel_inside;
            }
            if (inside)  /* the block's inputs are equally spaced: one pointer reaches them all */
                taps(acc, rows, 1, step, w, c->channels, c, PIXELS, VECS);
            else
                taps(acc, rows, 0, 0, w, c->channels, c, PIXELS, VECS);
        }
    }
    for (int p = 0; p < PIXELS; p++)
        for (int v = 0; v < VECS && o + v * VLEN < c->out_channels; v++)
            finish(c, (n * c->out_h + oh) * c->out_w + ow + p, o + v * VLEN, acc[p][v]);
}

/* One output row of image n: full blocks of PIXELS pixels, then single pixels for the rest. */
static inline __attribute__((always_inline)) void
output_row(const Conv *c, ptrdiff_t n, ptrdiff_t oh, const int PIXELS, const int VECS)
{
    for (ptrdiff_t o = 0; o < c->padded_channels; o += VECS * VLEN) {
        ptrdiff_t ow = 0;
        for (; ow + PIXELS <= c->out_w; ow += PIXELS)
            block(c, n, oh, ow, o, PIXELS, VECS);
        for (; ow < c->out_w; ow++)
            block(c, n, oh, ow, o, 1, VECS);
    }
}

void conv2d_nhwc(const Conv *c, ptrdiff_t images)
{
    for (ptrdiff_t n = 0; n < images; n++)
        for (ptrdiff_t oh = 0; oh < c->out_h; oh++) {
            if (c->padded_channels % (4 * VLEN) == 0)
                output_row(c, n, oh, 4, 4);
            else if (c->padded_channels % (2 * VLEN) == 0)
                output_row(c, n, oh, 8, 2);
            else
                output_row(c, n, oh, 8, 1);
        }
}

/* Depthwise: one input channel per output channel (O == C, weight (KH, KW, OP)), so x's channels line up with
 * the output's and each tap is one elementwise multiply-add of a vector of channels. */
void depthwise2d_nhwc(const Conv *c, ptrdiff_t images)
{
    for (ptrdiff_t n = 0; n < images; n++)
        for (ptrdiff_t oh = 0; oh < c->out_h; oh++)
            for (ptrdiff_t ow = 0; ow < c->out_w; ow++)
                for (ptrdiff_t o = 0; o < c->out_channels; o += VLEN) {
                    ptrdiff_t count = c->out_channels - o < VLEN ? c->out_channels - o : VLEN;
                    vec acc = {0};
                    for (ptrdiff_t kh = 0; kh < c->kernel_h; kh++) {
                        ptrdiff_t ih = oh * c->stride_h - c->pad_top + kh * c->dilation_h;
                        if (ih < 0 || ih >= c->height)
                            continue;
                        for (ptrdiff_t kw = 0; kw < c->kernel_w; kw++) {
                            ptrdiff_t iw = ow * c->stride_w - c->pad_left + kw * c->dilation_w;
                            if (iw < 0 || iw >= c->width)
                                continue;
                            const float *x = c->x + ((n * c->height + ih) * c->width + iw) * c->channels + o;
                            vec inputs = {0};  /* a partial last vector must not read past the tensor */
                            if (count == VLEN)
                                inputs = *(const vec_unaligned *)x;
                            else
                                memcpy(&inputs, x, count * sizeof(float));
                            acc += inputs * *(const vec_unaligned *)(c->weight + (kh * c->kernel_w + kw) * c->padded_channels + o);
                        }
                    }
                    finish(c, (n * c->out_h + oh) * c->out_w + ow, o, acc);
                }
}
