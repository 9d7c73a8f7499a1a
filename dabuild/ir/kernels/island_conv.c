/* A float island's conv (and dense, a 1x1 conv), compiled: the sums of dabuild.qir.layers.island_order.
 *
 * Each output is 0, plus x * w for each input channel of its group, kernel row, kernel column (taps in the
 * padding skipped: they would add a zero, and a sum that starts at +0 is never -0, so adding +-0 changes
 * nothing), every product rounded to float32 and then added. That is the order the C target's float kernels
 * add in, so the integer reference's float islands stay bit for bit what the artifact computes. Contraction
 * into fused multiply-adds is switched off for this file's functions (the library is otherwise built with
 * the compiler's default contraction).
 *
 * x is (N, H, W, C) float32, y (N, OH, OW, O). The order of each output's own terms is all that fixes its
 * bits, so outputs may be computed in any grouping:
 *
 * - island_conv_nhwc (groups 1): the weight packed as blocks of ISLAND_WIDTH output channels (the library's
 *   `kernel_island_width()`), block b a (C, KH, KW, ISLAND_WIDTH) array (columns past O zero); a register block of ISLAND_PIXELS neighbouring
 *   output pixels times ISLAND_WIDTH channels stays in registers over the whole reduction;
 * - island_grouped_nhwc (any groups): the weight (C / groups, KH, KW, O), each output pixel's O sums kept
 *   in y itself, the input channel of output o read at first[o] + c.
 *
 * Both take the flattened (N * OH) output rows [row0, row1), so threads may split them.
 */
#include <stddef.h>
#include <string.h>
#include "vectors.h"

#if defined(__clang__)
#define ISLAND_NO_CONTRACT _Pragma("clang fp contract(off)")
#define ISLAND_FUNCTION
#elif defined(__GNUC__)
#define ISLAND_NO_CONTRACT
#define ISLAND_FUNCTION __attribute__((optimize("fp-contract=off")))
#else
#define ISLAND_NO_CONTRACT
#define ISLAND_FUNCTION
#endif

#define ISLAND_PIXELS 4
#define ISLAND_WIDTH (ISLAND_VECS * FLOAT_LANES)  /* output channels per packed block (vectors.h's path) */
#define ISLAND_UNROLL _Pragma("GCC unroll 16")

typedef float island_vec __attribute__((vector_size(VBYTES)));
typedef float island_vec_unaligned __attribute__((vector_size(VBYTES), aligned(4)));

typedef struct {
    const float *x;
    ptrdiff_t height, width, channels;   /* of x; channels per group for the grouped kernel's weight */
    const float *weight;                 /* packed, see above */
    ptrdiff_t kernel_h, kernel_w, out_channels, group_channels;  /* group_channels: input channels per group */
    const ptrdiff_t *first;              /* grouped: (O,) each output channel's first input channel */
    float *y;
    ptrdiff_t out_h, out_w, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
} IslandConv;

/* Output pixels [ow0, ow0 + count) of row (n, oh), output channels [block * ISLAND_WIDTH, + ISLAND_WIDTH). */
ISLAND_FUNCTION static void island_block(const IslandConv *p, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow0,
                                         int count, ptrdiff_t block)
{
    ISLAND_NO_CONTRACT
    island_vec acc[ISLAND_PIXELS][ISLAND_VECS];
    ISLAND_UNROLL
    for (int q = 0; q < ISLAND_PIXELS; q++)
        ISLAND_UNROLL
        for (int v = 0; v < ISLAND_VECS; v++)
            acc[q][v] = (island_vec){0};
    const ptrdiff_t taps = p->kernel_h * p->kernel_w;
    const float *weights = p->weight + block * p->channels * taps * ISLAND_WIDTH;
    for (ptrdiff_t c = 0; c < p->channels; c++) {
        for (ptrdiff_t kh = 0; kh < p->kernel_h; kh++) {
            ptrdiff_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
            if (ih < 0 || ih >= p->height)
                continue;
            const float *row = p->x + ((n * p->height + ih) * p->width) * p->channels + c;
            for (ptrdiff_t kw = 0; kw < p->kernel_w; kw++) {
                const float *w = weights + ((c * p->kernel_h + kh) * p->kernel_w + kw) * ISLAND_WIDTH;
                island_vec wv[ISLAND_VECS];
                ISLAND_UNROLL
                for (int v = 0; v < ISLAND_VECS; v++)
                    wv[v] = *(const island_vec_unaligned *)(w + FLOAT_LANES * v);
                ISLAND_UNROLL
                for (int q = 0; q < ISLAND_PIXELS; q++) {
                    ptrdiff_t iw = (ow0 + q) * p->stride_w - p->pad_left + kw * p->dilation_w;
                    if (q >= count || iw < 0 || iw >= p->width)
                        continue;
                    island_vec xv = (island_vec){0} + row[iw * p->channels];
                    ISLAND_UNROLL
                    for (int v = 0; v < ISLAND_VECS; v++) {
                        island_vec product = xv * wv[v];
                        acc[q][v] = acc[q][v] + product;
                    }
                }
            }
        }
    }
    ptrdiff_t first = block * ISLAND_WIDTH;
    ptrdiff_t width = p->out_channels - first < ISLAND_WIDTH ? p->out_channels - first : ISLAND_WIDTH;
    for (int q = 0; q < count; q++) {
        float *y = p->y + ((n * p->out_h + oh) * p->out_w + ow0 + q) * p->out_channels + first;
        if (width == ISLAND_WIDTH) {
            ISLAND_UNROLL
            for (int v = 0; v < ISLAND_VECS; v++)
                *(island_vec_unaligned *)(y + FLOAT_LANES * v) = acc[q][v];
        } else {
            memcpy(y, acc[q], (size_t)width * sizeof(float));
        }
    }
}

ISLAND_FUNCTION void island_conv_nhwc(const IslandConv *p, ptrdiff_t row0, ptrdiff_t row1)
{
    ptrdiff_t blocks = (p->out_channels + ISLAND_WIDTH - 1) / ISLAND_WIDTH;
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / p->out_h, oh = row % p->out_h;
        for (ptrdiff_t block = 0; block < blocks; block++)
            for (ptrdiff_t ow = 0; ow < p->out_w; ow += ISLAND_PIXELS)
                island_block(p, n, oh, ow, p->out_w - ow < ISLAND_PIXELS ? (int)(p->out_w - ow) : ISLAND_PIXELS,
                             block);
    }
}

/* Where tap (kh, kw) of output pixel (n, oh, ow) reads x (its channel 0), or NULL in the padding. */
static inline const float *island_tap(const IslandConv *p, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t kh,
                                      ptrdiff_t kw)
{
    ptrdiff_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
    ptrdiff_t iw = ow * p->stride_w - p->pad_left + kw * p->dilation_w;
    if (ih < 0 || ih >= p->height || iw < 0 || iw >= p->width)
        return NULL;
    return p->x + ((n * p->height + ih) * p->width + iw) * p->channels;
}

ISLAND_FUNCTION void island_grouped_nhwc(const IslandConv *p, ptrdiff_t row0, ptrdiff_t row1)
{
    ISLAND_NO_CONTRACT
    const ptrdiff_t outs = p->out_channels;
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / p->out_h, oh = row % p->out_h;
        for (ptrdiff_t ow = 0; ow < p->out_w; ow++) {
            float *restrict y = p->y + ((n * p->out_h + oh) * p->out_w + ow) * outs;
            memset(y, 0, (size_t)outs * sizeof *y);
            const float *restrict w = p->weight;  /* (c, kh, kw) in order, each O wide */
            for (ptrdiff_t c = 0; c < p->group_channels; c++)
                for (ptrdiff_t kh = 0; kh < p->kernel_h; kh++)
                    for (ptrdiff_t kw = 0; kw < p->kernel_w; kw++, w += outs) {
                        const float *x = island_tap(p, n, oh, ow, kh, kw);
                        if (x == NULL)
                            continue;
                        for (ptrdiff_t o = 0; o < outs; o++) {
                            float product = x[p->first[o] + c] * w[o];
                            y[o] = y[o] + product;
                        }
                    }
        }
    }
}
