/* The integer reference's conv and add, compiled: the bits of dabuild.qir.layers at native speed.
 *
 * qconv2d_nhwc: x (N, H, W, C2) int16 holds the centred inputs q - zero_point (C2 = channels rounded up to
 * even, the extra channel 0), the packed weight int16 pairs of input channels; each output is
 * clamp(requantize(sum + bias) + zero_point, low, high), stored as 1, 2 or 4 bytes. The sums are int32: the
 * lowering proves |sum + bias| < 2^31 for 8-bit inputs and weights, and integer sums are exact in any order,
 * so the result is the numpy reference's bit for bit whatever the vector width, blocking or thread split.
 *
 * Packed weight: output channels in blocks of up to QBLOCK_VECS vectors of QLANES channels (the last block
 * narrower, columns past O zero); block b is (KH, KW, C2 / 2, width_b, 2): for one tap and one pair of input
 * channels, the pairs (w[c], w[c + 1]) of width_b output channels, contiguous. A multiply-add of pairs
 * (vpmaddwd, or VNNI's vpdpwssd) against a broadcast pair of inputs adds x[c] w[c] + x[c+1] w[c+1] to each
 * output channel's int32 (NEON: a widening multiply and a pairwise add). A register block is QPIXELS
 * neighbouring output pixels times up to QBLOCK_VECS vectors of channels.
 *
 * With AVX-512 VNNI a second kernel, qconv2d_u8_nhwc, multiplies uint8 inputs by int8 weights four at a time
 * (vpdpbusd): the same code over quads of input channels (see its comment).
 *
 * Requantization (qfinish, qrequantize_one) is fixed_point.requantize's: the magnitude of
 * sum + bias times the Q31 multiplier, plus half of 2^shift, shifted right, the sign put back (ties away from
 * zero), then the zero point and the clamp, exactly as requantize.c does it for the float64 sums.
 *
 * qadd_lookup: an 8-bit add's output for every pair of input bytes is a 256 x 256 table the caller computes
 * with the numpy reference; the kernel only looks it up.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512BW__) || defined(__AVX2__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* The 4 input bytes of one multiply-add step, as one int32 to broadcast. */
static inline int32_t qgroup(const void *p)
{
    int32_t group;
    memcpy(&group, p, sizeof group);
    return group;
}

#if defined(__AVX512BW__)
#define QLANES 16
typedef __m512i qvec;
#define QZERO() _mm512_setzero_si512()
#define QLOAD(p) _mm512_loadu_si512((const void *)(p))
#define QBROADCAST(p) _mm512_set1_epi32(qgroup(p))
#if defined(__AVX512VNNI__)
#define QMADD(acc, x, w) _mm512_dpwssd_epi32((acc), (x), (w))
#else
#define QMADD(acc, x, w) _mm512_add_epi32((acc), _mm512_madd_epi16((x), (w)))
#endif
#define QSTORE(p, v) _mm512_storeu_si512((void *)(p), (v))
#elif defined(__AVX2__)
#define QLANES 8
typedef __m256i qvec;
#define QZERO() _mm256_setzero_si256()
#define QLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define QBROADCAST(p) _mm256_set1_epi32(qgroup(p))
#define QMADD(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16((x), (w)))
#define QSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#elif defined(__aarch64__)
/* NEON: the products of 8 int16 lanes widened (vmull), adjacent pairs added (vpaddq): vpmaddwd's sums. */
#define QLANES 4
typedef int32x4_t qvec;
static inline qvec qmadd(qvec acc, qvec x, qvec w)
{
    int16x8_t xs = vreinterpretq_s16_s32(x), ws = vreinterpretq_s16_s32(w);
    return vaddq_s32(acc, vpaddq_s32(vmull_s16(vget_low_s16(xs), vget_low_s16(ws)), vmull_high_s16(xs, ws)));
}
#define QZERO() vdupq_n_s32(0)
#define QLOAD(p) vld1q_s32((const int32_t *)(const void *)(p))
#define QBROADCAST(p) vdupq_n_s32(qgroup(p))
#define QMADD(acc, x, w) qmadd((acc), (x), (w))
#define QSTORE(p, v) vst1q_s32((int32_t *)(p), (v))
#else
#define QLANES 8
typedef struct { int32_t lane[QLANES]; } qvec;
static inline qvec qzero(void) { qvec v; memset(&v, 0, sizeof v); return v; }
static inline qvec qload(const int16_t *p) { qvec v; memcpy(&v, p, sizeof v); return v; }
static inline qvec qmadd(qvec acc, qvec x, qvec w)
{
    const int16_t *xs = (const int16_t *)&x, *ws = (const int16_t *)&w;
    for (int l = 0; l < QLANES; l++)
        acc.lane[l] += (int32_t)xs[2 * l] * ws[2 * l] + (int32_t)xs[2 * l + 1] * ws[2 * l + 1];
    return acc;
}
static inline qvec qbroadcast(const int16_t *p)
{
    qvec v;
    int32_t pair;
    memcpy(&pair, p, sizeof pair);
    for (int l = 0; l < QLANES; l++)
        v.lane[l] = pair;
    return v;
}
#define QZERO() qzero()
#define QLOAD(p) qload((const int16_t *)(p))
#define QBROADCAST(p) qbroadcast((const int16_t *)(p))
#define QMADD(acc, x, w) qmadd((acc), (x), (w))
#define QSTORE(p, v) memcpy((p), &(v), sizeof(v))
#endif

#define QPIXELS 4
#define QBLOCK_VECS 4
#define QUNROLL _Pragma("GCC unroll 16")

typedef struct {
    const void *x;               /* (N, H, W, channels): int16 centred inputs, or uint8 (see qconv2d_u8_nhwc) */
    ptrdiff_t height, width, channels;  /* channels: a whole number of groups (2 int16 or 4 uint8) */
    const void *weight;          /* packed, see above: int16 pairs or int8 quads */
    ptrdiff_t kernel_h, kernel_w, out_channels, padded_channels;
    const int64_t *bias, *multiplier, *shift;  /* (out_channels,) each */
    int64_t zero_point, low, high;
    void *y;                     /* (N, OH, OW, out_channels) of out_bytes each */
    ptrdiff_t out_bytes;
    ptrdiff_t out_h, out_w, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
    const void *zeros;           /* what a tap in the padding reads: a row of channels centred zeros */
} QConv;

/* One finished value, as fixed_point.requantize and requantize.c compute it. */
static inline int64_t qrequantize_one(int64_t sum, int64_t multiplier, int64_t shift, int64_t zero_point,
                                      int64_t low, int64_t high)
{
    int64_t magnitude = sum < 0 ? -sum : sum;
    int64_t rounded = (magnitude * multiplier + ((int64_t)1 << (shift - 1))) >> shift;
    int64_t value = (sum < 0 ? -rounded : rounded) + zero_point;
    return value < low ? low : value > high ? high : value;
}

static inline void qstore(const QConv *c, ptrdiff_t index, int64_t value)
{
    switch (c->out_bytes) {
    case 1: ((int8_t *)c->y)[index] = (int8_t)(uint8_t)value; break;
    case 2: ((int16_t *)c->y)[index] = (int16_t)(uint16_t)value; break;
    default: ((int32_t *)c->y)[index] = (int32_t)value; break;
    }
}

/* Output pixel `pixel`'s channels first .. first + count - 1 from their int32 sums. */
static inline void qfinish(const QConv *c, ptrdiff_t pixel, ptrdiff_t first, ptrdiff_t count, const int32_t *sums)
{
    ptrdiff_t base = pixel * c->out_channels + first;
    ptrdiff_t l = 0;
#if defined(__AVX512F__)
    if (c->out_bytes == 1)
        for (; l + 8 <= count; l += 8) {  /* eight channels at a time in int64 lanes */
            ptrdiff_t o = first + l;
            __m512i sum = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i *)(sums + l))),
                                           _mm512_loadu_si512((const void *)(c->bias + o)));
            __m512i magnitude = _mm512_abs_epi64(sum);
            __m512i shift = _mm512_loadu_si512((const void *)(c->shift + o));
            __m512i half = _mm512_sllv_epi64(_mm512_set1_epi64(1), _mm512_sub_epi64(shift, _mm512_set1_epi64(1)));
            __m512i product = _mm512_mul_epu32(magnitude, _mm512_loadu_si512((const void *)(c->multiplier + o)));
            __m512i rounded = _mm512_srlv_epi64(_mm512_add_epi64(product, half), shift);
            __mmask8 negative = _mm512_cmplt_epi64_mask(sum, _mm512_setzero_si512());
            rounded = _mm512_mask_sub_epi64(rounded, negative, _mm512_setzero_si512(), rounded);
            __m512i value = _mm512_add_epi64(rounded, _mm512_set1_epi64(c->zero_point));
            value = _mm512_min_epi64(_mm512_max_epi64(value, _mm512_set1_epi64(c->low)), _mm512_set1_epi64(c->high));
            _mm_storel_epi64((__m128i *)((int8_t *)c->y + base + l), _mm512_cvtepi64_epi8(value));
        }
#endif
    for (; l < count; l++) {
        ptrdiff_t o = first + l;
        qstore(c, base + l, qrequantize_one((int64_t)sums[l] + c->bias[o], c->multiplier[o], c->shift[o],
                                            c->zero_point, c->low, c->high));
    }
}

/* A register block: `pixels` (<= QPIXELS) output pixels of one output row, VECS vectors of channels. A group
 * is the 4 bytes one multiply-add step takes from each input pixel: 2 int16 inputs, or 4 uint8 ones. */
#define QBLOCK(NAME, VECS, XBYTES, MADD)                                                                         \
    static void NAME##_##VECS(const QConv *c, ptrdiff_t n, ptrdiff_t oh, ptrdiff_t ow0, ptrdiff_t pixels,       \
                              const char *slab, ptrdiff_t first)                                                 \
    {                                                                                                            \
        qvec acc[QPIXELS][VECS];                                                                                 \
        QUNROLL for (int p = 0; p < QPIXELS; p++) QUNROLL for (int v = 0; v < VECS; v++) acc[p][v] = QZERO();    \
        ptrdiff_t groups = c->channels * (XBYTES) / 4, width = VECS * QLANES;                                    \
        const char *x = (const char *)c->x;                                                                      \
        for (ptrdiff_t kh = 0; kh < c->kernel_h; kh++) {                                                         \
            ptrdiff_t ih = oh * c->stride_h - c->pad_top + kh * c->dilation_h;                                   \
            int row_inside = ih >= 0 && ih < c->height;                                                          \
            for (ptrdiff_t kw = 0; kw < c->kernel_w; kw++) {                                                     \
                const char *in[QPIXELS];                                                                         \
                QUNROLL for (int p = 0; p < QPIXELS; p++) {                                                      \
                    ptrdiff_t ow = ow0 + (p < pixels ? p : pixels - 1);                                          \
                    ptrdiff_t iw = ow * c->stride_w - c->pad_left + kw * c->dilation_w;                          \
                    in[p] = row_inside && iw >= 0 && iw < c->width                                               \
                                ? x + ((n * c->height + ih) * c->width + iw) * c->channels * (XBYTES)            \
                                : (const char *)c->zeros;                                                        \
                }                                                                                                \
                const char *w = slab + (kh * c->kernel_w + kw) * groups * width * 4;                             \
                for (ptrdiff_t group = 0; group < groups; group++, w += width * 4) {                             \
                    qvec weights[VECS];                                                                          \
                    QUNROLL for (int v = 0; v < VECS; v++) weights[v] = QLOAD(w + v * QLANES * 4);               \
                    QUNROLL for (int p = 0; p < QPIXELS; p++) {                                                  \
                        qvec inputs = QBROADCAST(in[p] + 4 * group);                                             \
                        QUNROLL for (int v = 0; v < VECS; v++) acc[p][v] = MADD(acc[p][v], inputs, weights[v]);  \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        int32_t sums[VECS * QLANES];                                                                             \
        for (ptrdiff_t p = 0; p < pixels; p++) {                                                                 \
            QUNROLL for (int v = 0; v < VECS; v++) QSTORE(sums + v * QLANES, acc[p][v]);                         \
            ptrdiff_t count = c->out_channels - first < width ? c->out_channels - first : width;                 \
            qfinish(c, (n * c->out_h + oh) * c->out_w + ow0 + p, first, count, sums);                            \
        }                                                                                                        \
    }

/* Output rows row0 .. row1 - 1 of the (N * OH) rows (the unit the caller splits among threads), by the
 * register blocks NAME_1 .. NAME_4. */
#define QCONV(NAME, BLOCK, XBYTES)                                                                               \
    void NAME(const QConv *c, ptrdiff_t row0, ptrdiff_t row1)                                                    \
    {                                                                                                            \
        ptrdiff_t slab_bytes = c->kernel_h * c->kernel_w * c->channels * (XBYTES); /* per output channel */     \
        for (ptrdiff_t row = row0; row < row1; row++) {                                                          \
            ptrdiff_t n = row / c->out_h, oh = row % c->out_h;                                                   \
            for (ptrdiff_t first = 0; first < c->padded_channels; first += QBLOCK_VECS * QLANES) {               \
                ptrdiff_t vecs = (c->padded_channels - first) / QLANES;                                          \
                vecs = vecs < QBLOCK_VECS ? vecs : QBLOCK_VECS;                                                  \
                const char *slab = (const char *)c->weight + slab_bytes * first;                                 \
                for (ptrdiff_t ow = 0; ow < c->out_w; ow += QPIXELS) {                                           \
                    ptrdiff_t pixels = c->out_w - ow < QPIXELS ? c->out_w - ow : QPIXELS;                        \
                    switch (vecs) {                                                                              \
                    case 1: BLOCK##_1(c, n, oh, ow, pixels, slab, first); break;                                 \
                    case 2: BLOCK##_2(c, n, oh, ow, pixels, slab, first); break;                                 \
                    case 3: BLOCK##_3(c, n, oh, ow, pixels, slab, first); break;                                 \
                    default: BLOCK##_4(c, n, oh, ow, pixels, slab, first); break;                                \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }

QBLOCK(qblock, 1, 2, QMADD)
QBLOCK(qblock, 2, 2, QMADD)
QBLOCK(qblock, 3, 2, QMADD)
QBLOCK(qblock, 4, 2, QMADD)
QCONV(qconv2d_nhwc, qblock, 2)

/* u8 x s8 with VNNI's vpdpbusd: four products a step, twice vpdpwssd's. x holds uint8 values u, the padding
 * row a pad value p with u - p = q - zero_point for every input (int8 storage: u = q + 128, p = zero_point +
 * 128; uint8: u = q, p = zero_point), so sum (u - p) w is the conv; the caller folds - p sum w into the bias.
 * The packed weight's groups are int8 quads of input channels (channels a multiple of 4): a slab has the
 * int16 path's bytes. The sums of u w must stay below 2^31 (the caller checks 255 sum |w| + |bias|). */
#if defined(__AVX512VNNI__)
#define QMADD_U8(acc, x, w) _mm512_dpbusd_epi32((acc), (x), (w))
QBLOCK(qblock_u8, 1, 1, QMADD_U8)
QBLOCK(qblock_u8, 2, 1, QMADD_U8)
QBLOCK(qblock_u8, 3, 1, QMADD_U8)
QBLOCK(qblock_u8, 4, 1, QMADD_U8)
QCONV(qconv2d_u8_nhwc, qblock_u8, 1)
int qconv_u8_available(void) { return 1; }
#else
void qconv2d_u8_nhwc(const QConv *c, ptrdiff_t row0, ptrdiff_t row1) { (void)c; (void)row0; (void)row1; }
int qconv_u8_available(void) { return 0; }
#endif

/* The number of int32 lanes of this build's vectors: the packed weight's unit of output channels. */
ptrdiff_t qconv_lanes(void) { return QLANES; }

/* One add: its two 1-byte inputs, the table and the output, all of one element count. */
typedef struct {
    const uint8_t *a, *b, *table;
    uint8_t *y;
} QAdd;

/* y[i] = table[a[i] * 256 + b[i]] for elements [first, end): threads.c's rows are elements here. */
void qadd_lookup(const QAdd *p, ptrdiff_t first, ptrdiff_t end)
{
    const uint8_t *a = p->a, *b = p->b, *table = p->table;
    uint8_t *y = p->y;  /* locals: a store through a byte pointer could otherwise change *p for the next element */
    for (ptrdiff_t i = first; i < end; i++)
        y[i] = table[(ptrdiff_t)a[i] << 8 | b[i]];
}
