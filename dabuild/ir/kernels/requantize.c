/* The integer reference's requantization of a weighted layer's sums, as dabuild.qir.fixed_point computes it.
 *
 * acc holds exact integer sums (as doubles) in memory seen as (outer, channels, inner), contiguous. Each value
 * becomes clamp(round_half_away((acc + bias[c]) * multiplier[c] / 2^shift[c]) + zero_point, low, high), the
 * rounding done on the magnitude in int64 with the sign put back, exactly as fixed_point.requantize does it.
 * Returns 0, or 1 without finishing when some |acc + bias| * multiplier could leave int64 (the caller then
 * takes the arbitrary-precision path).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int requantize_channels(const double *acc, ptrdiff_t outer, ptrdiff_t channels, ptrdiff_t inner, const int64_t *bias,
                        const int64_t *multiplier, const int64_t *shift, ptrdiff_t per_channel, int64_t zero_point,
                        int64_t low, int64_t high, int32_t *y)
{
    /* per channel: multiplier, shift, rounding half, bias, and the largest magnitude whose product fits */
    int64_t *table = malloc(5 * channels * sizeof *table);
    if (!table)
        return 1;
    int64_t *m = table, *s = table + channels, *half = table + 2 * channels, *b = table + 3 * channels;
    int64_t *limit = table + 4 * channels;
    for (ptrdiff_t c = 0; c < channels; c++) {
        ptrdiff_t k = per_channel ? c : 0;
        m[c] = multiplier[k];
        s[c] = shift[k];
        half[c] = (int64_t)1 << (s[c] - 1);
        b[c] = bias[c];
        limit[c] = (INT64_MAX - half[c]) / (m[c] > 0 ? m[c] : 1);
    }
    int failed = 0;
    for (ptrdiff_t o = 0; o < outer && !failed; o++)
        for (ptrdiff_t c = 0; c < channels; c++) {
            const double *a = acc + (o * channels + c) * inner;
            int32_t *out = y + (o * channels + c) * inner;
            for (ptrdiff_t i = 0; i < inner; i++) {
                int64_t sum = (int64_t)a[i] + b[c];  /* |a| < 2^53: exact, checked below */
                int64_t magnitude = sum < 0 ? -sum : sum;
                failed |= !(a[i] > -9.0e15 && a[i] < 9.0e15) || magnitude > limit[c];
                int64_t rounded = (magnitude * m[c] + half[c]) >> s[c];
                int64_t value = (sum < 0 ? -rounded : rounded) + zero_point;
                out[i] = (int32_t)(value < low ? low : value > high ? high : value);
            }
        }
    free(table);
    return failed;
}
