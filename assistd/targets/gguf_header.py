"""Read a GGUF file's metadata without loading its tensors, and check its length.

The ``gguf`` package's reader maps every tensor (4.2 s for the embedded model here);
walking the header and the tensor table only takes 0.16 s and also tells a
truncated file from a complete one before a backend tries to load it.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Container
from pathlib import Path

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_metadata(path: Path, keys: Container[str]) -> dict:
    """The values of ``keys`` in a GGUF file's metadata (str, number, or list of them).

    Walks the header and the tensor table, not the tensor data, and checks that the
    data the table declares lies within the file. Raises ValueError when the file is
    not GGUF, breaks off inside its header, or is shorter than its tensors need.
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    out: dict = {}
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"not a GGUF file: {path}")

        def value(pos: int, vtype: int, keep: bool):
            if vtype in _GGUF_SCALARS:
                fmt = "<" + _GGUF_SCALARS[vtype]
                return struct.unpack_from(fmt, m, pos)[0] if keep else None, pos + struct.calcsize(fmt)
            if vtype == 8:  # string: u64 length, utf-8 bytes
                (n,) = struct.unpack_from("<Q", m, pos)
                return m[pos + 8 : pos + 8 + n].decode("utf-8") if keep else None, pos + 8 + n
            if vtype == 9:  # array: u32 element type, u64 count, elements
                etype, count = struct.unpack_from("<IQ", m, pos)
                pos += 12
                items = []
                for _ in range(count):
                    item, pos = value(pos, etype, keep)
                    items.append(item)
                return items if keep else None, pos
            raise ValueError(f"unknown GGUF metadata value type {vtype}")

        try:
            _, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
            pos, align, data_bytes = 24, 32, 0
            for _ in range(n_kv):
                key, pos = value(pos, 8, True)
                (vtype,) = struct.unpack_from("<I", m, pos)
                v, pos = value(pos + 4, vtype, key in keys or key == "general.alignment")
                if key in keys:
                    out[key] = v
                if key == "general.alignment":
                    align = v
            for _ in range(n_tensors):  # name, u32 n_dims, u64 dims, u32 type, u64 offset
                _, pos = value(pos, 8, False)
                (n_dims,) = struct.unpack_from("<I", m, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", m, pos + 4)
                ggml_type, offset = struct.unpack_from("<IQ", m, pos + 4 + 8 * n_dims)
                pos += 16 + 8 * n_dims
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
                data_bytes = max(data_bytes, offset + math.prod(dims) // block * size)
        except (struct.error, UnicodeDecodeError, ValueError):
            raise ValueError(f"GGUF header breaks off or is corrupt (a truncated file?), "
                             f"{len(m)} bytes") from None
        need = -(-pos // align) * align + data_bytes
        if need > len(m):
            raise ValueError(f"GGUF file is truncated: its tensors need {need} bytes, it has {len(m)}")
    return out
