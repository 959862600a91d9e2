"""Plain data between the judge, its harness and the program (exact builtin types only).

Part of the harness's code (`harness.py` runs with this file in front of it): standard library
only, no sinklens import. Values cross as tagged bytes of our own, never pickle or marshal (not
safe to read from the program) and never the program's own objects, so an object whose `__eq__`
always answers True, or an `int` subclass, cannot reach the test: `encode` refuses anything but
the exact builtin types. Not JSON either: importing `json` (and `re` with it) cost the harness
more start-up time than everything else it imports; these two functions import nothing.

Each value is one tag byte, then for scalars a size and that many bytes, for containers a count
and that many values (sizes and counts: 8 bytes, big-endian):

    N None   T True   F False   i int (hex)   f float (float.hex)   c complex (two float.hex)
    s str (UTF-8)   b bytes   l list   t tuple   S set   Z frozenset   d dict (key, value, ...)

Ints go as hex text, which has no digit limit (decimal text has 4300 digits since Python 3.11).
"""
import os

MAX_DEPTH = 100
_SEQ = {list: b"l", tuple: b"t", set: b"S", frozenset: b"Z"}
_BUILD = {b"l": list, b"t": tuple, b"S": set, b"Z": frozenset}


def _size(n):
    return n.to_bytes(8, "big")


def _put(v, out, depth):
    if depth > MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if v is None:
        out.append(b"N")
    elif t is bool:
        out.append(b"T" if v else b"F")
    elif t is int or t is float or t is complex or t is str or t is bytes:
        if t is int:
            tag, raw = b"i", format(v, "x").encode()
        elif t is float:
            tag, raw = b"f", v.hex().encode()
        elif t is complex:
            tag, raw = b"c", (v.real.hex() + " " + v.imag.hex()).encode()
        elif t is str:
            tag, raw = b"s", v.encode("utf-8", "surrogatepass")
        else:
            tag, raw = b"b", v
        out += (tag, _size(len(raw)), raw)
    elif t in _SEQ:
        out += (_SEQ[t], _size(len(v)))
        for x in v:
            _put(x, out, depth + 1)
    elif t is dict:
        out += (b"d", _size(len(v)))
        for k, x in v.items():
            _put(k, out, depth + 1)
            _put(x, out, depth + 1)
    else:
        raise TypeError(f"cannot pass a {t.__module__}.{t.__qualname__} between judge and program")


def encode(v):
    out = []
    _put(v, out, 0)
    return b"".join(out)


def _get(data, i, depth):
    """(value, next index) of the value at data[i]; malformed data raises ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH} levels")
    tag = data[i:i + 1]
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag], i + 1
    if len(data) < i + 9:
        raise ValueError("truncated value")
    n, i = int.from_bytes(data[i + 1:i + 9], "big"), i + 9
    if tag in _BUILD:
        items = []
        for _ in range(n):
            x, i = _get(data, i, depth + 1)
            items.append(x)
        return _BUILD[tag](items), i
    if tag == b"d":
        out = {}
        for _ in range(n):
            k, i = _get(data, i, depth + 1)
            out[k], i = _get(data, i, depth + 1)
        return out, i
    raw, end = data[i:i + n], i + n
    if len(raw) != n:
        raise ValueError("truncated value")
    if tag == b"s":
        return raw.decode("utf-8", "surrogatepass"), end
    if tag == b"b":
        return raw, end
    text = raw.decode("ascii")
    if tag == b"i":
        return int(text, 16), end
    if tag == b"f":
        return float.fromhex(text), end
    if tag == b"c":
        re, im = text.split(" ")
        return complex(float.fromhex(re), float.fromhex(im)), end
    raise ValueError(f"unknown tag {tag!r}")


def decode(data):
    v, end = _get(data, 0, 0)
    if end != len(data):
        raise ValueError("bytes left after the value")
    return v


def frame(data):
    return _size(len(data)) + data


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def send(fd, obj):
    write_all(fd, frame(encode(obj)))


def read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))     # never more than asked: nothing of the next frame
        if not b:
            raise EOFError("the other side closed the pipe")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def recv(fd):
    return decode(read_exact(fd, int.from_bytes(read_exact(fd, 8), "big")))
