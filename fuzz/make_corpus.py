#!/usr/bin/env python3
"""Writes the seed corpus for safetensors_fuzz into fuzz/corpus/safetensors/ (a few tiny valid and
invalid files, < 10 KB in all). Deterministic; rerun after changing it and commit the output."""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")


def st(header, data=b"", pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SEEDS = {
    # valid
    "valid_empty": st({}),
    "valid_metadata_only": st({"__metadata__": {"format": "pt"}}),
    "valid_one_f32": st({"w": entry("F32", [2], 0, 8)}, bytes(range(8))),
    "valid_mixed": st({"__metadata__": {"format": "pt"},
                       "a": entry("BF16", [2, 3], 0, 12),
                       "b": entry("F8_E4M3", [4], 12, 16),
                       "s": entry("F32", [], 16, 20),
                       "z": entry("I64", [0, 5], 20, 20)}, bytes(20)),
    "valid_unpadded": st({"x": entry("U8", [3], 0, 3)}, b"abc", pad=False),
    "valid_all_dtypes": st({f"t{i}": entry(d, [1], o, o + n) for i, (d, n, o) in enumerate(
        [("F64", 8, 0), ("I64", 8, 8), ("F32", 4, 16), ("I32", 4, 20), ("F16", 2, 24), ("BF16", 2, 26),
         ("I16", 2, 28), ("I8", 1, 30), ("U8", 1, 31), ("BOOL", 1, 32), ("F8_E4M3", 1, 33)])}, bytes(34)),
    # invalid, one per family
    "bad_short": b"\x02\x00\x00",
    "bad_header_len": struct.pack("<Q", 1 << 40) + b"{}",
    "bad_utf8": st(b'{"\xc0\xaf":{}}'),
    "bad_json": st(b'{"w":{"dtype":"F32",'),
    "bad_duplicate": st(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                        b'"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x00\x01"),
    "bad_dtype": st({"w": entry("F8_E5M2", [1], 0, 1)}, b"\x00"),
    "bad_overlap": st({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)),
    "bad_gap": st({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, bytes(12)),
    "bad_overflow": st({"w": entry("F32", [1 << 32, 1 << 32, 0], 0, 0)}),
    "bad_trailing": st({"a": entry("U8", [1], 0, 1)}, bytes(4)),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds, {sum(map(len, SEEDS.values()))} bytes, to {OUT}")


if __name__ == "__main__":
    main()
