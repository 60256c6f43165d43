/* Dtype sizes, names and the float <-> f16/bf16 conversions (round to nearest even, NaN/Inf kept) and
 * float <-> e4m3/e5m2 (round to nearest even, saturating; include/moe.h states the rules).
 * Contracts: on the redeclarations in ref/moe_ref.h (Frama-C only); specs/README.md says what WP proves. */
#include "moe_ref.h"

#include <string.h>

size_t moe_dtype_size(moe_dtype dtype)
{
    switch (dtype) {
    case MOE_F32: return 4;
    case MOE_F16: return 2;
    case MOE_BF16: return 2;
    case MOE_E4M3: return 1;
    case MOE_E5M2: return 1;
    }
    return 0;
}

const char *moe_dtype_name(moe_dtype dtype)
{
    switch (dtype) {
    case MOE_F32: return "f32";
    case MOE_F16: return "f16";
    case MOE_BF16: return "bf16";
    case MOE_E4M3: return "e4m3";
    case MOE_E5M2: return "e5m2";
    }
    return "?";
}

/* 1 when the string name is exactly word, whose length characters (no nul among them) are its letters; 0
 * otherwise.  Used instead of strcmp so that WP can prove the reads: strcmp requires both arguments to be
 * strings, which WP 25 cannot show for a string literal (its contents are not in the Typed model), while
 * reading word's first length characters needs only their validity.  name is read up to its nul at most. */
/*@ requires name: valid_read_string(name);
    requires word: \valid_read(word + (0 .. length - 1));
    requires length: 1 <= length;
    terminates \true;
    assigns \nothing; */
static int spells(const char *name, const char *word, size_t length)
{
    size_t i = 0;
    /*@ loop invariant bounds: 0 <= i <= length;
        loop invariant within: i <= strlen(name);
        loop assigns i;
        loop variant length - i; */
    for (; i < length; i++)
        if (name[i] == '\0' || name[i] != word[i])
            return 0;
    return name[length] == '\0';
}
/* name is the string literal word (the literal's characters, without its nul) */
#define SPELLS(name, word) spells(name, word, sizeof(word) - 1)

moe_status moe_dtype_from_name(const char *name, moe_dtype *dtype)
{
    moe_clear_error();
    if (name == NULL || dtype == NULL)
        return moe_fail(MOE_ERR_NULL_POINTER, "moe_dtype_from_name: %s is NULL",
                        name == NULL ? "name" : "dtype");
    if (SPELLS(name, "f32") || SPELLS(name, "float32") || SPELLS(name, "fp32"))
        *dtype = MOE_F32;
    else if (SPELLS(name, "f16") || SPELLS(name, "float16") || SPELLS(name, "fp16"))
        *dtype = MOE_F16;
    else if (SPELLS(name, "bf16") || SPELLS(name, "bfloat16"))
        *dtype = MOE_BF16;
    else if (SPELLS(name, "e4m3") || SPELLS(name, "float8_e4m3fn"))
        *dtype = MOE_E4M3;
    else if (SPELLS(name, "e5m2") || SPELLS(name, "float8_e5m2"))
        *dtype = MOE_E5M2;
    else
        return moe_fail(MOE_ERR_INVALID_DTYPE, "moe_dtype_from_name: \"%.64s\" is not a dtype (f32, f16, bf16, e4m3, e5m2; "
                        "float32, fp32, float16, fp16, bfloat16, float8_e4m3fn, float8_e5m2)", name);
    return MOE_OK;
}

double moe_dtype_unit_roundoff(moe_dtype dtype)
{
    switch (dtype) {
    case MOE_F32: return 0x1p-24;
    case MOE_F16: return 0x1p-11;
    case MOE_BF16: return 0x1p-8;
    case MOE_E4M3: return 0x1p-4;
    case MOE_E5M2: return 0x1p-3;
    }
    return 0.0;
}

/* float_bits, bits_float: the bits of a float and back.  Contracts trusted, not proved: memcpy between a
 * float and a uint32_t reinterprets the bits, and WP's typed model cannot follow it (its void * casts are
 * "incompatible"); they are pure functions of their argument.  Tested by tests/test_dtype. */
/*@ terminates \true;
    assigns \nothing; */
static uint32_t float_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/*@ terminates \true;
    assigns \nothing; */
static float bits_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

uint16_t moe_f32_to_bf16(float value)
{
    uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);            /* round to nearest even at bit 16 */
    return (uint16_t)(bits >> 16);                    /* a carry past the largest finite gives Inf */
}

float moe_bf16_to_f32(uint16_t bits) { return bits_float((uint32_t)bits << 16); }

uint16_t moe_f32_to_f16(float value)
{
    uint32_t bits = float_bits(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)                      /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u)                     /* >= 65520 rounds to Inf (Inf stays Inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) {                    /* below 2^-14: f16 subnormal or zero */
        /* |value| * 2^24 is exact and < 1024; adding and removing 2^23 rounds it to an integer
         * (nearest even) in the default rounding mode.  1024 is the smallest normal, encoded right. */
        float scaled = bits_float(magnitude) * 0x1p24f;
        volatile float rounded = scaled + 0x1p23f;
        return (uint16_t)(sign | (uint16_t)(rounded - 0x1p23f));
    }
    uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u); /* nearest even at bit 13 */
    rounded -= 112u << 23;                            /* exponent bias 127 -> 15 */
    return (uint16_t)(sign | (rounded >> 13));
}

float moe_f16_to_f32(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu)                            /* Inf or NaN */
        return bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {                              /* zero or subnormal: mantissa * 2^-24, exact */
        float magnitude = (float)mantissa * 0x1p-24f;
        return bits_float(sign | float_bits(magnitude));
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/* The two FP8 formats by their mantissa bits m and exponent bias: e4m3 (m 3, bias 7, largest finite code
 * 0x7e = 448) and e5m2 (m 2, bias 15, largest finite code 0x7b = 57344). */
#define E4M3_FORMAT 3u, 7u, 0x7e
#define E5M2_FORMAT 2u, 15u, 0x7b

/* float -> fp8: NaN -> 0x7f with the sign; |value| >= max (Inf included) -> +-max; otherwise round to
 * nearest even, subnormals included. */
/*@ requires format: (m == 3 && bias == 7 && max_code == 0x7e) || (m == 2 && bias == 15 && max_code == 0x7b);
    terminates \true;
    assigns \nothing; */
static uint8_t encode_fp8(float value, uint32_t m, uint32_t bias, uint8_t max_code)
{
    const uint32_t bits = float_bits(value);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    const uint32_t shift = 23u - m;
    const uint32_t max_bits = ((uint32_t)(max_code >> m) + 127u - bias) << 23 |
                              (uint32_t)(max_code & ((1u << m) - 1u)) << shift;
    if (magnitude >= max_bits)                        /* saturate (finite overflow and Inf) */
        return (uint8_t)(sign | max_code);
    const uint32_t min_normal_bits = (128u - bias) << 23; /* 2^(1 - bias) */
    if (magnitude < min_normal_bits) {
        /* subnormal or zero: |value| * 2^(bias - 1 + m) is exact and < 2^m; adding and removing 2^23 rounds
         * it to an integer (nearest even); the smallest normal's code comes out right */
        const float scaled = bits_float(magnitude) * (float)(1u << (bias - 1u + m));
        volatile float rounded = scaled + 0x1p23f;
        return (uint8_t)(sign | (uint8_t)(rounded - 0x1p23f));
    }
    uint32_t rounded = magnitude + ((1u << (shift - 1u)) - 1u) + ((magnitude >> shift) & 1u); /* nearest even */
    rounded -= (127u - bias) << 23;                   /* exponent bias 127 -> the format's */
    return (uint8_t)(sign | (rounded >> shift));      /* below max, so the rounding stays finite */
}

/* fp8 -> float, exact: NaN codes give a quiet NaN with the sign (e4m3: S.1111.111; e5m2: exponent all ones,
 * mantissa non-zero), e5m2's Inf gives Inf. */
/*@ requires format: (m == 3 && bias == 7) || (m == 2 && bias == 15);
    terminates \true;
    assigns \nothing; */
static float decode_fp8(uint8_t code, uint32_t m, uint32_t bias)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t exponent = (code & 0x7fu) >> m;
    const uint32_t mantissa = code & ((1u << m) - 1u);
    const int has_inf = m == 2u;                      /* e5m2 is IEEE-like; e4m3 has no Inf */
    if (has_inf && exponent == (0x7fu >> m))
        return bits_float(sign | 0x7f800000u | (mantissa << (23u - m)));
    if (!has_inf && (code & 0x7fu) == 0x7fu)
        return bits_float(sign | 0x7fc00000u);
    if (exponent == 0) {                              /* zero or subnormal: mantissa * 2^(1 - bias - m) */
        const float magnitude = (float)mantissa / (float)(1u << (bias - 1u + m));
        return bits_float(sign | float_bits(magnitude));
    }
    return bits_float(sign | ((exponent + 127u - bias) << 23) | (mantissa << (23u - m)));
}

uint8_t moe_f32_to_e4m3(float value) { return encode_fp8(value, E4M3_FORMAT); }
float moe_e4m3_to_f32(uint8_t bits) { return decode_fp8(bits, 3u, 7u); }
uint8_t moe_f32_to_e5m2(float value) { return encode_fp8(value, E5M2_FORMAT); }
float moe_e5m2_to_f32(uint8_t bits) { return decode_fp8(bits, 2u, 15u); }
