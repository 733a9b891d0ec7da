"""numpy's direct-code byte stream, re-derived without numpy: the specification synthetic weights follow.

`make-checkpoint` samples the codes of a large quantised tensor's row chunk with
`np.random.default_rng([seed, crc32(name), chunk])` and `integers(lo, hi, n, dtype=np.uint8)` over
power-of-two ranges. No draw is rejected there, so every byte is a fixed function of its position in
the PCG64 stream; this module spells that function out (checked byte for byte against numpy in
tests/python/test_direct_stream.py) so C++ and CUDA can reproduce it with a jump-ahead per thread
(cpp/kernels/synthetic_codes.h).

The chain, as numpy 2.x implements it:
- SeedSequence: each entropy integer becomes its little-endian uint32 words (0 -> [0]); a 4-word pool
  is mixed (hashmix / mix); generate_state(4, uint64) draws 8 uint32 words, read as 4 little-endian
  uint64 words.
- PCG64 seeding: initstate = w0 << 64 | w1, initseq = w2 << 64 | w3; inc = initseq << 1 | 1;
  state = 0; step; state += initstate; step. A step is state = state * MULT + inc (mod 2^128); an
  output steps first and returns XSL-RR of the new state: rotr64(hi ^ lo, state >> 122).
- next_uint32 splits one 64-bit output, low half first; the high half waits in the bit generator
  ACROSS calls. So the uint32 stream is lo(o0), hi(o0), lo(o1), ... and word k is half k % 2 of
  output k // 2, whatever the call boundaries.
- Bounded uint8 fill (one `integers` call): a byte buffer local to the call takes a fresh uint32 every
  4 bytes and hands its bytes low first; leftover bytes are dropped when the call ends. A call of n
  bytes therefore uses ceil(n / 4) uint32 words and the next call starts at the following word.
  Range 256 returns the byte; ranges 4 and 16 use Lemire's method, (byte * range) >> 8 with
  threshold (256 - range) % range = 0, i.e. the byte's top 2 or 4 bits.
"""

from __future__ import annotations

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1
M128 = (1 << 128) - 1
PCG64_MULT = 0x2360ED051FC65DA44385DF649FCCF645

_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def _words(n: int) -> list[int]:
    if n < 0:
        raise ValueError(f"SeedSequence entropy must be non-negative, got {n}")
    out = []
    while True:
        out.append(n & M32)
        n >>= 32
        if n == 0:
            return out


def seed_sequence_state(entropy: list[int], n_words64: int = 2 * 2) -> list[int]:
    """SeedSequence(entropy).generate_state(n_words64, uint64)."""
    ent = [w for e in entropy for w in _words(e)]
    hc = _INIT_A

    def hashmix(v: int) -> int:
        nonlocal hc
        v ^= hc
        hc = (hc * _MULT_A) & M32
        v = (v * hc) & M32
        return v ^ (v >> 16)

    def mix(x: int, y: int) -> int:
        r = (_MIX_L * x - _MIX_R * y) & M32
        return r ^ (r >> 16)

    pool = [hashmix(ent[i] if i < len(ent) else 0) for i in range(_POOL)]
    for s in range(_POOL):
        for d in range(_POOL):
            if s != d:
                pool[d] = mix(pool[d], hashmix(pool[s]))
    for s in range(_POOL, len(ent)):
        for d in range(_POOL):
            pool[d] = mix(pool[d], hashmix(ent[s]))
    hb = _INIT_B
    w32 = []
    for i in range(2 * n_words64):
        v = pool[i % _POOL] ^ hb
        hb = (hb * _MULT_B) & M32
        v = (v * hb) & M32
        w32.append(v ^ (v >> 16))
    return [w32[2 * i] | (w32[2 * i + 1] << 32) for i in range(n_words64)]


def pcg64_init(entropy: list[int]) -> tuple[int, int]:
    """(state, inc) of np.random.default_rng(entropy)'s PCG64 before its first output."""
    w = seed_sequence_state(entropy)
    initstate, initseq = (w[0] << 64) | w[1], (w[2] << 64) | w[3]
    inc = ((initseq << 1) | 1) & M128
    state = (0 * PCG64_MULT + inc) & M128
    state = (state + initstate) & M128
    return (state * PCG64_MULT + inc) & M128, inc


def pcg64_advance(state: int, inc: int, delta: int) -> int:
    """The state after `delta` steps, in O(log delta) (PCG's pcg_advance_lcg_128)."""
    acc_mult, acc_plus, cur_mult, cur_plus = 1, 0, PCG64_MULT, inc
    while delta:
        if delta & 1:
            acc_mult = (acc_mult * cur_mult) & M128
            acc_plus = (acc_plus * cur_mult + cur_plus) & M128
        cur_plus = ((cur_mult + 1) * cur_plus) & M128
        cur_mult = (cur_mult * cur_mult) & M128
        delta >>= 1
    return (acc_mult * state + acc_plus) & M128


def pcg64_output(state: int) -> int:
    v = ((state >> 64) ^ state) & M64
    rot = state >> 122
    return ((v >> rot) | (v << ((64 - rot) & 63))) & M64


def uint32_word(state0: int, inc: int, k: int) -> int:
    """Word k of the uint32 stream of a PCG64 whose state before its first output is state0."""
    out = pcg64_output(pcg64_advance(state0, inc, k // 2 + 1))
    return (out >> (32 * (k % 2))) & M32


def _bytes(state0: int, inc: int, first_word: int, n: int) -> bytes:
    words = [uint32_word(state0, inc, first_word + k) for k in range(-(-n // 4))]
    return b"".join(w.to_bytes(4, "little") for w in words)[:n]


def fp8_codes(seed: int, crc: int, chunk: int, n: int) -> bytes:
    """`(integers(0, 256, n) & 0x87) | (integers(5, 9, n) << 3)` of one row chunk, flattened."""
    s, inc = pcg64_init([seed, crc, chunk])
    bits = _bytes(s, inc, 0, n)
    exps = _bytes(s, inc, -(-n // 4), n)
    return bytes((b & 0x87) | (((e >> 6) + 5) << 3) for b, e in zip(bits, exps, strict=True))


def fp4_packed(seed: int, crc: int, chunk: int, n: int) -> bytes:
    """`integers(0, 16, n)` packed two per byte (even index low nibble) of one row chunk; n even."""
    if n % 2:
        raise ValueError(f"FP4 codes pack in pairs, got {n} codes")
    s, inc = pcg64_init([seed, crc, chunk])
    codes = [b >> 4 for b in _bytes(s, inc, 0, n)]
    return bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, n, 2))
