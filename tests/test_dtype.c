/* Dtype helpers and the float <-> bf16 / f16 conversions (SEMANTICS section 4, moe.h "Conversions").
 *
 * Every expectation is computed independently of src/dtype.c: 16-bit patterns are decoded with ldexp
 * from their fields, and float -> 16-bit rounding is done in double (scale by the target ulp, round with
 * nearbyint, which is round-half-to-even in the default rounding mode, scale back).
 *
 *   - exhaustive over all 65536 patterns of both formats: decode is exact, 16 -> 32 -> 16 is the
 *     identity for non-NaN patterns, NaN stays a quiet NaN;
 *   - exhaustive over every halfway point between neighbouring patterns (ties to even) and the floats
 *     one ulp either side of it;
 *   - random floats (all bit patterns, and ones concentrated in the f16 range) and a strided sweep over
 *     all 2^32 float patterns;
 *   - named special cases: f16 subnormals, overflow (65520 -> Inf, 65519.99 -> 65504), signed zero, Inf,
 *     signalling and quiet NaN;
 *   - moe_dtype_size, moe_dtype_name, moe_dtype_unit_roundoff, including unknown dtype values;
 *   - moe_dtype_from_name: names, aliases, non-names and NULLs.
 *
 * Usage: test_dtype [seed] */
#include "moe.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- independent models of the two 16-bit formats ---- */

typedef struct format {
    const char *name;
    int mantissa_bits; /* stored fraction bits: 7 (bf16), 10 (f16) */
    int exponent_bits; /* 8 (bf16), 5 (f16) */
    uint16_t (*to16)(float);
    float (*to32)(uint16_t);
} format;

static const format BF16 = {"bf16", 7, 8, moe_f32_to_bf16, moe_bf16_to_f32};
static const format F16 = {"f16", 10, 5, moe_f32_to_f16, moe_f16_to_f32};

static int bias_of(const format *f) { return (1 << (f->exponent_bits - 1)) - 1; }
static int max_exponent_field(const format *f) { return (1 << f->exponent_bits) - 1; }

static int is_nan16(const format *f, uint16_t h)
{
    int exponent = (h >> f->mantissa_bits) & max_exponent_field(f);
    return exponent == max_exponent_field(f) && (h & ((1u << f->mantissa_bits) - 1)) != 0;
}

/* The value of a 16-bit pattern from its fields (NaN for NaN patterns). */
static double decode16(const format *f, uint16_t h)
{
    const int sign = h >> 15;
    const int exponent = (h >> f->mantissa_bits) & max_exponent_field(f);
    const uint32_t mantissa = h & ((1u << f->mantissa_bits) - 1);
    double magnitude;
    if (exponent == max_exponent_field(f))
        magnitude = mantissa ? NAN : INFINITY;
    else if (exponent == 0)
        magnitude = ldexp((double)mantissa, 1 - bias_of(f) - f->mantissa_bits);
    else
        magnitude = ldexp((double)((1u << f->mantissa_bits) | mantissa), exponent - bias_of(f) - f->mantissa_bits);
    return sign ? -magnitude : magnitude;
}

/* Round a finite double (exactly a float) to the format, nearest even, overflow to Inf; result as double. */
static double round_to_format(const format *f, double v)
{
    if (v == 0.0 || isinf(v) || isnan(v))
        return v;
    int exponent; /* v = m * 2^exponent with 0.5 <= |m| < 1 */
    frexp(v, &exponent);
    exponent -= 1; /* 2^exponent <= |v| < 2^(exponent+1) */
    const int min_normal_exponent = 1 - bias_of(f);
    if (exponent < min_normal_exponent)
        exponent = min_normal_exponent;
    const int ulp_exponent = exponent - f->mantissa_bits;
    double q = ldexp(v, -ulp_exponent); /* exact: v has at most 24 significant bits */
    double r = ldexp(nearbyint(q), ulp_exponent);
    /* largest finite magnitude: (2 - 2^-p) * 2^emax; anything that rounds past it is Inf */
    const int max_exponent = max_exponent_field(f) - 1 - bias_of(f);
    const double largest = ldexp(2.0 - ldexp(1.0, -f->mantissa_bits), max_exponent);
    if (fabs(r) > largest)
        return v < 0 ? -INFINITY : INFINITY;
    if (r == 0.0)
        return copysign(0.0, v);
    return r;
}

static float bits_to_float(uint32_t bits)
{
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static uint32_t float_to_bits(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

static int same_value(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

/* Checks one float -> 16-bit conversion against the double model. */
static void check_down(const format *f, float value)
{
    const uint16_t got = f->to16(value);
    const uint32_t in_bits = float_to_bits(value);
    if (isnan(value)) {
        const uint16_t quiet = (uint16_t)(1u << (f->mantissa_bits - 1));
        CHECK(is_nan16(f, got) && (got & quiet), "%s(0x%08x NaN) = 0x%04x, expected a quiet NaN", f->name,
              (unsigned)in_bits, (unsigned)got);
        return;
    }
    const double want = round_to_format(f, (double)value);
    const double have = decode16(f, got);
    CHECK(same_value(have, want), "to_%s(%.9g = 0x%08x) = 0x%04x (%.9g), expected %.9g", f->name, (double)value,
          (unsigned)in_bits, (unsigned)got, have, want);
}

/* All 65536 patterns: decode, round trip, NaN handling. */
static void exhaustive_patterns(const format *f)
{
    long nan_count = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        const float up = f->to32(h);
        const double want = decode16(f, h);
        if (is_nan16(f, h)) {
            nan_count++;
            CHECK(isnan(up), "%s_to_f32(0x%04x) = %g, expected NaN", f->name, (unsigned)h, (double)up);
            const uint16_t back = f->to16(up);
            CHECK(is_nan16(f, back), "%s 0x%04x -> %g -> 0x%04x, expected NaN to stay NaN", f->name, (unsigned)h,
                  (double)up, (unsigned)back);
            continue;
        }
        CHECK(same_value((double)up, want), "%s_to_f32(0x%04x) = %.9g (0x%08x), expected %.9g", f->name,
              (unsigned)h, (double)up, (unsigned)float_to_bits(up), want);
        const uint16_t back = f->to16(up);
        CHECK(back == h, "%s round trip 0x%04x -> %.9g -> 0x%04x", f->name, (unsigned)h, (double)up,
              (unsigned)back);
    }
    const long expected_nans = 2L * ((1L << f->mantissa_bits) - 1);
    CHECK(nan_count == expected_nans, "%s: %ld NaN patterns, expected %ld", f->name, nan_count, expected_nans);
}

/* Every midpoint between neighbouring finite patterns of one sign (ties to even), and the floats just
 * below and just above it. The midpoint past the largest finite value rounds to Inf. */
static void halfway_cases(const format *f)
{
    const uint16_t inf_bits = (uint16_t)(max_exponent_field(f) << f->mantissa_bits);
    for (int sign = 0; sign < 2; sign++) {
        const uint16_t s = sign ? 0x8000 : 0;
        for (uint16_t h = 0; h < inf_bits; h++) {
            const double lo = decode16(f, (uint16_t)(s | h));
            const double hi = (h + 1 == inf_bits) ? (sign ? -1.0 : 1.0) * ldexp(1.0, max_exponent_field(f) - bias_of(f))
                                                  : decode16(f, (uint16_t)(s | (h + 1)));
            const double mid = 0.5 * (lo + hi);
            const float midf = (float)mid;
            CHECK((double)midf == mid, "%s midpoint of 0x%04x not a float", f->name, (unsigned)(s | h));
            /* ties to even: the pattern with an even last bit; h+1 == inf_bits is even and means Inf */
            const uint16_t want = (uint16_t)(s | ((h & 1) ? h + 1 : h));
            const uint16_t got = f->to16(midf);
            CHECK(got == want, "to_%s(halfway %.9g = 0x%08x between 0x%04x and 0x%04x) = 0x%04x, expected 0x%04x",
                  f->name, mid, (unsigned)float_to_bits(midf), (unsigned)(s | h), (unsigned)(s | (h + 1)),
                  (unsigned)got, (unsigned)want);
            /* one float ulp towards lo rounds to lo, towards hi to hi */
            const float below = nextafterf(midf, (float)lo), above = nextafterf(midf, (float)hi);
            const uint16_t got_below = f->to16(below), got_above = f->to16(above);
            CHECK(got_below == (uint16_t)(s | h), "to_%s(%.9g = 0x%08x, just inside 0x%04x) = 0x%04x", f->name,
                  (double)below, (unsigned)float_to_bits(below), (unsigned)(s | h), (unsigned)got_below);
            CHECK(got_above == (uint16_t)(s | (h + 1)), "to_%s(%.9g = 0x%08x, just inside 0x%04x) = 0x%04x",
                  f->name, (double)above, (unsigned)float_to_bits(above), (unsigned)(s | (h + 1)),
                  (unsigned)got_above);
            check_down(f, midf);
            check_down(f, below);
            check_down(f, above);
        }
    }
}

static uint64_t rng_state;
static uint64_t next_random(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void random_floats(const format *f, long count)
{
    for (long i = 0; i < count; i++) {
        const uint64_t r = next_random();
        /* any float bit pattern */
        check_down(f, bits_to_float((uint32_t)r));
        /* a float whose exponent lies in (or just around) the 16-bit format's range */
        const int span = f == &F16 ? 50 : 280; /* f16: 2^-35 .. 2^15; bf16: the whole float range */
        const int low = f == &F16 ? 127 - 35 : 0;
        uint32_t exponent = (uint32_t)(low + (int)((r >> 32) % (uint64_t)span));
        if (exponent > 254)
            exponent = (uint32_t)((r >> 40) % 255);
        const uint32_t bits = (uint32_t)((r >> 63) << 31) | (exponent << 23) | (uint32_t)(r & 0x7fffff);
        check_down(f, bits_to_float(bits));
    }
}

/* Every float bit pattern with a stride coprime to 2^32: ~17 million floats of every class. */
static void strided_sweep(const format *f)
{
    const uint32_t stride = 251;
    uint32_t bits = 0;
    do {
        check_down(f, bits_to_float(bits));
        bits += stride;
    } while (bits >= stride);
}

static void named_cases(void)
{
    /* f16 overflow threshold: 65504 is the largest finite, 65520 the halfway point to 2^16 */
    CHECK(moe_f32_to_f16(65520.0f) == 0x7c00, "to_f16(65520) = 0x%04x, expected Inf 0x7c00",
          (unsigned)moe_f32_to_f16(65520.0f));
    CHECK(moe_f32_to_f16(-65520.0f) == 0xfc00, "to_f16(-65520) = 0x%04x, expected -Inf 0xfc00",
          (unsigned)moe_f32_to_f16(-65520.0f));
    CHECK(moe_f32_to_f16(65519.99f) == 0x7bff, "to_f16(65519.99) = 0x%04x, expected 65504 0x7bff",
          (unsigned)moe_f32_to_f16(65519.99f));
    CHECK(moe_f32_to_f16(65504.0f) == 0x7bff, "to_f16(65504) = 0x%04x", (unsigned)moe_f32_to_f16(65504.0f));
    CHECK(moe_f32_to_f16(1e10f) == 0x7c00, "to_f16(1e10) = 0x%04x", (unsigned)moe_f32_to_f16(1e10f));
    CHECK(moe_f32_to_f16(3.4028235e38f) == 0x7c00, "to_f16(FLT_MAX) = 0x%04x",
          (unsigned)moe_f32_to_f16(3.4028235e38f));
    CHECK(moe_f32_to_bf16(3.4028235e38f) == 0x7f80, "to_bf16(FLT_MAX) = 0x%04x, expected Inf",
          (unsigned)moe_f32_to_bf16(3.4028235e38f));
    CHECK(moe_f32_to_bf16(-3.4028235e38f) == 0xff80, "to_bf16(-FLT_MAX) = 0x%04x, expected -Inf",
          (unsigned)moe_f32_to_bf16(-3.4028235e38f));
    CHECK(moe_f32_to_bf16(0x1.fep127f) == 0x7f7f, "to_bf16(0x1.fep127) = 0x%04x",
          (unsigned)moe_f32_to_bf16(0x1.fep127f));
    CHECK(moe_f32_to_bf16(0x1.ffp127f) == 0x7f80, "to_bf16(0x1.ffp127, halfway to 2^128) = 0x%04x, expected Inf",
          (unsigned)moe_f32_to_bf16(0x1.ffp127f));
    CHECK(moe_f32_to_bf16(0x1.fefffep127f) == 0x7f7f, "to_bf16(0x1.fefffep127) = 0x%04x",
          (unsigned)moe_f32_to_bf16(0x1.fefffep127f));

    /* f16 subnormals: 2^-24 is the smallest, 2^-25 ties to 0, 3*2^-25 ties to 2*2^-24 */
    CHECK(moe_f32_to_f16(0x1p-24f) == 0x0001, "to_f16(2^-24) = 0x%04x", (unsigned)moe_f32_to_f16(0x1p-24f));
    CHECK(moe_f32_to_f16(0x1p-25f) == 0x0000, "to_f16(2^-25) = 0x%04x, expected 0 (tie to even)",
          (unsigned)moe_f32_to_f16(0x1p-25f));
    CHECK(moe_f32_to_f16(-0x1p-25f) == 0x8000, "to_f16(-2^-25) = 0x%04x, expected -0",
          (unsigned)moe_f32_to_f16(-0x1p-25f));
    CHECK(moe_f32_to_f16(0x1.000002p-25f) == 0x0001, "to_f16(just above 2^-25) = 0x%04x",
          (unsigned)moe_f32_to_f16(0x1.000002p-25f));
    CHECK(moe_f32_to_f16(0x1.8p-24f) == 0x0002, "to_f16(3*2^-25) = 0x%04x, expected 0x0002",
          (unsigned)moe_f32_to_f16(0x1.8p-24f));
    CHECK(moe_f32_to_f16(0x1.ffcp-15f) == 0x0400, "to_f16(2^-14 - 2^-25, tie) = 0x%04x, expected 0x0400",
          (unsigned)moe_f32_to_f16(0x1.ffcp-15f));
    CHECK(moe_f32_to_f16(0x1.ff8p-15f) == 0x03ff, "to_f16(largest subnormal) = 0x%04x",
          (unsigned)moe_f32_to_f16(0x1.ff8p-15f));
    CHECK(moe_f32_to_f16(0x1.ff4p-15f) == 0x03fe, "to_f16(1022.5 * 2^-24, tie) = 0x%04x, expected 0x03fe",
          (unsigned)moe_f32_to_f16(0x1.ff4p-15f));
    CHECK(moe_f32_to_f16(0x1p-14f) == 0x0400, "to_f16(2^-14) = 0x%04x", (unsigned)moe_f32_to_f16(0x1p-14f));
    CHECK(moe_f16_to_f32(0x0001) == 0x1p-24f, "f16_to_f32(0x0001) = %g", (double)moe_f16_to_f32(0x0001));
    CHECK(moe_f16_to_f32(0x03ff) == 0x1.ff8p-15f, "f16_to_f32(0x03ff) = %a", (double)moe_f16_to_f32(0x03ff));
    CHECK(moe_f16_to_f32(0x8001) == -0x1p-24f, "f16_to_f32(0x8001) = %g", (double)moe_f16_to_f32(0x8001));
    /* float subnormals become signed zero in f16 and stay exact-ish in bf16 */
    CHECK(moe_f32_to_f16(0x1p-149f) == 0x0000, "to_f16(2^-149) = 0x%04x", (unsigned)moe_f32_to_f16(0x1p-149f));
    CHECK(moe_f32_to_f16(-0x1p-149f) == 0x8000, "to_f16(-2^-149) = 0x%04x", (unsigned)moe_f32_to_f16(-0x1p-149f));
    CHECK(moe_f32_to_bf16(0x1p-133f) == 0x0001, "to_bf16(2^-133) = 0x%04x", (unsigned)moe_f32_to_bf16(0x1p-133f));
    CHECK(moe_f32_to_bf16(0x1p-134f) == 0x0000, "to_bf16(2^-134, tie) = 0x%04x",
          (unsigned)moe_f32_to_bf16(0x1p-134f));

    /* ordinary values and ties */
    CHECK(moe_f32_to_bf16(1.0f) == 0x3f80, "to_bf16(1) = 0x%04x", (unsigned)moe_f32_to_bf16(1.0f));
    CHECK(moe_f32_to_f16(1.0f) == 0x3c00, "to_f16(1) = 0x%04x", (unsigned)moe_f32_to_f16(1.0f));
    CHECK(moe_f32_to_bf16(bits_to_float(0x3f808000u)) == 0x3f80, "bf16 tie 1+2^-8 should go to even 0x3f80");
    CHECK(moe_f32_to_bf16(bits_to_float(0x3f818000u)) == 0x3f82, "bf16 tie 1+3*2^-8 should go to even 0x3f82");
    CHECK(moe_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "f16 tie 1+2^-11 should go to 0x3c00");
    CHECK(moe_f32_to_f16(1.0f + 0x1.8p-10f) == 0x3c02, "f16 tie 1+3*2^-11 should go to 0x3c02");
    CHECK(moe_f32_to_f16(-2.5f) == 0xc100, "to_f16(-2.5) = 0x%04x", (unsigned)moe_f32_to_f16(-2.5f));

    /* signed zero, Inf */
    CHECK(moe_f32_to_bf16(0.0f) == 0x0000 && moe_f32_to_bf16(-0.0f) == 0x8000, "bf16 signed zero: 0x%04x 0x%04x",
          (unsigned)moe_f32_to_bf16(0.0f), (unsigned)moe_f32_to_bf16(-0.0f));
    CHECK(moe_f32_to_f16(0.0f) == 0x0000 && moe_f32_to_f16(-0.0f) == 0x8000, "f16 signed zero: 0x%04x 0x%04x",
          (unsigned)moe_f32_to_f16(0.0f), (unsigned)moe_f32_to_f16(-0.0f));
    CHECK(signbit(moe_bf16_to_f32(0x8000)) && moe_bf16_to_f32(0x8000) == 0.0f, "bf16 0x8000 should be -0");
    CHECK(signbit(moe_f16_to_f32(0x8000)) && moe_f16_to_f32(0x8000) == 0.0f, "f16 0x8000 should be -0");
    CHECK(moe_f32_to_bf16(INFINITY) == 0x7f80 && moe_f32_to_bf16(-INFINITY) == 0xff80, "bf16 Inf: 0x%04x 0x%04x",
          (unsigned)moe_f32_to_bf16(INFINITY), (unsigned)moe_f32_to_bf16(-INFINITY));
    CHECK(moe_f32_to_f16(INFINITY) == 0x7c00 && moe_f32_to_f16(-INFINITY) == 0xfc00, "f16 Inf: 0x%04x 0x%04x",
          (unsigned)moe_f32_to_f16(INFINITY), (unsigned)moe_f32_to_f16(-INFINITY));
    CHECK(isinf(moe_bf16_to_f32(0x7f80)) && moe_bf16_to_f32(0xff80) < 0, "bf16 Inf decode");
    CHECK(isinf(moe_f16_to_f32(0x7c00)) && moe_f16_to_f32(0xfc00) < 0, "f16 Inf decode");

    /* NaN: quiet NaN, signalling NaN with payload only in the low bits (truncation would give Inf), negative NaN */
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu,
                                    0x7f802000u, 0x7fffffffu, 0xffffffffu, 0x7f800100u, 0x7f810000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        const float v = bits_to_float(nans[i]);
        const uint16_t b = moe_f32_to_bf16(v), h = moe_f32_to_f16(v);
        CHECK(is_nan16(&BF16, b) && (b & 0x0040), "to_bf16(NaN 0x%08x) = 0x%04x, expected a quiet NaN",
              (unsigned)nans[i], (unsigned)b);
        CHECK(is_nan16(&F16, h) && (h & 0x0200), "to_f16(NaN 0x%08x) = 0x%04x, expected a quiet NaN",
              (unsigned)nans[i], (unsigned)h);
        CHECK(isnan(moe_bf16_to_f32(b)) && isnan(moe_f16_to_f32(h)), "NaN 0x%08x did not decode back to NaN",
              (unsigned)nans[i]);
    }
}

static void dtype_helpers(void)
{
    CHECK(moe_dtype_size(MOE_F32) == 4, "moe_dtype_size(f32) = %zu", moe_dtype_size(MOE_F32));
    CHECK(moe_dtype_size(MOE_F16) == 2, "moe_dtype_size(f16) = %zu", moe_dtype_size(MOE_F16));
    CHECK(moe_dtype_size(MOE_BF16) == 2, "moe_dtype_size(bf16) = %zu", moe_dtype_size(MOE_BF16));
    CHECK(strcmp(moe_dtype_name(MOE_F32), "f32") == 0, "moe_dtype_name(f32) = %s", moe_dtype_name(MOE_F32));
    CHECK(strcmp(moe_dtype_name(MOE_F16), "f16") == 0, "moe_dtype_name(f16) = %s", moe_dtype_name(MOE_F16));
    CHECK(strcmp(moe_dtype_name(MOE_BF16), "bf16") == 0, "moe_dtype_name(bf16) = %s", moe_dtype_name(MOE_BF16));
    CHECK(moe_dtype_unit_roundoff(MOE_F32) == 0x1p-24, "unit roundoff f32 = %a", moe_dtype_unit_roundoff(MOE_F32));
    CHECK(moe_dtype_unit_roundoff(MOE_F16) == 0x1p-11, "unit roundoff f16 = %a", moe_dtype_unit_roundoff(MOE_F16));
    CHECK(moe_dtype_unit_roundoff(MOE_BF16) == 0x1p-8, "unit roundoff bf16 = %a",
          moe_dtype_unit_roundoff(MOE_BF16));
    CHECK(moe_dtype_size(MOE_E4M3) == 1 && moe_dtype_size(MOE_E5M2) == 1, "moe_dtype_size(e4m3, e5m2) = %zu, %zu",
          moe_dtype_size(MOE_E4M3), moe_dtype_size(MOE_E5M2));
    CHECK(strcmp(moe_dtype_name(MOE_E4M3), "e4m3") == 0 && strcmp(moe_dtype_name(MOE_E5M2), "e5m2") == 0,
          "moe_dtype_name(e4m3, e5m2) = %s, %s", moe_dtype_name(MOE_E4M3), moe_dtype_name(MOE_E5M2));
    CHECK(moe_dtype_unit_roundoff(MOE_E4M3) == 0x1p-4 && moe_dtype_unit_roundoff(MOE_E5M2) == 0x1p-3,
          "unit roundoff e4m3, e5m2 = %a, %a", moe_dtype_unit_roundoff(MOE_E4M3), moe_dtype_unit_roundoff(MOE_E5M2));
    static const int unknown[] = {5, 6, 99, -1, 0x7fffffff};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const moe_dtype d = (moe_dtype)unknown[i];
        CHECK(moe_dtype_size(d) == 0, "moe_dtype_size(%d) = %zu, expected 0", unknown[i], moe_dtype_size(d));
        CHECK(moe_dtype_name(d) != NULL && strcmp(moe_dtype_name(d), "?") == 0, "moe_dtype_name(%d) = %s",
              unknown[i], moe_dtype_name(d) ? moe_dtype_name(d) : "(null)");
        CHECK(moe_dtype_unit_roundoff(d) == 0.0, "moe_dtype_unit_roundoff(%d) = %g, expected 0", unknown[i],
              moe_dtype_unit_roundoff(d));
    }
}

/* moe_dtype_from_name: every name and alias, names that are not dtypes (case, blanks, prefixes, "?"), NULLs;
 * on failure the status, the message quoting the name and an untouched output. */
static void dtype_from_name(void)
{
    static const struct {
        const char *name;
        moe_dtype dtype;
    } known[] = {{"f32", MOE_F32},    {"float32", MOE_F32}, {"fp32", MOE_F32},     {"f16", MOE_F16},
                 {"float16", MOE_F16}, {"fp16", MOE_F16},    {"bf16", MOE_BF16}, {"bfloat16", MOE_BF16},
                 {"e4m3", MOE_E4M3}, {"float8_e4m3fn", MOE_E4M3}, {"e5m2", MOE_E5M2}, {"float8_e5m2", MOE_E5M2}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        moe_dtype d = (moe_dtype)99;
        const moe_status st = moe_dtype_from_name(known[i].name, &d);
        CHECK(st == MOE_OK && d == known[i].dtype, "moe_dtype_from_name(\"%s\") = %d, dtype %d; expected 0, %d",
              known[i].name, (int)st, (int)d, (int)known[i].dtype);
        CHECK(moe_last_error()[0] == '\0', "moe_dtype_from_name(\"%s\") left the message \"%s\"", known[i].name,
              moe_last_error());
    }
    for (int d = MOE_F32; d <= MOE_E5M2; d++) { /* round trip through moe_dtype_name */
        moe_dtype back = (moe_dtype)99;
        CHECK(moe_dtype_from_name(moe_dtype_name((moe_dtype)d), &back) == MOE_OK && back == (moe_dtype)d,
              "moe_dtype_from_name(moe_dtype_name(%d)) = %d", d, (int)back);
    }
    static const char *const unknown[] = {"", "F32", "BF16", "f64", "float64", "bf16 ", " f16", "f3", "fp32x", "E4M3", "e4m3fn", "fp8",
                                          "bfloat", "?", "int64", "half"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        moe_dtype d = (moe_dtype)77;
        const moe_status st = moe_dtype_from_name(unknown[i], &d);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", unknown[i]);
        CHECK(st == MOE_ERR_INVALID_DTYPE && d == (moe_dtype)77 && strstr(moe_last_error(), quoted) != NULL,
              "moe_dtype_from_name(\"%s\") = %d, dtype %d, message \"%s\"", unknown[i], (int)st, (int)d,
              moe_last_error());
    }
    moe_dtype d = (moe_dtype)77;
    CHECK(moe_dtype_from_name(NULL, &d) == MOE_ERR_NULL_POINTER && d == (moe_dtype)77 &&
              strstr(moe_last_error(), "name") != NULL,
          "moe_dtype_from_name(NULL) = dtype %d, message \"%s\"", (int)d, moe_last_error());
    CHECK(moe_dtype_from_name("bf16", NULL) == MOE_ERR_NULL_POINTER && strstr(moe_last_error(), "dtype") != NULL,
          "moe_dtype_from_name(\"bf16\", NULL): message \"%s\"", moe_last_error());
    char long_name[200]; /* the message quotes at most 64 characters of it */
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    CHECK(moe_dtype_from_name(long_name, &d) == MOE_ERR_INVALID_DTYPE && strlen(moe_last_error()) < 200,
          "moe_dtype_from_name(200 x): message of %zu characters", strlen(moe_last_error()));
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261123;
    printf("seed %llu\n", (unsigned long long)seed);
    rng_state = seed;
    const format *formats[] = {&BF16, &F16};
    for (int i = 0; i < 2; i++) {
        const format *f = formats[i];
        const long before = failures;
        exhaustive_patterns(f);
        halfway_cases(f);
        random_floats(f, 1000000);
        strided_sweep(f);
        printf("%s: exhaustive patterns, halfway cases, 1e6 random floats, strided sweep: %s\n", f->name,
               failures == before ? "ok" : "FAILED");
    }
    named_cases();
    dtype_helpers();
    dtype_from_name();
    if (failures) {
        printf("%ld failures (seed %llu)\n", failures, (unsigned long long)seed);
        return 1;
    }
    printf("all dtype checks passed\n");
    return 0;
}
