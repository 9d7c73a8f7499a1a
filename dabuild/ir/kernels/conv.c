/* Direct 2-D convolution over channels-last tensors, for dabuild's reference interpreter.
 *
 * A template: compiled once per element type ELEM (float for the float interpreter, double for the integer
 * reference, whose sums of integer products are exact in double whatever their order), with MASK the
 * integer of ELEM's width and NAME(x) the variant's name for x (see native.py). A vector is VBYTES bytes and
 * a register block CONV_BLOCK_VECS vectors wide, both chosen for the target in vectors.h.
 *
 * x (N, H, W, C) and a packed weight give y (N, OH, OW, O). The packed weight holds the output channels in
 * blocks of up to BLOCK_VECS vectors of VLEN channels (the last block narrower, its columns past O zero):
 * block b is a (KH, KW, C, width_b) array, so the weights one register block needs are one contiguous slab.
 * One vector of VLEN floats holds VLEN output channels of one pixel, and each multiply-add broadcasts one
 * input value against one weight vector. A register block of PIXELS neighbouring output pixels times VECS
 * vectors of channels stays in registers over a run of (tap, channel) inputs.
 *
 * Blocking for cache: the reduction over (tap, channel) runs in K-blocks of about KBLOCK inputs (whole
 * kernel rows when they are short, else one tap's channels in chunks), and each K-block's weight slab
 * (KBLOCK x width floats) is used by every pixel of a chunk of output rows before the next is read, so
 * the slab stays in L1. Between K-blocks the partial sums wait in a small scratch buffer. Storing and
 * reloading a float is exact, so the summation order of every output is fixed by this source (tap by
 * tap, channel by channel), whatever the blocking, the vector width the compiler picks or how many
 * threads share the rows.
 *
 * A grouped conv (ONNX's `group`) runs group by group within each chunk of rows: group g reads input channels
 * [g C, (g + 1) C) of each pixel and writes output channels [g O, (g + 1) O), where C and O are the per-group
 * counts in `channels` and `out_channels`; its weights are the g-th packed weight of the group's shape, its
 * bias the g-th run of padded_channels. A pixel of x then holds groups * C values and one of y groups * O.
 *
 * Padding is not copied: a tap that falls outside the input reads a row of C zeros instead.
 * The epilogue adds the bias, then the residual (another (N, OH, OW, O) tensor), then applies relu or a
 * clamp to [low, high], the order of the graph nodes it replaces.
 */
#ifndef CONV_SHARED
#define CONV_SHARED
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "vectors.h"
#if VBYTES == 64 && defined(__AVX512F__)
#include <immintrin.h>
#endif

/* The register block's loops must unroll completely, or its accumulators live in memory. */
#define UNROLL _Pragma("GCC unroll 16")
#define MAX_PIXELS 8
#define MAX_VECS CONV_BLOCK_VECS
#define BLOCK_VECS CONV_BLOCK_VECS    /* vectors of output channels per packed weight block */
#define KBLOCK (32768 / (BLOCK_VECS * VBYTES))  /* (tap, channel) inputs per K-block: a 32 KiB slab */
#define CHUNK_PIXELS 256              /* output pixels whose partial sums one K-block updates */
enum { NO_ACTIVATION, RELU, CLAMP };
#define X_PIXEL(c) ((c)->channels * (c)->groups)      /* elements from one pixel of x to the next */
#define Y_PIXEL(c) ((c)->out_channels * (c)->groups)  /* ... of y and the residual */
#endif

#undef VLEN
#define VLEN ((int)(VBYTES / sizeof(ELEM)))  /* elements per vector */
typedef ELEM NAME(vec) __attribute__((vector_size(VLEN * sizeof(ELEM))));
typedef MASK NAME(lanes_mask) __attribute__((vector_size(VLEN * sizeof(MASK))));
typedef ELEM NAME(vec_unaligned) __attribute__((vector_size(VLEN * sizeof(ELEM)), aligned(sizeof(ELEM))));

typedef struct {
    const ELEM *x;
    ptrdiff_t height, width, channels;
    const ELEM *weight;    /* packed, see above */
    ptrdiff_t kernel_h, kernel_w, out_channels, padded_channels;
    const ELEM *bias;      /* (padded_channels,) or NULL */
    const ELEM *residual;  /* (N, OH, OW, out_channels) or NULL */
    ELEM *y;
    ptrdiff_t out_h, out_w;
    ptrdiff_t stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
    int activation;         /* NO_ACTIVATION, RELU or CLAMP */
    ELEM low, high;        /* CLAMP's bounds */
    const ELEM *zeros;     /* channels zeros: what a tap in the padding reads */
    ptrdiff_t groups;      /* 1, or a grouped conv's groups (channels, out_channels and padded_channels are then
                            * per group); 1 for a depthwise conv */
    ptrdiff_t rows;        /* N * OH: the output rows */
    ptrdiff_t parts;       /* the output channels' parts a row is split into (see `units`) */
} NAME(Conv);

/* max(x, 0) lane by lane, keeping NaN as numpy.maximum does. */
static inline NAME(vec) NAME(relu)(NAME(vec) x)
{
    NAME(lanes_mask) keep = (x > 0) | (x != x);
    return (NAME(vec))((NAME(lanes_mask))x & keep);
}

/* min(max(x, low), high) lane by lane, keeping NaN as numpy.clip does. */
static inline NAME(vec) NAME(clamp)(NAME(vec) x, ELEM low, ELEM high)
{
    NAME(vec) lows = low - (NAME(vec)){0}, highs = high - (NAME(vec)){0};
    NAME(lanes_mask) below = x < lows, above = x > highs;
    x = (NAME(vec))(((NAME(lanes_mask))lows & below) | ((NAME(lanes_mask))x & ~below));
    return (NAME(vec))(((NAME(lanes_mask))highs & above) | ((NAME(lanes_mask))x & ~above));
}

/* The first `count` (< VLEN) lanes of p, the others zero: one masked load where the CPU has them. */
static inline NAME(vec) NAME(load_partial)(const ELEM *p, ptrdiff_t count)
{
#if VBYTES == 64 && defined(__AVX512F__)
    if (sizeof(ELEM) == 4)
        return (NAME(vec))_mm512_maskz_loadu_ps((__mmask16)((1u << count) - 1), (const float *)p);
    return (NAME(vec))_mm512_maskz_loadu_pd((__mmask8)((1u << count) - 1), (const double *)p);
#else
    NAME(vec) v = {0};
    memcpy(&v, p, count * sizeof(ELEM));
    return v;
#endif
}

/* p[0:count] = the first `count` (< VLEN) lanes of v, nothing past them written. */
static inline void NAME(store_partial)(ELEM *p, NAME(vec) v, ptrdiff_t count)
{
#if VBYTES == 64 && defined(__AVX512F__)
    if (sizeof(ELEM) == 4)
        _mm512_mask_storeu_ps((float *)p, (__mmask16)((1u << count) - 1), (__m512)v);
    else
        _mm512_mask_storeu_pd((double *)p, (__mmask8)((1u << count) - 1), (__m512d)v);
#else
    memcpy(p, &v, count * sizeof(ELEM));
#endif
}

/* y[pixel, first:first + VLEN] = activation(sum + bias + residual), the channels past out_channels left out.
 * The lanes past out_channels of a partial last vector are computed on zeros and never stored. */
static inline __attribute__((always_inline)) void NAME(finish)(const NAME(Conv) *c, ptrdiff_t pixel, ptrdiff_t first, NAME(vec) sum)
{
    if (c->bias)
        sum += *(const NAME(vec_unaligned) *)(c->bias + first);
    ELEM *y = c->y + pixel * Y_PIXEL(c) + first;
    const ELEM *residual = c->residual ? c->residual + pixel * Y_PIXEL(c) + first : NULL;
    ptrdiff_t count = c->out_channels - first;
    if (residual)
        sum += count >= VLEN ? *(const NAME(vec_unaligned) *)residual : NAME(load_partial)(residual, count);
    if (c->activation == RELU)
        sum = NAME(relu)(sum);
    else if (c->activation == CLAMP)
        sum = NAME(clamp)(sum, c->low, c->high);
    if (count >= VLEN)
        *(NAME(vec_unaligned) *)y = sum;
    else
        NAME(store_partial)(y, sum, count);
}

/* `finish` for a register block: the pixels pixel .. pixel + PIXELS - 1, channels o .. o + VECS * VLEN - 1,
 * with the bias vectors, the output and residual addresses and the epilogue's choices taken once for the
 * block: finished vector by vector, they cost about 140 cycles a 6 x 2 block, as much as 23 of its
 * multiply-add steps (a 1x1 conv of 34 input channels spent 40 % of its time there). Each value still gets
 * + bias, + residual, then the activation. Without WHOLE a vector may hold channels past out_channels (a
 * partial one, or only padding): those lanes are computed on zeros and never loaded or stored. */
static inline __attribute__((always_inline)) void
NAME(finish_vectors)(const NAME(Conv) *c, ptrdiff_t pixel, ptrdiff_t o, NAME(vec) acc[MAX_PIXELS][MAX_VECS],
                     const int PIXELS, const int VECS, const int WHOLE)
{
    ptrdiff_t step = Y_PIXEL(c), counts[MAX_VECS];  /* each vector's channels below out_channels */
    UNROLL for (int v = 0; v < VECS; v++) {
        ptrdiff_t count = c->out_channels - (o + v * VLEN);
        counts[v] = WHOLE || count >= VLEN ? VLEN : count > 0 ? count : 0;
    }
    if (c->bias) {
        UNROLL for (int v = 0; v < VECS; v++) {
            NAME(vec) bias = *(const NAME(vec_unaligned) *)(c->bias + o + v * VLEN);  /* padded: whole vectors */
            UNROLL for (int p = 0; p < PIXELS; p++)
                acc[p][v] += bias;
        }
    }
    if (c->residual) {
        const ELEM *residual = c->residual + pixel * step + o;
        UNROLL for (int p = 0; p < PIXELS; p++)
            UNROLL for (int v = 0; v < VECS; v++) {
                const ELEM *at = residual + p * step + v * VLEN;
                if (WHOLE || counts[v] == VLEN)
                    acc[p][v] += *(const NAME(vec_unaligned) *)at;
                else if (counts[v] > 0)
                    acc[p][v] += NAME(load_partial)(at, counts[v]);
            }
    }
    if (c->activation == RELU) {
        UNROLL for (int p = 0; p < PIXELS; p++)
            UNROLL for (int v = 0; v < VECS; v++)
                acc[p][v] = NAME(relu)(acc[p][v]);
    } else if (c->activation == CLAMP) {
        UNROLL for (int p = 0; p < PIXELS; p++)
            UNROLL for (int v = 0; v < VECS; v++)
                acc[p][v] = NAME(clamp)(acc[p][v], c->low, c->high);
    }
    ELEM *y = c->y + pixel * step + o;
    UNROLL for (int p = 0; p < PIXELS; p++)
        UNROLL for (int v = 0; v < VECS; v++) {
            ELEM *at = y + p * step + v * VLEN;
            if (WHOLE || counts[v] == VLEN)
                *(NAME(vec_unaligned) *)at = acc[p][v];
            else if (counts[v] > 0)
                NAME(store_partial)(at, acc[p][v], counts[v]);
        }
}

static inline __attribute__((always_inline)) void
NAME(finish_block)(const NAME(Conv) *c, ptrdiff_t pixel, ptrdiff_t o, NAME(vec) acc[MAX_PIXELS][MAX_VECS],
                   const int PIXELS, const int VECS)
{
    if (o + VECS * VLEN <= c->out_channels)
        NAME(finish_vectors)(c, pixel, o, acc, PIXELS, VECS, 1);
    else
        NAME(finish_vectors)(c, pixel, o, acc, PIXELS, VECS, 0);
}

/* acc += the products of `count` consecutive inputs of each pixel p, against the weight rows from w on (`ld`
 * floats apart). The inputs of pixel p are at rows[p], or with SPACED at rows[0] + p * step. */
static inline __attribute__((always_inline)) void
NAME(taps)(NAME(vec) acc[MAX_PIXELS][MAX_VECS], const ELEM *const *rows, const int SPACED, ptrdiff_t step, const ELEM *w,
     ptrdiff_t ld, ptrdiff_t count, const int PIXELS, const int VECS)
{
    /* One pointer per pixel, opaque to the compiler (the empty asm): left to itself, gcc hoisted the offsets
     * p * step out of the enclosing loops, spilled them to the stack and reloaded one per broadcast, so the
     * loop did 18 loads for 12 multiply-adds (load-bound at about 60 % of the FMA units' rate). */
    const ELEM *inputs[MAX_PIXELS];
    UNROLL for (int p = 0; p < PIXELS; p++) {
        const ELEM *input = SPACED ? rows[0] + p * step : rows[p];
        __asm__("" : "+r"(input));
        inputs[p] = input;
    }
    for (ptrdiff_t ci = 0; ci < count; ci++, w += ld) {
        NAME(vec) weights[MAX_VECS];
        UNROLL for (int v = 0; v < VECS; v++)
            weights[v] = *(const NAME(vec_unaligned) *)(w + v * VLEN);
        UNROLL for (int p = 0; p < PIXELS; p++) {
            ELEM value = inputs[p][ci];
            UNROLL for (int v = 0; v < VECS; v++)
                acc[p][v] += value * weights[v];
        }
    }
}

/* One K-block: the kernel rows [kh0, kh1) with all their taps and channels, or (kh1 == kh0 + 1, one_tap) the
 * channels [c0, c1) of tap (kh0, kw0). */
typedef struct {
    ptrdiff_t kh0, kh1, kw0, c0, c1;
    int one_tap, first, last;
} NAME(KBlock);

/* The register block of output pixels (n, oh, ow .. ow + PIXELS - 1) x channels o .. o + VECS * VLEN - 1 of
 * weight block `w` (width `ld`) over one K-block: started from zero or from `partial`, left in `partial`
 * or finished into y. With FLAT (a pointwise conv, see `flat_rows_of_kblock`) oh is 0 and ow counts the
 * image's pixels across its rows: output pixel i reads input pixel i. */
static inline __attribute__((always_inline)) void
NAME(block)(const NAME(Conv) *c, const NAME(KBlock) *k, const ELEM *w, ptrdiff_t ld, ELEM *partial, ptrdiff_t n, ptrdiff_t oh,
      ptrdiff_t ow, ptrdiff_t o, const int PIXELS, const int VECS, const int FLAT)
{
    NAME(vec) acc[MAX_PIXELS][MAX_VECS];  /* fixed sizes: once unrolled, each element is a register */
    UNROLL for (int p = 0; p < PIXELS; p++)
        UNROLL for (int v = 0; v < VECS; v++)
            acc[p][v] = k->first ? (NAME(vec)){0} : *(const NAME(vec) *)(partial + (p * MAX_VECS + v) * VLEN);
    const ELEM *rows[MAX_PIXELS];
    ptrdiff_t left = ow * c->stride_w - c->pad_left;  /* the first input column of the block's first pixel */
    ptrdiff_t pixel = X_PIXEL(c), step = c->stride_w * pixel;
    if (FLAT) {  /* one tap: the block's inputs are consecutive pixels, their K-block's channels one run each */
        rows[0] = c->x + (n * c->height * c->width + ow) * pixel + (k->one_tap ? k->c0 : 0);
        NAME(taps)(acc, rows, 1, pixel, w, ld, k->one_tap ? k->c1 - k->c0 : c->channels, PIXELS, VECS);
    }
    for (ptrdiff_t kh = k->kh0; kh < (FLAT ? k->kh0 : k->kh1); kh++) {
        ptrdiff_t ih = oh * c->stride_h - c->pad_top + kh * c->dilation_h;
        int row_inside = ih >= 0 && ih < c->height;
        const ELEM *row = row_inside ? c->x + (n * c->height + ih) * c->width * pixel : c->zeros;
        if (!k->one_tap && row_inside && c->groups == 1 && c->dilation_w == 1 && left >= 0
                && left + (PIXELS - 1) * c->stride_w + c->kernel_w <= c->width) {
            /* the whole kernel row is inside for every pixel: its taps' channels are one contiguous run */
            rows[0] = row + left * pixel;
            NAME(taps)(acc, rows, 1, step, w, ld, c->kernel_w * c->channels, PIXELS, VECS);
            w += c->kernel_w * c->channels * ld;
            continue;
        }
        ptrdiff_t kw_end = k->one_tap ? k->kw0 + 1 : c->kernel_w;
        ptrdiff_t c0 = k->one_tap ? k->c0 : 0, count = k->one_tap ? k->c1 - k->c0 : c->channels;
        for (ptrdiff_t kw = k->one_tap ? k->kw0 : 0; kw < kw_end; kw++, w += count * ld) {
            int inside = row_inside;
            UNROLL for (int p = 0; p < PIXELS; p++) {
                ptrdiff_t iw = left + p * c->stride_w + kw * c->dilation_w;
                int pixel_inside = row_inside && iw >= 0 && iw < c->width;
                rows[p] = pixel_inside ? row + iw * pixel + c0 : c->zeros;
                inside &= pixel_inside;
            }
            if (inside)  /* the block's inputs are equally spaced: one pointer reaches them all */
                NAME(taps)(acc, rows, 1, step, w, ld, count, PIXELS, VECS);
            else
                NAME(taps)(acc, rows, 0, 0, w, ld, count, PIXELS, VECS);
        }
    }
    if (!k->last) {
        UNROLL for (int p = 0; p < PIXELS; p++)
            UNROLL for (int v = 0; v < VECS; v++)
                *(NAME(vec) *)(partial + (p * MAX_VECS + v) * VLEN) = acc[p][v];
        return;
    }
    NAME(finish_block)(c, (n * c->out_h + oh) * c->out_w + ow, o, acc, PIXELS, VECS);
}

/* `block` of one shape as a function of its own: inlined into the large loop nests that call it, gcc kept the
 * block's input pointers on the stack and reloaded one per broadcast (a third more loads than the
 * multiply-adds need); in a small function they stay in registers. A call per block costs a few cycles. */
#define BLOCK_SHAPE(P, V, F) \
    static __attribute__((noinline)) void NAME(block_##P##_##V##_##F)(const NAME(Conv) *c, const NAME(KBlock) *k, \
            const ELEM *w, ptrdiff_t ld, ELEM *partial, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o) \
    { NAME(block)(c, k, w, ld, partial, n, oh, ow, o, P, V, F); }
#if BLOCK_VECS > 2
#define BLOCK_SHAPES(P, F) BLOCK_SHAPE(P, 1, F) BLOCK_SHAPE(P, 2, F) BLOCK_SHAPE(P, 3, F) BLOCK_SHAPE(P, 4, F)
#define CALL_SHAPES(P, F) CALL_SHAPE(P, 1, F) CALL_SHAPE(P, 2, F) CALL_SHAPE(P, 3, F) CALL_SHAPE(P, 4, F)
#else
#define BLOCK_SHAPES(P, F) BLOCK_SHAPE(P, 1, F) BLOCK_SHAPE(P, 2, F)
#define CALL_SHAPES(P, F) CALL_SHAPE(P, 1, F) CALL_SHAPE(P, 2, F)
#endif
BLOCK_SHAPES(8, 0) BLOCK_SHAPES(6, 0) BLOCK_SHAPES(4, 0) BLOCK_SHAPES(2, 0) BLOCK_SHAPES(1, 0)
BLOCK_SHAPES(8, 1) BLOCK_SHAPES(6, 1) BLOCK_SHAPES(4, 1) BLOCK_SHAPES(2, 1) BLOCK_SHAPES(1, 1)

/* The function of `block`'s shape (PIXELS, VECS, FLAT constants: every other branch folds away). */
static inline __attribute__((always_inline)) void
NAME(shaped_block)(const NAME(Conv) *c, const NAME(KBlock) *k, const ELEM *w, ptrdiff_t ld, ELEM *partial, ptrdiff_t n,
                   ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o, const int PIXELS, const int VECS, const int FLAT)
{
#define CALL_SHAPE(P, V, F) \
    if (PIXELS == P && VECS == V && FLAT == F) \
        return NAME(block_##P##_##V##_##F)(c, k, w, ld, partial, n, oh, ow, o);
    CALL_SHAPES(8, 0) CALL_SHAPES(6, 0) CALL_SHAPES(4, 0) CALL_SHAPES(2, 0) CALL_SHAPES(1, 0)
    CALL_SHAPES(8, 1) CALL_SHAPES(6, 1) CALL_SHAPES(4, 1) CALL_SHAPES(2, 1) CALL_SHAPES(1, 1)
}

/* Blocks of PIXELS pixels of output row oh of image n (with FLAT, of the image's flat run, oh 0) from ow on,
 * each starting before `starts` and ending by `stop`; then, with `rest`, the pixels left before `stop` in
 * blocks of 4 and 2 pixels and a single one. `sums` holds the partial sums of the row's (or image's) pixels
 * from its first on. */
static inline __attribute__((always_inline)) void
NAME(run_of_blocks)(const NAME(Conv) *c, const NAME(KBlock) *k, const ELEM *w, ptrdiff_t ld, ELEM *sums, ptrdiff_t n,
                    ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t starts, ptrdiff_t stop, int rest, ptrdiff_t o,
                    const int PIXELS, const int VECS, const int FLAT)
{
    for (; ow < starts && ow + PIXELS <= stop; ow += PIXELS)
        NAME(shaped_block)(c, k, w, ld, sums + ow * MAX_VECS * VLEN, n, oh, ow, o, PIXELS, VECS, FLAT);
    if (!rest)
        return;
    if (PIXELS > 4 && ow + 4 <= stop) {
        NAME(shaped_block)(c, k, w, ld, sums + ow * MAX_VECS * VLEN, n, oh, ow, o, 4, VECS, FLAT);
        ow += 4;
    }
    for (; ow + 2 <= stop; ow += 2)
        NAME(shaped_block)(c, k, w, ld, sums + ow * MAX_VECS * VLEN, n, oh, ow, o, 2, VECS, FLAT);
    if (ow < stop)
        NAME(shaped_block)(c, k, w, ld, sums + ow * MAX_VECS * VLEN, n, oh, ow, o, 1, VECS, FLAT);
}

/* Output rows [row0, row1) of the flattened (N * OH) rows, channels o .. o + VECS * VLEN - 1, over one K-block:
 * full blocks of PIXELS pixels, then the rest of the row in blocks of 4 and 2 pixels and a single one (a row
 * of 28 or 7 pixels left 4 or 1 of 6-pixel blocks to single pixels, whose one broadcast per multiply-add made
 * them several times slower a pixel). `partial` holds the chunk's partial sums, pixel by pixel. */
static inline __attribute__((always_inline)) void
NAME(rows_of_kblock)(const NAME(Conv) *c, const NAME(KBlock) *k, const ELEM *w, ptrdiff_t ld, ELEM *partial, ptrdiff_t row0,
               ptrdiff_t row1, ptrdiff_t o, const int PIXELS, const int VECS)
{
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / c->out_h, oh = row % c->out_h;
        ELEM *sums = partial + (row - row0) * c->out_w * MAX_VECS * VLEN;
        NAME(run_of_blocks)(c, k, w, ld, sums, n, oh, 0, c->out_w, c->out_w, 1, o, PIXELS, VECS, 0);
    }
}

/* A pointwise conv (1x1, stride 1, unpadded: output pixel i of an image reads input pixel i) over the rows
 * [row0, row1): each image's pixels run as one flat sequence across its rows, in blocks of PIXELS from the
 * image's first pixel and then the few left in blocks of 4, 2 and 1, so a 7- or 14-pixel row no longer ends in
 * 1- or 2-pixel blocks (a few multiply-adds in flight, half the FMA units idle). A block belongs to the row
 * that holds its first pixel (the blocks after the last whole one, together, to the row holding the first of
 * them) and may write into the rows after it: which block, and so which code, computes an output depends on
 * the image alone, never on how rows are split among threads or images into batches. `partial` holds the
 * partial sums from the first pixel of row0 on, with room for a block that runs past row1. */
static inline __attribute__((always_inline)) void
NAME(flat_rows_of_kblock)(const NAME(Conv) *c, const NAME(KBlock) *k, const ELEM *w, ptrdiff_t ld, ELEM *partial,
                          ptrdiff_t row0, ptrdiff_t row1, ptrdiff_t o, const int PIXELS, const int VECS)
{
    ptrdiff_t image = c->out_h * c->out_w, whole = image - image % PIXELS;
    for (ptrdiff_t row = row0; row < row1;) {
        ptrdiff_t n = row / c->out_h, last = (n + 1) * c->out_h < row1 ? (n + 1) * c->out_h : row1;
        ptrdiff_t from = (row - n * c->out_h) * c->out_w, to = (last - n * c->out_h) * c->out_w;
        ptrdiff_t first = (from + PIXELS - 1) / PIXELS * PIXELS;  /* the first block that starts in these rows */
        ELEM *sums = partial + (n * image - row0 * c->out_w) * MAX_VECS * VLEN;  /* indexed by the image's pixel */
        NAME(run_of_blocks)(c, k, w, ld, sums, n, 0, first, to, whole, 0, o, PIXELS, VECS, 1);
        if (whole >= from && whole < to)  /* the rest starts in these rows */
            NAME(run_of_blocks)(c, k, w, ld, sums, n, 0, whole, whole, image, 1, o, PIXELS, VECS, 1);
        row = last;
    }
}

/* The K-blocks in order, each with the offset of its weights within a block's slab (in rows of the slab). */
static ptrdiff_t NAME(kblocks)(const NAME(Conv) *c, NAME(KBlock) *out, ptrdiff_t *offsets)
{
    ptrdiff_t count = 0, row_length = c->kernel_w * c->channels;
    if (row_length <= KBLOCK) {
        ptrdiff_t rows = KBLOCK / row_length;
        for (ptrdiff_t kh = 0; kh < c->kernel_h; kh += rows) {
            ptrdiff_t end = kh + rows < c->kernel_h ? kh + rows : c->kernel_h;
            if (out) {
                out[count] = (NAME(KBlock)){kh, end, 0, 0, c->channels, 0, 0, 0};
                offsets[count] = kh * row_length;
            }
            count++;
        }
    } else {
        ptrdiff_t pieces = (c->channels + KBLOCK - 1) / KBLOCK, piece = (c->channels + pieces - 1) / pieces;
        for (ptrdiff_t kh = 0; kh < c->kernel_h; kh++)
            for (ptrdiff_t kw = 0; kw < c->kernel_w; kw++)
                for (ptrdiff_t c0 = 0; c0 < c->channels; c0 += piece) {
                    ptrdiff_t c1 = c0 + piece < c->channels ? c0 + piece : c->channels;
                    if (out) {
                        out[count] = (NAME(KBlock)){kh, kh + 1, kw, c0, c1, 1, 0, 0};
                        offsets[count] = kh * row_length + kw * c->channels + c0;
                    }
                    count++;
                }
    }
    if (out) {
        out[0].first = 1;
        out[count - 1].last = 1;
    }
    return count;
}

static inline __attribute__((always_inline)) void
NAME(weight_block)(const NAME(Conv) *c, const NAME(KBlock) *ks, const ptrdiff_t *offsets, ptrdiff_t count, ELEM *partial,
             ptrdiff_t row0, ptrdiff_t row1, ptrdiff_t o, const int PIXELS, const int VECS, const int FLAT)
{
    ptrdiff_t depth = c->kernel_h * c->kernel_w * c->channels, ld = VECS * VLEN;
    const ELEM *slab = c->weight + depth * o;  /* the blocks before this one are `o` channels wide in all */
    for (ptrdiff_t b = 0; b < count; b++)
        if (FLAT)
            NAME(flat_rows_of_kblock)(c, &ks[b], slab + offsets[b] * ld, ld, partial, row0, row1, o, PIXELS, VECS);
        else
            NAME(rows_of_kblock)(c, &ks[b], slab + offsets[b] * ld, ld, partial, row0, row1, o, PIXELS, VECS);
}

/* weight_block for the flat pixel runs of a pointwise conv or for row by row. */
#define WEIGHT_BLOCK(PIXELS, VECS) (flat ? NAME(weight_block)(&group, ks, offsets, count, partial, start, end, o, \
                                                              PIXELS, VECS, 1) \
                                         : NAME(weight_block)(&group, ks, offsets, count, partial, start, end, o, \
                                                              PIXELS, VECS, 0))

/* Output rows [row0, row1) of the flattened (N * OH) rows, channels [o0, o1) of each group (o0, o1 on weight
 * block boundaries): chunks of rows, each through every group's weight blocks. */
static void NAME(conv_rows)(const NAME(Conv) *c, ptrdiff_t row0, ptrdiff_t row1, ptrdiff_t o0, ptrdiff_t o1)
{
    ptrdiff_t depth = c->kernel_h * c->kernel_w * c->channels;
    ptrdiff_t count = NAME(kblocks)(c, NULL, NULL);
    NAME(KBlock) *ks = malloc(count * sizeof *ks);
    ptrdiff_t *offsets = malloc(count * sizeof *offsets);
    ptrdiff_t chunk = CHUNK_PIXELS / c->out_w > 1 ? CHUNK_PIXELS / c->out_w : 1;
    int flat = c->kernel_h == 1 && c->kernel_w == 1 && c->stride_h == 1 && c->stride_w == 1 && c->pad_top == 0
               && c->pad_left == 0 && c->out_h == c->height && c->out_w == c->width;  /* a pointwise conv */
    /* the chunk's pixels, and a flat run's last block past them; aligned_alloc's rule: whole 64 bytes */
    size_t bytes = ((chunk * c->out_w + MAX_PIXELS) * MAX_VECS * VLEN * sizeof(ELEM) + 63) / 64 * 64;
    ELEM *partial = count > 1 ? aligned_alloc(64, bytes) : NULL;
    NAME(kblocks)(c, ks, offsets);
    for (ptrdiff_t start = row0; start < row1; start += chunk) {
        ptrdiff_t end = start + chunk < row1 ? start + chunk : row1;
        for (ptrdiff_t g = 0; g < c->groups; g++) {
            NAME(Conv) group = *c;  /* the group's channels of x, y and the residual, its weights and bias */
            group.x = c->x + g * c->channels;
            group.weight = c->weight + g * depth * c->padded_channels;
            group.bias = c->bias ? c->bias + g * c->padded_channels : NULL;
            group.residual = c->residual ? c->residual + g * c->out_channels : NULL;
            group.y = c->y + g * c->out_channels;
            for (ptrdiff_t o = o0; o < o1; o += BLOCK_VECS * VLEN) {
                switch ((c->padded_channels - o) / VLEN) {  /* a narrower last block: more pixels per block */
                case 1: WEIGHT_BLOCK(8, 1); break;
#if BLOCK_VECS > 2
                case 2: WEIGHT_BLOCK(8, 2); break;
                case 3: WEIGHT_BLOCK(8, 3); break;
#endif
                default: WEIGHT_BLOCK(6, BLOCK_VECS); break;
                }
            }
        }
    }
    free(partial);
    free(offsets);
    free(ks);
}

/* Depthwise output pixels (n, oh, ow .. ow + PIXELS - 1), channels o .. o + VLEN - 1, for pixels whose taps
 * are all inside the input along the width (CHECKED: any pixel, one at a time, each tap bounds-checked). The
 * taps are summed from zero in (kh, kw) order, a tap outside the input skipped, whichever path runs (this one
 * or depthwise_three). */
static inline __attribute__((always_inline)) void
NAME(depthwise_pixels)(const NAME(Conv) *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o, const int PIXELS,
                       const int CHECKED)
{
    NAME(vec) acc[DEPTHWISE_PIXELS];
    UNROLL for (int p = 0; p < PIXELS; p++)
        acc[p] = (NAME(vec)){0};
    ptrdiff_t count = c->out_channels - o < VLEN ? c->out_channels - o : VLEN;
    ptrdiff_t left = ow * c->stride_w - c->pad_left, step = c->stride_w * c->channels;
    for (ptrdiff_t kh = 0; kh < c->kernel_h; kh++) {
        ptrdiff_t ih = oh * c->stride_h - c->pad_top + kh * c->dilation_h;
        if (ih < 0 || ih >= c->height)
            continue;
        const ELEM *row = c->x + (n * c->height + ih) * c->width * c->channels + o;
        const ELEM *w = c->weight + kh * c->kernel_w * c->padded_channels + o;
        for (ptrdiff_t kw = 0; kw < c->kernel_w; kw++, w += c->padded_channels) {
            ptrdiff_t iw = left + kw * c->dilation_w;
            if (CHECKED && (iw < 0 || iw >= c->width))
                continue;
            NAME(vec) weights = *(const NAME(vec_unaligned) *)w;
            const ELEM *x = row + iw * c->channels;
            UNROLL for (int p = 0; p < PIXELS; p++) {
                /* a partial last vector must not read past the tensor */
                NAME(vec) inputs = count == VLEN ? *(const NAME(vec_unaligned) *)(x + p * step)
                                                 : NAME(load_partial)(x + p * step, count);
                acc[p] += inputs * weights;
            }
        }
    }
    UNROLL for (int p = 0; p < PIXELS; p++)
        NAME(finish)(c, (n * c->out_h + oh) * c->out_w + ow + p, o, acc[p]);
}

/* A 3x3 kernel (undilated along the width, stride STRIDE) over the pixels whose taps lie inside the width
 * (CHECKED: one pixel anywhere, its taps outside the width skipped), channels [o0, o1): the three input rows
 * found once for all channel vectors, and each input vector of a row loaded once and used by every pixel and
 * tap that reads it; a partial last vector by depthwise_pixels. */
static inline __attribute__((always_inline)) void
NAME(depthwise_three)(const NAME(Conv) *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o0, ptrdiff_t o1,
                      const int PIXELS, const int CHECKED, const int STRIDE)
{
    const ELEM *rows[3];  /* each kernel row's input (its pixel 0), or NULL outside the input */
    ptrdiff_t left = ow * c->stride_w - c->pad_left, channels = c->channels, padded = c->padded_channels;
    UNROLL for (int kh = 0; kh < 3; kh++) {
        ptrdiff_t ih = oh * c->stride_h - c->pad_top + kh * c->dilation_h;
        rows[kh] = ih >= 0 && ih < c->height ? c->x + (n * c->height + ih) * c->width * channels : NULL;
    }
    ptrdiff_t full = o0 + (c->out_channels - o0) / VLEN * VLEN;  /* the end of the whole vectors */
    full = full < o1 ? full : o1;
    ptrdiff_t o = o0;
    for (; o < full; o += VLEN) {
        NAME(vec) acc[DEPTHWISE_PIXELS];
        UNROLL for (int p = 0; p < PIXELS; p++)
            acc[p] = (NAME(vec)){0};
        UNROLL for (int kh = 0; kh < 3; kh++) {
            if (!rows[kh])
                continue;
            NAME(vec) weights[3];
            UNROLL for (int kw = 0; kw < 3; kw++)
                weights[kw] = *(const NAME(vec_unaligned) *)(c->weight + (kh * 3 + kw) * padded + o);
            /* each input vector in turn, into every (pixel, tap) that reads it: a pixel's taps still in kw order */
            const ELEM *x = rows[kh] + (CHECKED ? 0 : left * channels) + o;
            UNROLL for (int i = 0; i < (PIXELS - 1) * STRIDE + 3; i++, x += CHECKED ? 0 : channels) {
                if (CHECKED && (left + i < 0 || left + i >= c->width))
                    continue;
                NAME(vec) input = *(const NAME(vec_unaligned) *)(CHECKED ? x + (left + i) * channels : x);
                UNROLL for (int kw = 0; kw < 3; kw++)
                    if (i - kw >= 0 && (i - kw) % STRIDE == 0 && (i - kw) / STRIDE < PIXELS)
                        acc[(i - kw) / STRIDE] += input * weights[kw];
            }
        }
        UNROLL for (int p = 0; p < PIXELS; p++)
            NAME(finish)(c, (n * c->out_h + oh) * c->out_w + ow + p, o, acc[p]);
    }
    for (; o < o1; o += VLEN)
        NAME(depthwise_pixels)(c, n, oh, ow, o, PIXELS, CHECKED);
}

/* The channel vectors [o0, o1) of a block of pixels: a function of its own for each shape, called once per
 * block, so that the compiler keeps its addresses in registers (inlined into depthwise_rows' loops, they were
 * reloaded from the stack around every kernel row's 12 multiply-adds). */
static inline __attribute__((always_inline)) void
NAME(depthwise_span)(const NAME(Conv) *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o0, ptrdiff_t o1,
                     const int PIXELS, const int CHECKED, const int THREE, const int STRIDE)
{
    if (THREE)
        NAME(depthwise_three)(c, n, oh, ow, o0, o1, PIXELS, CHECKED, STRIDE);
    else
        for (ptrdiff_t o = o0; o < o1; o += VLEN)
            NAME(depthwise_pixels)(c, n, oh, ow, o, PIXELS, CHECKED);
}

/* Every shape (pixels, edge checks, 3-wide kernel, stride) depthwise runs, listed once: each gets a function of
 * its own below, and depthwise_shaped calls it by the same list. */
#if DEPTHWISE_PIXELS > 4
#define DEPTHWISE_FOUR_PIXEL_SHAPES(X) X(4, 0, 0, 1) X(4, 0, 1, 1) X(4, 0, 1, 2)
#else
#define DEPTHWISE_FOUR_PIXEL_SHAPES(X)
#endif
#define DEPTHWISE_SHAPE_LIST(X) \
    X(DEPTHWISE_PIXELS, 0, 0, 1) X(DEPTHWISE_PIXELS, 0, 1, 1) X(DEPTHWISE_PIXELS, 0, 1, 2) \
    DEPTHWISE_FOUR_PIXEL_SHAPES(X) X(1, 0, 0, 1) X(1, 0, 1, 1) X(1, 0, 1, 2) X(1, 1, 0, 1) X(1, 1, 1, 1)

#define DEPTHWISE_SHAPE(P, CHECKED, THREE, STRIDE) \
    static __attribute__((noinline)) void NAME(depthwise_##P##_##CHECKED##_##THREE##_##STRIDE)( \
            const NAME(Conv) *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o0, ptrdiff_t o1) \
    { NAME(depthwise_span)(c, n, oh, ow, o0, o1, P, CHECKED, THREE, STRIDE); }
DEPTHWISE_SHAPE_LIST(DEPTHWISE_SHAPE)

/* The function of depthwise_span's shape (constants: every other branch folds away). */
static inline __attribute__((always_inline)) void
NAME(depthwise_shaped)(const NAME(Conv) *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t o0, ptrdiff_t o1,
                       const int PIXELS, const int CHECKED, const int THREE, const int STRIDE)
{
#define CALL_DEPTHWISE(P, CHECKED_, THREE_, STRIDE_) \
    if (PIXELS == P && CHECKED == CHECKED_ && THREE == THREE_ && STRIDE == STRIDE_) \
        return NAME(depthwise_##P##_##CHECKED_##_##THREE_##_##STRIDE_)(c, n, oh, ow, o0, o1);
    DEPTHWISE_SHAPE_LIST(CALL_DEPTHWISE)
}

/* The pixels [ow, end) of one row whose taps lie inside the width, channels [o0, o1): blocks of
 * DEPTHWISE_PIXELS, 4, then single pixels. */
static inline __attribute__((always_inline)) void
NAME(depthwise_inside)(const NAME(Conv) *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t end, ptrdiff_t o0,
                       ptrdiff_t o1, const int THREE, const int STRIDE)
{
    for (; ow + DEPTHWISE_PIXELS <= end; ow += DEPTHWISE_PIXELS)
        NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, DEPTHWISE_PIXELS, 0, THREE, STRIDE);
#if DEPTHWISE_PIXELS > 4
    for (; ow + 4 <= end; ow += 4)
        NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, 4, 0, THREE, STRIDE);
#endif
    for (; ow < end; ow++)
        NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, 1, 0, THREE, STRIDE);
}

/* Depthwise: one input channel per output channel (O == C, weight (KH, KW, OP)), so x's channels line up with
 * the output's and each tap is one elementwise multiply-add of a vector of channels. Rows [row0, row1) of the
 * flattened (N * OH) rows, channels [o0, o1) (o0 a whole number of vectors). Along each row, the pixels whose taps all lie inside the width run in blocks
 * without bounds checks (independent sums keep the FMA units busy); the edges run one by one, checked. */
static void NAME(depthwise_rows)(const NAME(Conv) *c, ptrdiff_t row0, ptrdiff_t row1, ptrdiff_t o0, ptrdiff_t o1)
{
    /* inside: ow * stride_w - pad_left >= 0 and ow * stride_w - pad_left + (kernel_w - 1) * dilation_w < width */
    ptrdiff_t reach = (c->kernel_w - 1) * c->dilation_w;
    ptrdiff_t first = (c->pad_left + c->stride_w - 1) / c->stride_w;
    ptrdiff_t end = c->width - reach + c->pad_left > 0 ? (c->width - reach + c->pad_left - 1) / c->stride_w + 1 : 0;
    end = end < c->out_w ? end : c->out_w;
    first = first < end ? first : end;
    int three = c->kernel_h == 3 && c->kernel_w == 3 && c->dilation_w == 1 && (c->stride_w == 1 || c->stride_w == 2);
    for (ptrdiff_t row = row0; row < row1; row++) {
        ptrdiff_t n = row / c->out_h, oh = row % c->out_h, ow = 0;
        for (; ow < first; ow++)  /* the edges: one pixel at a time (a stride of no matter), taps outside skipped */
            if (three)
                NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, 1, 1, 1, 1);
            else
                NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, 1, 1, 0, 1);
        if (three && c->stride_w == 1)
            NAME(depthwise_inside)(c, n, oh, ow, end, o0, o1, 1, 1);
        else if (three)
            NAME(depthwise_inside)(c, n, oh, ow, end, o0, o1, 1, 2);
        else
            NAME(depthwise_inside)(c, n, oh, ow, end, o0, o1, 0, 1);
        for (ow = end; ow < c->out_w; ow++)
            if (three)
                NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, 1, 1, 1, 1);
            else
                NAME(depthwise_shaped)(c, n, oh, ow, o0, o1, 1, 1, 0, 1);
    }
}

/* The work units threads share: `rows` x `parts` (part-major: unit u is row u % rows of channel part
 * u / rows). A layer of few output rows (a 7x7 map at batch 1) has too few rows to keep many threads busy, so
 * its output channels are split too, on `step` boundaries (a weight block, or a vector for a depthwise conv):
 * part p holds steps [p S / parts, (p + 1) S / parts) of the S steps. Every output is computed by the same
 * code in the same order whichever part holds it. */
static void NAME(units)(const NAME(Conv) *c, ptrdiff_t unit0, ptrdiff_t unit1, ptrdiff_t channels, ptrdiff_t step,
                        void (*rows)(const NAME(Conv) *, ptrdiff_t, ptrdiff_t, ptrdiff_t, ptrdiff_t))
{
    ptrdiff_t steps = (channels + step - 1) / step;
    while (unit0 < unit1) {
        ptrdiff_t part = unit0 / c->rows, row0 = unit0 % c->rows;
        ptrdiff_t row1 = unit1 - part * c->rows < c->rows ? unit1 - part * c->rows : c->rows;
        ptrdiff_t o0 = steps * part / c->parts * step, o1 = steps * (part + 1) / c->parts * step;
        rows(c, row0, row1, o0, o1 < channels ? o1 : channels);
        unit0 += row1 - row0;
    }
}

/* Units [unit0, unit1) of a conv (see `units`). */
void NAME(conv2d_nhwc)(const NAME(Conv) *c, ptrdiff_t unit0, ptrdiff_t unit1)
{
    NAME(units)(c, unit0, unit1, c->padded_channels, BLOCK_VECS * VLEN, NAME(conv_rows));
}

/* Units [unit0, unit1) of a depthwise conv (see `units`). */
void NAME(depthwise2d_nhwc)(const NAME(Conv) *c, ptrdiff_t unit0, ptrdiff_t unit1)
{
    NAME(units)(c, unit0, unit1, c->out_channels, VLEN, NAME(depthwise_rows));
}
