#!/usr/bin/env python3
"""A float64 reference forward pass of a llama-architecture GGUF, in numpy, for judging logits.

Neither Escala nor llama.cpp is the truth: both quantize the activations of every matrix product to
8 bits on the fly. This script dequantizes the weights exactly (f32, f16, q4_0, q4_1, q8_0, q6_k) and
runs the model (RMSNorm, interleaved RoPE, causal GQA attention, SwiGLU, tied or separate output) in
float64 with no activation quantization, so each runtime's logits can be measured against it.
It holds the weights as float64 (~8 bytes per parameter: 1.1 GB for SmolLM2-135M).

    python3 scripts/reference_forward.py --model models/...gguf --ids 1,2,3   # prints the top 10
Used by scripts/compare_llamacpp.py --reference.
"""
import argparse
import struct
import sys

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _string(b, o):
    (n,) = struct.unpack_from("<Q", b, o)
    return b[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n


def _value(b, o, t):
    if t in _SCALAR:
        (v,) = struct.unpack_from(_SCALAR[t], b, o)
        return v, o + struct.calcsize(_SCALAR[t])
    if t == 8:
        return _string(b, o)
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, o)
        o += 12
        out = []
        for _ in range(n):
            v, o = _value(b, o, et)
            out.append(v)
        return out, o
    raise ValueError(f"GGUF value type {t}")


def read_gguf(path):
    """(bytes, metadata, {name: (dims, ggml type, offset)}, data start)."""
    b = open(path, "rb").read()
    if b[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
    o = 24
    meta = {}
    for _ in range(n_kv):
        k, o = _string(b, o)
        (t,) = struct.unpack_from("<I", b, o)
        meta[k], o = _value(b, o + 4, t)
    tensors = {}
    for _ in range(n_tensors):
        name, o = _string(b, o)
        (nd,) = struct.unpack_from("<I", b, o)
        dims = struct.unpack_from(f"<{nd}Q", b, o + 4)
        o += 4 + 8 * nd
        typ, off = struct.unpack_from("<IQ", b, o)
        o += 12
        tensors[name] = (dims, typ, off)
    align = meta.get("general.alignment", 32)
    return b, meta, tensors, (o + align - 1) // align * align


def _f16(a):
    return np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype=np.float16).astype(np.float64)


def dequantize(b, start, dims, typ, off):
    """The tensor as float64, shaped [ne1, ne0] (rows, cols) for matrices."""
    n = int(np.prod(dims))
    raw = np.frombuffer(b, dtype=np.uint8, offset=start + off)
    if typ == 0:
        x = np.frombuffer(b, dtype=np.float32, count=n, offset=start + off).astype(np.float64)
    elif typ == 1:
        x = np.frombuffer(b, dtype=np.float16, count=n, offset=start + off).astype(np.float64)
    elif typ in (2, 3):  # q4_0: d, 16 bytes; q4_1: d, m, 16 bytes. Low nibbles are elements 0-15.
        size = 18 if typ == 2 else 20
        blk = raw[:n // 32 * size].reshape(-1, size)
        d = _f16(blk[:, 0:2])
        qs = blk[:, size - 16:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float64)
        x = (q - 8) * d[:, None] if typ == 2 else q * d[:, None] + _f16(blk[:, 2:4])[:, None]
    elif typ == 8:  # q8_0: d, 32 int8
        blk = raw[:n // 32 * 34].reshape(-1, 34)
        x = blk[:, 2:].copy().view(np.int8).astype(np.float64) * _f16(blk[:, 0:2])[:, None]
    elif typ == 14:  # q6_k: ql[128], qh[64], scales[16] (int8), d
        blk = raw[:n // 256 * 210].reshape(-1, 210)
        ql, qh = blk[:, :128], blk[:, 128:192]
        sc = blk[:, 192:208].copy().view(np.int8).astype(np.float64)
        d = _f16(blk[:, 208:210])
        x = np.zeros((blk.shape[0], 256))
        for h in range(2):
            lo, hi = ql[:, 64 * h:64 * h + 32], ql[:, 64 * h + 32:64 * h + 64]
            hb = qh[:, 32 * h:32 * h + 32]
            parts = [(lo & 15) | ((hb & 3) << 4), (hi & 15) | (((hb >> 2) & 3) << 4),
                     (lo >> 4) | (((hb >> 4) & 3) << 4), (hi >> 4) | (((hb >> 6) & 3) << 4)]
            for j, q in enumerate(parts):
                for s in range(2):
                    at = 128 * h + 32 * j + 16 * s
                    x[:, at:at + 16] = (d * sc[:, 8 * h + 2 * j + s])[:, None] * (q[:, 16 * s:16 * s + 16] - 32.0)
    else:
        raise NotImplementedError(f"ggml type {typ} (reference supports f32, f16, q4_0, q4_1, q8_0, q6_k)")
    return x.reshape(list(reversed(dims)))


class Reference:
    def __init__(self, path):
        b, meta, tensors, start = read_gguf(path)
        arch = meta["general.architecture"]
        if arch != "llama":
            raise NotImplementedError(f"architecture {arch} (reference: llama only)")
        g = lambda k: meta[f"{arch}.{k}"]
        self.layers, self.h = g("block_count"), g("attention.head_count")
        self.hk = meta.get(f"{arch}.attention.head_count_kv", self.h)
        self.hd = g("embedding_length") // self.h
        self.eps = g("attention.layer_norm_rms_epsilon")
        self.base = meta.get(f"{arch}.rope.freq_base", 10000.0)
        if f"{arch}.rope.scaling.type" in meta or "rope_freqs.weight" in tensors:
            raise NotImplementedError("RoPE scaling (reference: plain RoPE only)")
        self.w = {name: dequantize(b, start, *info) for name, info in tensors.items()}
        self.w.setdefault("output.weight", self.w["token_embd.weight"])

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):  # [T, heads, hd], pairs (2i, 2i+1) as llama GGUFs are permuted for
        inv = self.base ** (-2.0 * np.arange(self.hd // 2) / self.hd)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return out

    def logits(self, ids):
        """Logits of the last position after the prompt `ids`."""
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        x = self.w["token_embd.weight"][ids].copy()
        mask = np.triu(np.full((T, T), -np.inf), 1)
        grp = self.h // self.hk
        for li in range(self.layers):
            p = f"blk.{li}."
            xn = self._rms(x, self.w[p + "attn_norm.weight"])
            q = self._rope((xn @ self.w[p + "attn_q.weight"].T).reshape(T, self.h, self.hd), pos)
            k = self._rope((xn @ self.w[p + "attn_k.weight"].T).reshape(T, self.hk, self.hd), pos)
            v = (xn @ self.w[p + "attn_v.weight"].T).reshape(T, self.hk, self.hd)
            att = np.empty((T, self.h, self.hd))
            for h in range(self.h):
                sc = q[:, h] @ k[:, h // grp].T / np.sqrt(self.hd) + mask
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                att[:, h] = (sc / sc.sum(axis=1, keepdims=True)) @ v[:, h // grp]
            x = x + att.reshape(T, -1) @ self.w[p + "attn_output.weight"].T
            xn = self._rms(x, self.w[p + "ffn_norm.weight"])
            gate, up = xn @ self.w[p + "ffn_gate.weight"].T, xn @ self.w[p + "ffn_up.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ self.w[p + "ffn_down.weight"].T
        return self._rms(x[-1], self.w["output_norm.weight"]) @ self.w["output.weight"].T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    args = ap.parse_args()
    logits = Reference(args.model).logits([int(t) for t in args.ids.split(",")])
    for i in np.argsort(-logits)[:10]:
        print(int(i), float(logits[i]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
