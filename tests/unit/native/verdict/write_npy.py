#!/usr/bin/python3
"""write_npy.py DIR NAME=DIMxDIM:VALUE ...: float32 .npy files (format 1.0, C order) for the verdict
tests, standard library only. VALUE is a number, nan, inf, or huge (+-3.4e38 alternating)."""
import os
import struct
import sys


def write(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % (
        ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%df" % len(values), *values))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for spec in sys.argv[2:]:
        name, rest = spec.split("=", 1)
        dims, value = rest.split(":", 1)
        shape = [int(d) for d in dims.split("x")]
        n = 1
        for d in shape:
            n *= d
        if value == "huge":
            values = [3.4e38 if i % 2 == 0 else -3.4e38 for i in range(n)]
        else:
            values = [float(value)] * n
        write(os.path.join(out, name + ".npy"), shape, values)


if __name__ == "__main__":
    main()
