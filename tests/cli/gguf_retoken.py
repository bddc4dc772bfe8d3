"""Copies a GGUF file with some metadata changed: the CLI test's broken tokenizers.

Usage: gguf_retoken.py SRC OUT EDITS_JSON. EDITS_JSON is an object {key: value}: a value
replaces the key's and keeps its GGUF type (an array keeps its element type); a new key is
appended, its type given as ["TYPE", value] (TYPE: UINT32, INT32, BOOL, STRING, or ARRAY_ + one
of them); null removes the key. Tensor infos and data are copied byte for byte (the data section
is re-aligned). Standard library only: the gguf package cannot write the empty arrays (merges)
concord's byte-tokenizer exports carry.
"""
import json
import struct
import sys

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
NAMES = {"UINT32": 4, "INT32": 5, "BOOL": 7, "STRING": 8}


class Reader:
    def __init__(self, raw):
        self.raw, self.pos = raw, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.raw, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return v

    def string(self):
        n = self.take("Q")
        s = self.raw[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALARS[t])


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def pack_value(t, v):
    if t == 8:
        return pack_string(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(pack_value(et, x) for x in items)
    return struct.pack("<" + SCALARS[t], v)


def read(src):
    """The metadata of `src`: [key, type, value] in file order (an array is (type, items))."""
    return parse(open(src, "rb").read())[1]


def parse(raw):
    r = Reader(raw)
    assert raw[:4] == b"GGUF", "not a GGUF file"
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        t = r.take("I")
        kvs.append([key, t, r.value(t)])
    infos_start = r.pos
    alignment = 32
    for _ in range(n_tensors):
        r.string()
        n_dims = r.take("I")
        r.pos += 8 * n_dims + 4 + 8
    infos = raw[infos_start:r.pos]
    for key, t, v in kvs:
        if key == "general.alignment":
            alignment = v
    data = raw[(r.pos + alignment - 1) // alignment * alignment:]
    return version, kvs, n_tensors, infos, alignment, data


def main(src, out, edits):
    version, kvs, n_tensors, infos, alignment, data = parse(open(src, "rb").read())
    by_key = {kv[0]: kv for kv in kvs}
    for key, v in edits.items():
        if v is None:
            kvs = [kv for kv in kvs if kv[0] != key]
        elif isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and \
                v[0].removeprefix("ARRAY_") in NAMES:
            name, value = v
            if name.startswith("ARRAY_"):
                entry = [key, 9, (NAMES[name[6:]], value)]
            else:
                entry = [key, NAMES[name], value]
            if key in by_key:
                by_key[key][1:] = entry[1:]
            else:
                kvs.append(entry)
        else:
            kv = by_key[key]  # an untyped value replaces one that is there
            kv[2] = (kv[2][0], v) if kv[1] == 9 else v
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs))
    head += b"".join(pack_string(k) + struct.pack("<I", t) + pack_value(t, v) for k, t, v in kvs)
    head += infos
    head += b"\0" * ((-len(head)) % alignment)
    with open(out, "wb") as f:
        f.write(head + data)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
