"""Plain data between the judge's harness and the program (exact builtin types only).

Part of the harness text (`harness.py` runs with this file in front of it): standard library
only, no sinklens import. Values cross as tagged JSON, never pickle and never the program's own
objects, so an object whose `__eq__` always answers True, or an `int` subclass, cannot reach the
test: `encode` refuses anything but the exact builtin types.
"""
import json
import os



def encode(v, depth=0):
    if depth > 100:
        raise ValueError("value nested deeper than 100 levels")
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else {"f": repr(v)}
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"t": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(x, depth + 1) for x in v]}
    if t is bytes:
        return {"b": v.hex()}
    if t is complex:
        return {"c": [v.real, v.imag]}
    raise TypeError(f"cannot pass a {t.__module__}.{t.__qualname__} between judge and program")


def decode(v):
    if type(v) is list:
        return [decode(x) for x in v]
    if type(v) is not dict:
        return v
    (tag, x), = v.items()
    if tag == "f":
        return float(x)
    if tag == "t":
        return tuple(decode(e) for e in x)
    if tag == "d":
        return {decode(k): decode(e) for k, e in x}
    if tag == "s":
        return {decode(e) for e in x}
    if tag == "fs":
        return frozenset(decode(e) for e in x)
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "c":
        return complex(*x)
    raise ValueError(f"unknown tag {tag!r}")


def send(fd, obj):
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[os.write(fd, data):]


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
    return json.loads(read_exact(fd, int.from_bytes(read_exact(fd, 8), "big")))


