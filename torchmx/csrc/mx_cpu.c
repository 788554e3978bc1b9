/*
 * CPU fast path of torchmx's MX quantize / dequantize, bit-identical to the reference
 * numerics in torchmx/numerics (tests/kernels/quantize/test_cpu_backend.py holds every option to that).
 *
 * Plain C99 with no dependency: torchmx compiles it on first use with the system compiler and
 * calls it through ctypes, which releases the GIL, so Python threads split the rows. Build
 * without -ffast-math: the arithmetic below relies on exact IEEE fp32 operations.
 *
 * Layout: the input is a contiguous [outer, n, inner] tensor whose middle axis is the block
 * axis; a "row" is one (outer, inner) pair, i.e. the n elements of one line along that axis.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

/* encode_block must be inlined into each `case` so that its rounding mode is a constant. */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

enum { IN_F32 = 0, IN_BF16 = 1, IN_F16 = 2 };
enum { SCALE_FLOOR = 0, SCALE_CEIL = 1, SCALE_EVEN = 2, SCALE_RCEIL = 3 };
enum { ROUND_EVEN = 0, ROUND_AWAY = 1, ROUND_TOWARD_ZERO = 2, ROUND_TRUNC = 3, ROUND_STOCHASTIC = 4 };

typedef struct {
    int32_t is_int;         /* MXINT8 */
    int32_t bits;           /* code width */
    int32_t mantissa_bits;
    int32_t min_exponent;   /* 1 - bias */
    int32_t emax;
    int32_t max_code;       /* largest finite code magnitude */
    float max_normal;
    int32_t codes_per_group;
    int32_t bytes_per_group;
} Format;

/* A block longer than the row is one block of n elements: same scales, same codes. Clamping
 * first keeps every index below in range for any block_size up to 2**63 - 1. */
static inline int64_t effective_block_size(int64_t block_size, int64_t n) {
    return block_size < n ? block_size : (n > 0 ? n : 1);
}

/* ceil(n / block_size) without forming n + block_size - 1 (which overflows int64). */
static inline int64_t block_count(int64_t n, int64_t block_size) {
    return n / block_size + (n % block_size != 0);
}

static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* 2**e as fp32, exact for e in [-149, 127] (2**-127 is a subnormal, built from its bits). */
static inline float exact_pow2(int32_t e) {
    return e >= -126 ? bits_f32((uint32_t)(e + 127) << 23) : bits_f32(1u << (e + 149));
}

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    if (exponent == 0x1F) return bits_f32(sign | 0x7F800000u | (mantissa << 13));
    if (exponent == 0) {  /* zero or subnormal: mantissa * 2**-24, exact in fp32 */
        float v = (float)mantissa * exact_pow2(-24);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/* Convert one row (n elements, `inner` apart) to fp32; one loop per input dtype. */
static void load_row(const void *src, int dtype, int64_t base, int64_t n, int64_t inner, float *out) {
    if (dtype == IN_F32) {
        const float *p = (const float *)src + base;
        for (int64_t i = 0; i < n; i++) out[i] = p[i * inner];
    } else if (dtype == IN_BF16) {
        const uint16_t *p = (const uint16_t *)src + base;
        for (int64_t i = 0; i < n; i++) out[i] = bits_f32((uint32_t)p[i * inner] << 16);
    } else {
        const uint16_t *p = (const uint16_t *)src + base;
        for (int64_t i = 0; i < n; i++) out[i] = half_to_float(p[i * inner]);
    }
}

/* floor(log2 x) of a positive finite fp32, exact for subnormals (read in float64). */
static inline int32_t floor_log2(float x) {
    double d = (double)x; uint64_t u; memcpy(&u, &d, 8);
    return (int32_t)((u >> 52) & 0x7FF) - 1023;
}

static inline int32_t ceil_log2(float x) {
    double d = (double)x; uint64_t u; memcpy(&u, &d, 8);
    return floor_log2(x) + ((u & ((1ull << 52) - 1)) != 0);
}

/* E8M0 byte of a block with fp32 amax (NaN when the block holds NaN or Inf). */
static uint8_t scale_byte(float amax, const Format *f, int scale_mode) {
    if (!(amax <= 3.4028234663852886e38f)) return 255;  /* NaN or Inf */
    if (amax == 0.0f) return 0;
    int32_t e;
    if (scale_mode == SCALE_FLOOR) {
        e = floor_log2(amax) - f->emax;
    } else if (scale_mode == SCALE_CEIL) {
        e = ceil_log2(amax) - f->emax;
    } else if (scale_mode == SCALE_EVEN) {
        int64_t rounded = ((int64_t)f32_bits(amax) + (1 << (22 - f->mantissa_bits))) & 0xFF800000ll;
        e = (int32_t)(rounded >> 23) - 127 - f->emax;
    } else {
        float d = amax / f->max_normal;  /* IEEE round-to-nearest-even division */
        e = d > 0.0f ? ceil_log2(d) : -127;
    }
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    return (uint8_t)(e + 127);
}

static inline uint32_t mix32(uint32_t h) {
    h = ((h >> 16) ^ h) * 0x45D9F3Bu;
    h = ((h >> 16) ^ h) * 0x45D9F3Bu;
    return (h >> 16) ^ h;
}

static inline float uniform_from_index(uint32_t key, int64_t index) {
    uint32_t h = mix32(mix32((uint32_t)index ^ key) ^ (uint32_t)((uint64_t)index >> 32));
    return (float)(h >> 8) * exact_pow2(-24);
}

/* Whether rounding moves t = low + fraction up to low + 1 (t >= 0). */
static ALWAYS_INLINE int32_t round_up(float fraction, int32_t low, int rounding, float uniform) {
    if (rounding == ROUND_EVEN) return fraction > 0.5f || (fraction == 0.5f && (low & 1));
    if (rounding == ROUND_AWAY) return fraction >= 0.5f;
    if (rounding == ROUND_TOWARD_ZERO) return fraction > 0.5f;
    if (rounding == ROUND_TRUNC) return 0;
    return uniform < fraction;
}

/*
 * Encode `count` values x[i] * inverse_scale[i] (exact: power-of-two scalings) into codes.
 * These two loops are inlined with a literal `rounding` so each mode gets its own branch-free,
 * vectorizable loop. t < 2**31 always holds (|y| < 2**(emax + 1)), so (int32_t)t is floor(t).
 */
static ALWAYS_INLINE void encode_float_values(const float *restrict x, int64_t count,
                                             const float *restrict inverse_scale, const Format *f,
                                             int rounding,
                                             uint32_t key, int64_t first_index,
                                             int64_t index_stride, uint8_t *restrict codes) {
    /* Locals, not f->...: the byte stores below may alias *f as far as the compiler knows. */
    const int32_t m = f->mantissa_bits, emin = f->min_exponent, max_code = f->max_code;
    const int32_t sign_shift = f->bits - 1;
    for (int64_t i = 0; i < count; i++) {
        uint32_t yb = f32_bits(x[i] * inverse_scale[i]);
        uint32_t magnitude_bits = yb & 0x7FFFFFFFu;
        int32_t exponent = (int32_t)(magnitude_bits >> 23) - 127;
        exponent = exponent < emin ? emin : exponent;
        float t = bits_f32(magnitude_bits) * bits_f32((uint32_t)(m - exponent + 127) << 23);
        int32_t low = (int32_t)t;
        float uniform = rounding == ROUND_STOCHASTIC
                        ? uniform_from_index(key, first_index + i * index_stride) : 0.0f;
        int32_t code = ((exponent - emin) << m) + low + round_up(t - (float)low, low, rounding, uniform);
        code = code > max_code ? max_code : code;
        codes[i] = (uint8_t)(code | (int32_t)((yb >> 31) << sign_shift));
    }
}

static ALWAYS_INLINE void encode_int_values(const float *restrict x, int64_t count,
                                           const float *restrict inverse_scale, const Format *f,
                                           int rounding,
                                           uint32_t key, int64_t first_index,
                                           int64_t index_stride, uint8_t *restrict codes) {
    const float steps_per_unit = (float)(1 << f->mantissa_bits);
    const int32_t max_code = f->max_code;
    for (int64_t i = 0; i < count; i++) {
        float y = x[i] * inverse_scale[i];
        float t = fabsf(y) * steps_per_unit;
        int32_t low = (int32_t)t;
        float uniform = rounding == ROUND_STOCHASTIC
                        ? uniform_from_index(key, first_index + i * index_stride) : 0.0f;
        int32_t code = low + round_up(t - (float)low, low, rounding, uniform);
        code = code > max_code ? max_code : code;
        codes[i] = (uint8_t)(signbit(y) ? -code : code);  /* two's complement byte */
    }
}

static void encode_row(const float *x, int64_t count, const float *inverse_scale, const Format *f,
                         int rounding, uint32_t key, int64_t first_index, int64_t index_stride,
                         uint8_t *codes) {
#define ENCODE_CASE(MODE)                                                                      \
    case MODE:                                                                                 \
        if (f->is_int)                                                                         \
            encode_int_values(x, count, inverse_scale, f, MODE, key, first_index, index_stride, codes);   \
        else                                                                                   \
            encode_float_values(x, count, inverse_scale, f, MODE, key, first_index, index_stride, codes); \
        break;
    switch (rounding) {
        ENCODE_CASE(ROUND_EVEN)
        ENCODE_CASE(ROUND_AWAY)
        ENCODE_CASE(ROUND_TOWARD_ZERO)
        ENCODE_CASE(ROUND_TRUNC)
        ENCODE_CASE(ROUND_STOCHASTIC)
    }
#undef ENCODE_CASE
}

/* Write n codes of one row into packed bytes `inner` apart (layout: see packing.py). */
static void pack_row(const uint8_t *codes, int64_t n, const Format *f, uint8_t *out, int64_t inner) {
    if (f->codes_per_group == 1) {
        for (int64_t i = 0; i < n; i++) out[i * inner] = codes[i];
    } else if (f->codes_per_group == 2) {  /* 4-bit: element 2i in the low nibble */
        for (int64_t g = 0; g < n / 2; g++)
            out[g * inner] = (uint8_t)(codes[2 * g] | codes[2 * g + 1] << 4);
        if (n % 2) out[(n / 2) * inner] = codes[n - 1];
    } else {  /* 6-bit: 4 codes in 3 bytes, little-endian bitstream */
        for (int64_t g = 0; g * 4 < n; g++) {
            uint32_t word = 0;
            for (int32_t c = 0; c < 4 && 4 * g + c < n; c++) word |= (uint32_t)codes[4 * g + c] << (6 * c);
            out[(3 * g) * inner] = (uint8_t)word;
            out[(3 * g + 1) * inner] = (uint8_t)(word >> 8);
            out[(3 * g + 2) * inner] = (uint8_t)(word >> 16);
        }
    }
}

/*
 * Quantize rows [row_begin, row_end) of a contiguous [outer, n, inner] input.
 * scale_out: [outer, ceil(n / block_size), inner]; data_out: [outer, packed_length, inner];
 * scratch: 2n floats and n bytes for this call.
 */
void mx_quantize_rows(const void *src, int in_dtype, int64_t n, int64_t inner,
                      int64_t row_begin, int64_t row_end, const Format *f, int64_t block_size,
                      int scale_mode, int rounding, uint32_t seed_key,
                      uint8_t *scale_out, uint8_t *data_out, float *scratch, uint8_t *codes) {
    block_size = effective_block_size(block_size, n);
    int64_t blocks = block_count(n, block_size);
    int64_t packed = (n + f->codes_per_group - 1) / f->codes_per_group * f->bytes_per_group;
    float *values = scratch, *inverse_scale = scratch + n;
    for (int64_t row = row_begin; row < row_end; row++) {
        int64_t o = row / inner, k = row % inner;
        int64_t base = o * n * inner + k;
        load_row(src, in_dtype, base, n, inner, values);
        for (int64_t j = 0; j < blocks; j++) {
            int64_t begin = j * block_size, count = n - begin < block_size ? n - begin : block_size;
            uint32_t amax_bits = 0;  /* |x| bits order like |x|; NaN and Inf sort above finite */
            for (int64_t i = begin; i < begin + count; i++) {
                uint32_t a = f32_bits(values[i]) & 0x7FFFFFFFu;
                amax_bits = a > amax_bits ? a : amax_bits;
            }
            uint8_t b = amax_bits >= 0x7F800000u ? 255 : scale_byte(bits_f32(amax_bits), f, scale_mode);
            scale_out[(o * blocks + j) * inner + k] = b;
            float inverse = exact_pow2(127 - (int32_t)b);
            if (b == 255) {  /* elements of a NaN-scale block are stored as code 0 */
                inverse = 0.0f;
                memset(values + begin, 0, (size_t)count * sizeof(float));
            }
            for (int64_t i = begin; i < begin + count; i++) inverse_scale[i] = inverse;
        }
        encode_row(values, n, inverse_scale, f, rounding, seed_key, base, inner, codes);
        pack_row(codes, n, f, data_out + o * packed * inner + k, inner);
    }
}

/* Read n codes of one row from packed bytes `inner` apart (inverse of pack_row). */
static void unpack_row(const uint8_t *data, int64_t n, const Format *f, int64_t inner, uint8_t *codes) {
    if (f->codes_per_group == 1) {
        /* Bits above the format's width are ignored (as in the reference's unpack_codes): a
         * code indexes a table of 2**bits entries. */
        const uint8_t mask = (uint8_t)((1u << f->bits) - 1);
        for (int64_t i = 0; i < n; i++) codes[i] = data[i * inner] & mask;
    } else if (f->codes_per_group == 2) {  /* 4-bit: element 2i in the low nibble */
        for (int64_t g = 0; g < n / 2; g++) {
            uint8_t byte = data[g * inner];
            codes[2 * g] = byte & 0xF;
            codes[2 * g + 1] = byte >> 4;
        }
        if (n % 2) codes[n - 1] = data[(n / 2) * inner] & 0xF;
    } else {  /* 6-bit: 4 codes in 3 bytes, little-endian bitstream */
        for (int64_t g = 0; g * 4 < n; g++) {
            uint32_t word = (uint32_t)data[(3 * g) * inner] | (uint32_t)data[(3 * g + 1) * inner] << 8
                            | (uint32_t)data[(3 * g + 2) * inner] << 16;
            for (int32_t c = 0; c < 4 && 4 * g + c < n; c++) codes[4 * g + c] = (word >> (6 * c)) & 0x3F;
        }
    }
}

/*
 * Dequantize rows [row_begin, row_end): out = table[scale_byte][code], where the table (built
 * by the reference numerics) already holds decode(code) * 2**(b - 127) rounded once to the
 * output dtype (element_bytes 4 or 2). scratch: n bytes for this call.
 */
void mx_dequantize_rows(const uint8_t *data, const uint8_t *scale, int64_t n, int64_t inner,
                        int64_t row_begin, int64_t row_end, const Format *f, int64_t block_size,
                        const void *table, int64_t table_codes, int element_bytes, void *out,
                        uint8_t *codes) {
    block_size = effective_block_size(block_size, n);
    int64_t blocks = block_count(n, block_size);
    int64_t packed = (n + f->codes_per_group - 1) / f->codes_per_group * f->bytes_per_group;
    for (int64_t row = row_begin; row < row_end; row++) {
        int64_t o = row / inner, k = row % inner;
        unpack_row(data + o * packed * inner + k, n, f, inner, codes);
        for (int64_t j = 0; j < blocks; j++) {
            int64_t begin = j * block_size, count = n - begin < block_size ? n - begin : block_size;
            int64_t entry = (int64_t)scale[(o * blocks + j) * inner + k] * table_codes;
            int64_t first = (o * n + begin) * inner + k;
            const uint8_t *c = codes + begin;
            if (element_bytes == 4) {
                const uint32_t *t = (const uint32_t *)table + entry;
                uint32_t *dst = (uint32_t *)out + first;
                for (int64_t i = 0; i < count; i++) dst[i * inner] = t[c[i]];
            } else {
                const uint16_t *t = (const uint16_t *)table + entry;
                uint16_t *dst = (uint16_t *)out + first;
                for (int64_t i = 0; i < count; i++) dst[i * inner] = t[c[i]];
            }
        }
    }
}
