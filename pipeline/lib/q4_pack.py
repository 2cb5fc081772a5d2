"""4-bit weights for specrt's MatMulQ4 operator (runtime/kernels/matmul_q4.h): quantize, pack, unpack.

    W [K, N] float32 ──quantize_q4──► codes [K, N] int8 in -8..7, scales [K/32, N] float16
                     ──pack_q4──────► packed [ceil(N/16), K/32, 256] uint8, tile_scales [ceil(N/16), K/32, 16] float16

Symmetric blocks of 32 along K, one scale per column and block: the weight of largest magnitude m
maps to code -8 (scale = m / -8), the others to round(w / scale) clipped to -8..7, so the 16 codes
span the block's range with the extreme exactly representable (the Q4_0 rule of llama.cpp's GGUF).
Halves round up (toward code 7), as onnxruntime's quantizer does: weights that come from a GGUF
file sit on a coarser grid, and about a quarter of them land exactly on a half; rounding those to
even made Qwen2.5-Coder-0.5B's o_proj outputs 30% less accurate (docs/kernels.md).

Scales are IEEE float16 (a plain decode step streams the weights, and 2-byte scales make them 10%
fewer bytes than 4-byte ones): the block's scale is rounded to float16 first and the codes are
computed with the rounded value, so the codes fit the scale the kernel multiplies by. A block whose
scale is below float16's smallest subnormal (|w| < 2.4e-7 throughout) quantizes to zeros.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # k per scale
TILE = 16  # columns per tile
TILE_BYTES = 256  # packed bytes of one (tile, block)


def quantize_q4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` [K, N] (K a multiple of 32) -> codes [K, N] int8 in -8..7, scales [K/32, N] float16."""
    if weight.ndim != 2 or weight.shape[0] % BLOCK or weight.shape[0] == 0:
        raise ValueError(f"quantize_q4: weight of shape {weight.shape}: expected [K, N] with K a positive multiple "
                         f"of {BLOCK}")
    k, n = weight.shape
    blocks = weight.astype(np.float32).reshape(k // BLOCK, BLOCK, n)  # [Kb, 32, N]
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None, :], axis=1)[:, 0, :]  # [Kb, N]
    with np.errstate(over="ignore"):
        scales = (extreme / np.float32(-8)).astype(np.float16)  # [Kb, N]
    if not np.isfinite(scales).all():
        raise ValueError(f"quantize_q4: a block's largest weight magnitude is {np.abs(extreme).max():.6g}; float16 "
                         f"scales hold at most {8 * 65504} (weights must be finite and below that)")
    wide = scales.astype(np.float32)  # exact
    safe = np.where(wide == 0, np.float32(1), wide)
    shifted = blocks / safe[:, None, :] + np.float32(8)  # 0 .. 16
    codes = (np.clip(np.floor(shifted + np.float32(0.5)), 0, 15) - 8).astype(np.int8)
    codes[np.broadcast_to(wide[:, None, :] == 0, codes.shape)] = 0
    return codes.reshape(k, n), scales


def pack_q4(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """codes [K, N], scales [K/32, N] float16 -> (packed [tiles, K/32, 256] uint8, tile_scales [tiles, K/32, 16]
    float16)."""
    if scales.dtype != np.float16:
        raise ValueError(f"pack_q4: scales are {scales.dtype}, expected float16 (quantize_q4's)")
    k, n = codes.shape
    tiles, kb = -(-n // TILE), k // BLOCK
    nibbles = np.full((k, tiles * TILE), 8, np.uint8)
    nibbles[:, :n] = (codes.astype(np.int16) + 8).astype(np.uint8)
    # k = 8 g + 4 half + i of block b; byte 4 c + i of group g: half 0 low nibble, half 1 high
    grouped = nibbles.reshape(kb, 4, 2, 4, tiles, TILE).transpose(4, 0, 1, 5, 3, 2)  # [tiles, Kb, g, c, i, half]
    packed = grouped[..., 0] | (grouped[..., 1] << 4)
    padded = np.zeros((kb, tiles * TILE), np.float16)
    padded[:, :n] = scales
    return (np.ascontiguousarray(packed.reshape(tiles, kb, TILE_BYTES)),
            np.ascontiguousarray(padded.reshape(kb, tiles, TILE).transpose(1, 0, 2)))


def unpack_q4(packed: np.ndarray, tile_scales: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`pack_q4`: (codes [K, n] int8, scales [K/32, n] float16)."""
    tiles, kb, _ = packed.shape
    grouped = packed.reshape(tiles, kb, 4, TILE, 4)
    halves = np.stack([grouped & 15, grouped >> 4], axis=-1)  # [tiles, Kb, g, c, i, half]
    nibbles = halves.transpose(1, 2, 5, 4, 0, 3).reshape(kb * BLOCK, tiles * TILE)
    codes = (nibbles.astype(np.int16) - 8).astype(np.int8)[:, :n]
    return codes, tile_scales.transpose(1, 0, 2).reshape(kb, tiles * TILE)[:, :n]


def dequantize_q4(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float32 weights [K, N] that ``codes`` and ``scales`` stand for."""
    wide = scales.astype(np.float32)[:, None, :]  # [K/32, 1, N]
    return (codes.astype(np.float32).reshape(-1, BLOCK, codes.shape[1]) * wide).reshape(codes.shape)
