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
 * output channel's int32 (NEON: a widening multiply and a pairwise add). A register block is up to QPIXELS
 * consecutive output pixels times up to QBLOCK_VECS vectors of channels, sized to the path's registers (AVX2's
 * 16: 6 x 2; 32 registers: 4 x 4); a row's last pixels take narrower blocks, never duplicates. Pixels are
 * taken in tiles whose inputs stay in cache while every block of output channels reads them, and where a
 * block's kernel row lies inside the input, its taps are one run of memory (the packed weight's too).
 *
 * With AVX-512 VNNI a second kernel, qconv2d_u8_nhwc, multiplies uint8 inputs by int8 weights four at a time
 * (vpdpbusd): the same code over quads of input channels (see its comment). With AVX2, qconv2d_u8s7_nhwc does
 * so by vpmaddubsw for weights within [-64, 64] only, where it is exact (see its comment); integer.py picks
 * the kernel per layer from the weights' range.
 *
 * Requantization (qfinish, qrequantize_one) is fixed_point.requantize's: the magnitude of
 * sum + bias times the Q31 multiplier, plus half of 2^shift, shifted right, the sign put back (ties away from
 * zero), then the zero point and the clamp, exactly as requantize.c does it for the float64 sums. With AVX2,
 * 1-byte outputs are finished eight channels at a time straight from the accumulators (qfinish_block, qfinish8).
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
#define QPIXELS 4
#define QBLOCK_VECS 4
#define QPIXEL_SIZES(X, ...) X(4, __VA_ARGS__) X(2, __VA_ARGS__) X(1, __VA_ARGS__)
#elif defined(__AVX2__)
#define QLANES 8
typedef __m256i qvec;
#define QZERO() _mm256_setzero_si256()
#define QLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define QBROADCAST(p) _mm256_set1_epi32(qgroup(p))
#define QMADD(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16((x), (w)))
#define QSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
/* 16 registers: 6 x 2 accumulators, 2 weight vectors and the broadcast input (4 x 4 had spilled, and loaded
 * each weight vector once per pixel from memory) */
#define QPIXELS 6
#define QBLOCK_VECS 2
#define QPIXEL_SIZES(X, ...) X(6, __VA_ARGS__) X(4, __VA_ARGS__) X(2, __VA_ARGS__) X(1, __VA_ARGS__)
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
#define QPIXELS 4
#define QBLOCK_VECS 4
#define QPIXEL_SIZES(X, ...) X(4, __VA_ARGS__) X(2, __VA_ARGS__) X(1, __VA_ARGS__)
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
#define QPIXELS 4
#define QBLOCK_VECS 4
#define QPIXEL_SIZES(X, ...) X(4, __VA_ARGS__) X(2, __VA_ARGS__) X(1, __VA_ARGS__)
#endif
#if QBLOCK_VECS == 4
#define QVEC_COUNTS(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__)
#else
#define QVEC_COUNTS(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__)
#endif
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

#if defined(__AVX2__) && !defined(__AVX512F__)
/* Eight output channels' requantization in the lanes qfinish8 takes it: the biases as int32 (the layer proves
 * |sum + bias| < 2^31), and for the even [0] and odd [1] channels the multipliers, shifts and halves of 2^shift
 * as int64 lanes. Made once per tile and block of output channels (qchannels), not once per pixel. */
typedef struct {
    __m256i bias, multiplier[2], shift[2], half[2];
} QScale8;

static inline QScale8 qscale8(const QConv *c, ptrdiff_t o)
{
    const int64_t *b = c->bias + o, *m = c->multiplier + o, *s = c->shift + o;
    QScale8 scale;
    scale.bias = _mm256_setr_epi32((int32_t)b[0], (int32_t)b[1], (int32_t)b[2], (int32_t)b[3], (int32_t)b[4],
                                   (int32_t)b[5], (int32_t)b[6], (int32_t)b[7]);
    for (int odd = 0; odd < 2; odd++) {
        scale.multiplier[odd] = _mm256_setr_epi64x(m[odd], m[2 + odd], m[4 + odd], m[6 + odd]);
        scale.shift[odd] = _mm256_setr_epi64x(s[odd], s[2 + odd], s[4 + odd], s[6 + odd]);
        scale.half[odd] = _mm256_sllv_epi64(_mm256_set1_epi64x(1), _mm256_sub_epi64(scale.shift[odd],
                                                                                     _mm256_set1_epi64x(1)));
    }
    return scale;
}

/* The even (odd 0) or odd int32 lanes' magnitudes (below 2^31) times their Q31 multipliers (vpmuludq reads
 * each int64 lane's low half), plus half of 2^shift, shifted: the rounded magnitudes as int64 lanes, capped at
 * 2^16 (a value past it lands outside every 1-byte range as the uncapped one does, and the cap fits int32). */
static inline __m256i qround(__m256i magnitude, const QScale8 *scale, int odd)
{
    __m256i lanes = odd ? _mm256_srli_epi64(magnitude, 32) : magnitude, cap = _mm256_set1_epi64x(1 << 16);
    __m256i product = _mm256_mul_epu32(lanes, scale->multiplier[odd]);
    __m256i rounded = _mm256_srlv_epi64(_mm256_add_epi64(product, scale->half[odd]), scale->shift[odd]);
    return _mm256_blendv_epi8(rounded, cap, _mm256_cmpgt_epi64(rounded, cap));
}

/* Eight channels' int32 sums of one pixel finished as qrequantize_one does and stored as 8 bytes. */
static inline void qfinish8(__m256i sums, const QScale8 *scale, __m256i zero_point, __m256i low, __m256i high,
                            int8_t *y)
{
    __m256i sum = _mm256_add_epi32(sums, scale->bias), magnitude = _mm256_abs_epi32(sum);
    __m256i rounded = _mm256_or_si256(qround(magnitude, scale, 0), _mm256_slli_epi64(qround(magnitude, scale, 1), 32));
    __m256i value = _mm256_add_epi32(_mm256_sign_epi32(rounded, sum), zero_point);
    value = _mm256_min_epi32(_mm256_max_epi32(value, low), high);
    __m256i bytes = _mm256_shuffle_epi8(value, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                -1, -1, -1, -1));
    _mm_storel_epi64((__m128i *)y, _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes),
                                                      _mm256_extracti128_si256(bytes, 1)));
}
#endif

/* One block of output channels as its register blocks read it: its packed weight, its first channel and, with
 * AVX2, the requantization of its whole vectors of channels. */
typedef struct {
    const char *slab;
    ptrdiff_t first;
#if defined(__AVX2__) && !defined(__AVX512F__)
    QScale8 scale[QBLOCK_VECS];
#endif
} QChannels;

static inline void qchannels(const QConv *c, const char *slab, ptrdiff_t first, ptrdiff_t vecs, QChannels *block)
{
    block->slab = slab;
    block->first = first;
#if defined(__AVX2__) && !defined(__AVX512F__)
    for (ptrdiff_t v = 0; v < vecs && first + (v + 1) * QLANES <= c->out_channels; v++)
        block->scale[v] = qscale8(c, first + v * QLANES);
#else
    (void)c;
    (void)vecs;
#endif
}

/* A register block's outputs from its accumulators acc[p][v]: PIXELS pixels from `pixel` on, VECS vectors of
 * channels from block->first. With AVX2 and 1-byte outputs, each whole vector of channels finishes every
 * pixel's outputs straight from the register with the block's requantization vectors (the per-pixel epilogue
 * through memory, its constants loaded and rearranged anew for each pixel, had taken half of a 64-channel 1x1
 * conv's time); the rest through qfinish. */
static inline __attribute__((always_inline)) void qfinish_block(const QConv *c, ptrdiff_t pixel,
                                                                const QChannels *block, const int PIXELS,
                                                                const int VECS, qvec acc[QPIXELS][QBLOCK_VECS])
{
    int32_t sums[QBLOCK_VECS * QLANES];
    ptrdiff_t out_channels = c->out_channels, first = block->first;
#if defined(__AVX2__) && !defined(__AVX512F__)
    if (c->out_bytes == 1) {
        __m256i zero_point = _mm256_set1_epi32((int32_t)c->zero_point), low = _mm256_set1_epi32((int32_t)c->low);
        __m256i high = _mm256_set1_epi32((int32_t)c->high);
        int8_t *y = (int8_t *)c->y + pixel * out_channels;
        QUNROLL for (int v = 0; v < VECS; v++) {
            ptrdiff_t o = first + v * QLANES;
            if (o + QLANES <= out_channels) {
                QUNROLL for (int p = 0; p < PIXELS; p++)
                    qfinish8(acc[p][v], &block->scale[v], zero_point, low, high, y + p * out_channels + o);
            } else {  /* the last vector's channels past out_channels are padding */
                QUNROLL for (int p = 0; p < PIXELS; p++) {
                    QSTORE(sums, acc[p][v]);
                    qfinish(c, pixel + p, o, out_channels - o, sums);
                }
            }
        }
        return;
    }
#endif
    ptrdiff_t count = out_channels - first < VECS * QLANES ? out_channels - first : VECS * QLANES;
    QUNROLL for (int p = 0; p < PIXELS; p++) {
        QUNROLL for (int v = 0; v < VECS; v++) QSTORE(sums + v * QLANES, acc[p][v]);
        qfinish(c, pixel + p, first, count, sums);
    }
}

/* A register block: PIXELS (<= QPIXELS) output pixels from `pixel` on (in (N * OH * OW) order: a block may
 * span output rows) times VECS vectors of channels from block->first. A group is the 4 bytes one multiply-add step
 * takes from each input pixel: 2 int16 inputs, or 4 uint8 ones. KIND##_block is inlined into one function
 * per (PIXELS, VECS) (KIND##_blocks), so the accumulators are registers. */
#define QBLOCK(KIND, XBYTES, MADD, SIZES)                                                                        \
    static inline __attribute__((always_inline)) void KIND##_block(const QConv *c, ptrdiff_t pixel,            \
                                                                   const QChannels *block, const int PIXELS,   \
                                                                   const int VECS)                             \
    {                                                                                                            \
        const char *slab = block->slab;                                                                          \
        qvec acc[QPIXELS][QBLOCK_VECS];                                                                          \
        QUNROLL for (int p = 0; p < PIXELS; p++) QUNROLL for (int v = 0; v < VECS; v++) acc[p][v] = QZERO();    \
        ptrdiff_t groups = c->channels * (XBYTES) / 4, width = VECS * QLANES, pixel_bytes = c->channels * (XBYTES); \
        const char *image[QPIXELS];                                                                              \
        ptrdiff_t top[QPIXELS], left[QPIXELS];                                                                   \
        ptrdiff_t ow = pixel % c->out_w, oh = pixel / c->out_w % c->out_h, n = pixel / c->out_w / c->out_h;     \
        QUNROLL for (int p = 0; p < PIXELS; p++) {                                                               \
            image[p] = (const char *)c->x + n * c->height * c->width * pixel_bytes;                              \
            top[p] = oh * c->stride_h - c->pad_top;                                                              \
            left[p] = ow * c->stride_w - c->pad_left;                                                            \
            if (++ow == c->out_w) {                                                                              \
                ow = 0;                                                                                          \
                if (++oh == c->out_h) {                                                                          \
                    oh = 0;                                                                                      \
                    n++;                                                                                         \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (ptrdiff_t kh = 0; kh < c->kernel_h; kh++) {                                                         \
            /* where every pixel's kernel row lies inside the input (undilated), its taps' inputs are one run of \
             * memory, as are their packed weights: one run of kernel_w * groups groups, else one per tap */     \
            ptrdiff_t ih = top[0] + kh * c->dilation_h;                                                          \
            int merged = c->dilation_w == 1;                                                                     \
            QUNROLL for (int p = 0; p < PIXELS; p++) {                                                           \
                ih = top[p] + kh * c->dilation_h;                                                                \
                merged &= ih >= 0 && ih < c->height && left[p] >= 0 && left[p] + c->kernel_w <= c->width;       \
            }                                                                                                    \
            ptrdiff_t runs = merged ? 1 : c->kernel_w, run_groups = merged ? c->kernel_w * groups : groups;      \
            for (ptrdiff_t kw = 0; kw < runs; kw++) {                                                            \
                const char *in[QPIXELS];                                                                         \
                QUNROLL for (int p = 0; p < PIXELS; p++) {                                                       \
                    ih = top[p] + kh * c->dilation_h;                                                            \
                    ptrdiff_t iw = left[p] + kw * c->dilation_w;                                                 \
                    in[p] = ih >= 0 && ih < c->height && iw >= 0 && iw < c->width                                \
                                ? image[p] + (ih * c->width + iw) * pixel_bytes                                  \
                                : (const char *)c->zeros;                                                        \
                }                                                                                                \
                const char *w = slab + (kh * c->kernel_w + kw) * groups * width * 4;                             \
                for (ptrdiff_t group = 0; group < run_groups; group++, w += width * 4) {                         \
                    qvec weights[QBLOCK_VECS];                                                                   \
                    QUNROLL for (int v = 0; v < VECS; v++) weights[v] = QLOAD(w + v * QLANES * 4);               \
                    QUNROLL for (int p = 0; p < PIXELS; p++) {                                                   \
                        qvec inputs = QBROADCAST(in[p] + 4 * group);                                             \
                        QUNROLL for (int v = 0; v < VECS; v++) acc[p][v] = MADD(acc[p][v], inputs, weights[v]);  \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        qfinish_block(c, pixel, block, PIXELS, VECS, acc);                                                       \
    }                                                                                                            \
    SIZES(QBLOCKS_OF, KIND)                                                                                      \
    static void (*const KIND##_blocks[][QBLOCK_VECS])(const QConv *, ptrdiff_t, const QChannels *) = {          \
        SIZES(QBLOCK_ROW, KIND)};                                                                                \
    static const ptrdiff_t KIND##_sizes[] = {SIZES(QPIXEL_SIZE)}; /* widest first, 1 last */
#define QBLOCKS_OF(PIXELS, KIND) QVEC_COUNTS(QBLOCK_OF, PIXELS, KIND)
#define QBLOCK_OF(VECS, PIXELS, KIND)                                                                            \
    static void KIND##_##PIXELS##x##VECS(const QConv *c, ptrdiff_t pixel, const QChannels *block)                \
    {                                                                                                            \
        KIND##_block(c, pixel, block, PIXELS, VECS);                                                             \
    }
#define QBLOCK_ROW(PIXELS, KIND) {QVEC_COUNTS(QBLOCK_ENTRY, PIXELS, KIND)},
#define QBLOCK_ENTRY(VECS, PIXELS, KIND) KIND##_##PIXELS##x##VECS,
#define QPIXEL_SIZE(PIXELS, ...) PIXELS,

/* Output rows row0 .. row1 - 1 of the (N * OH) rows (the unit the caller splits among threads), in tiles of
 * pixels whose inputs stay in the core's caches while every block of output channels reads them: in each tile,
 * for each block of output channels, its pixels in register blocks of the widest size that fits, then
 * narrower ones. */
#define QTILE_BYTES (128 << 10)
#define QCONV(NAME, KIND, XBYTES)                                                                                \
    void NAME(const QConv *c, ptrdiff_t row0, ptrdiff_t row1)                                                    \
    {                                                                                                            \
        ptrdiff_t slab_bytes = c->kernel_h * c->kernel_w * c->channels * (XBYTES); /* per output channel */     \
        ptrdiff_t tile = QTILE_BYTES / (c->channels * (XBYTES)) / QPIXELS * QPIXELS;                             \
        tile = tile > QPIXELS ? tile : QPIXELS;                                                                  \
        for (ptrdiff_t start = row0 * c->out_w; start < row1 * c->out_w; start += tile) {                        \
            ptrdiff_t end = start + tile < row1 * c->out_w ? start + tile : row1 * c->out_w;                     \
            for (ptrdiff_t first = 0; first < c->padded_channels; first += QBLOCK_VECS * QLANES) {               \
                ptrdiff_t vecs = (c->padded_channels - first) / QLANES;                                          \
                vecs = vecs < QBLOCK_VECS ? vecs : QBLOCK_VECS;                                                  \
                QChannels block;                                                                                 \
                qchannels(c, (const char *)c->weight + slab_bytes * first, first, vecs, &block);                 \
                ptrdiff_t pixel = start;                                                                         \
                for (size_t size = 0; size < sizeof KIND##_sizes / sizeof *KIND##_sizes; size++)                 \
                    for (; end - pixel >= KIND##_sizes[size]; pixel += KIND##_sizes[size])                       \
                        KIND##_blocks[size][vecs - 1](c, pixel, &block);                                         \
            }                                                                                                    \
        }                                                                                                        \
    }

QBLOCK(qblock, 2, QMADD, QPIXEL_SIZES)
QCONV(qconv2d_nhwc, qblock, 2)

/* u8 x s8 with VNNI's vpdpbusd: four products a step, twice vpdpwssd's. x holds uint8 values u, the padding
 * row a pad value p with u - p = q - zero_point for every input (int8 storage: u = q + 128, p = zero_point +
 * 128; uint8: u = q, p = zero_point), so sum (u - p) w is the conv; the caller folds - p sum w into the bias.
 * The packed weight's groups are int8 quads of input channels (channels a multiple of 4): a slab has the
 * int16 path's bytes. The sums of u w must stay below 2^31 (the caller checks 255 sum |w| + |bias|). */
#if defined(__AVX512VNNI__)
#define QMADD_U8(acc, x, w) _mm512_dpbusd_epi32((acc), (x), (w))
QBLOCK(qblock_u8, 1, QMADD_U8, QPIXEL_SIZES)
QCONV(qconv2d_u8_nhwc, qblock_u8, 1)
int qconv_u8_available(void) { return 1; }
#else
void qconv2d_u8_nhwc(const QConv *c, ptrdiff_t row0, ptrdiff_t row1) { (void)c; (void)row0; (void)row1; }
int qconv_u8_available(void) { return 0; }
#endif

/* AVX2 without VNNI: qconv2d_u8s7_nhwc, over the same quads as qconv2d_u8_nhwc (uint8 inputs u, a pad row,
 * int8 weight quads; the caller folds - p sum w into the bias). vpmaddubsw multiplies 32 unsigned bytes by 32
 * signed ones and adds adjacent products into 16 int16 lanes, saturating; vpmaddwd by ones widens each lane's
 * two int16 into the int32 accumulator. No pair can saturate where every weight lies in [-64, 64]
 * (2 * 255 * 64 = 32640 < 32767): the caller runs this kernel only then (7-bit weights, or narrower), the
 * int16 pairs otherwise. 2 multiplies per 32 products, as vpmaddwd's 1 per 16, but half the bytes of inputs
 * and weights to load and fewer adds: about 1.2x the pairs' speed on a Zen 3 EPYC (docs/design.md). With
 * 12 accumulators the ones and a temporary spill: 4 x 2 register blocks. */
#if defined(__AVX2__) && !defined(__AVX512F__)
static inline qvec qmadd_u8s7(qvec acc, qvec x, qvec w)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), _mm256_set1_epi16(1)));
}
#define QBYTE_SIZES(X, ...) X(4, __VA_ARGS__) X(2, __VA_ARGS__) X(1, __VA_ARGS__)
QBLOCK(qblock_u8s7, 1, qmadd_u8s7, QBYTE_SIZES)
QCONV(qconv2d_u8s7_nhwc, qblock_u8s7, 1)
int qconv_u8s7_available(void) { return 1; }
#else
void qconv2d_u8s7_nhwc(const QConv *c, ptrdiff_t row0, ptrdiff_t row1) { (void)c; (void)row0; (void)row1; }
int qconv_u8s7_available(void) { return 0; }
#endif

/* The number of int32 lanes of this build's vectors: the packed weight's unit of output channels. */
ptrdiff_t qconv_lanes(void) { return QLANES; }

/* The number of vectors of output channels in a packed weight block (the last block may have fewer). */
ptrdiff_t qconv_block_vectors(void) { return QBLOCK_VECS; }

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
