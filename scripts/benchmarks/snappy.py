"""Snappy codec throughput: MB/s of uncompressed data, pure Python vs the compiled backend.

    scripts/bench snappy               # CPython (the venv's)
    PYTHONPATH=scripts pypy3 -m benchmarks.snappy   # PyPy: pure Python only, unless cramjam is installed there

Inputs (each 1 MiB): ``frames`` is a stream of nsqd MESSAGE frames with
200-byte JSON-ish bodies (what a consumer receives, the case nsqd compresses
most), ``batch`` the frames benchmarks/features.py consumes (one 200-byte
body, half repeated bytes, half random), ``text`` repetitive log lines,
``random`` incompressible bytes.
Rows: CRC-32C alone, raw block compress/decompress, and the framing format's
encode (as nsqd's output buffer flushes it, 16 KiB at a time) and decode.
"""

import argparse
import os
import random
import struct
import sys
import time

from nsqd_threaded.wire.codec import snappy
from nsqd_threaded.wire.codec.crc32c import crc32c as py_crc32c

SIZE = 1 << 20
FLUSH = 16384  # nsqd's default output buffer size


def inputs():
    rnd = random.Random(1)
    frames = bytearray()
    n = 0
    while len(frames) < SIZE:
        body = (b'{"event":"page_view","user":%d,"path":"/item/%d","ts":%d,"ref":"%s"}'
                % (rnd.randrange(10**6), rnd.randrange(10**4), 1700000000000 + n,
                   rnd.choice([b"search", b"home", b"mail", b"ad"]))).ljust(200, b" ")
        msg = struct.pack(">qH", 1700000000000000000 + n, 1) + b"%016x" % n + body
        frames += struct.pack(">ii", 4 + len(msg), 2) + msg
        n += 1
    body = b"x" * 100 + rnd.randbytes(100) if hasattr(rnd, "randbytes") else b"x" * 100 + os.urandom(100)
    batch = bytearray()
    n = 0
    while len(batch) < SIZE:  # what benchmarks/features.py's consumer receives
        msg = struct.pack(">qH", 1700000000000000000 + n * 977, 1) + b"%016x" % (0x5f3a000000000000 + n) + body
        batch += struct.pack(">ii", 4 + len(msg), 2) + msg
        n += 1
    text = b"".join(b"2026-11-23T15:%02d:%02d INFO nsqd: TCP: new client(127.0.0.1:%d)\n"
                    % (i // 60 % 60, i % 60, 40000 + i % 9000) for i in range(SIZE // 50))
    return {
        "frames": bytes(frames[:SIZE]),
        "batch": bytes(batch[:SIZE]),
        "text": text[:SIZE],
        "random": os.urandom(SIZE),
    }


def rate(fn, data, min_time):
    """MB/s of len(data) through fn, best of a few timed rounds."""
    best = float("inf")
    total = 0.0
    rounds = 0
    while total < min_time or rounds < 3:
        t0 = time.perf_counter()
        fn(data)
        dt = time.perf_counter() - t0
        best = min(best, dt)
        total += dt
        rounds += 1
    return len(data) / best / 1e6


def in_flushes(encoder_cls):
    def run(data):
        enc = encoder_cls()
        for i in range(0, len(data), FLUSH):
            enc.encode(data[i:i + FLUSH])
    return run


def decode_all(decoder_cls):
    def run(stream):
        decoder_cls().decode(stream)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement")
    args = ap.parse_args()
    impl = "%s %s" % (sys.implementation.name, sys.version.split()[0])
    backends = [("python", snappy.py_compress, snappy.py_decompress, py_crc32c,
                 snappy.PyFrameEncoder, snappy.PyFrameDecoder)]
    if snappy.BACKEND != "python":  # its CRC-32C is inside its frame codec, not exposed
        backends.append((snappy.BACKEND, snappy.compress, snappy.decompress, None,
                         snappy.FrameEncoder, snappy.FrameDecoder))
    print("%s; MB/s of uncompressed data (1 MiB inputs, best of >= %.1f s)" % (impl, args.min_time))
    print("%-8s %-8s %7s %9s %9s %9s %9s %7s"
          % ("backend", "input", "crc32c", "compress", "decomp", "f-encode", "f-decode", "ratio"))
    for name, data in inputs().items():
        for backend, compress, decompress, crc, enc, dec in backends:
            block = compress(data)
            encoder = enc()
            stream = b"".join(encoder.encode(data[i:i + FLUSH]) for i in range(0, len(data), FLUSH))
            assert decompress(block) == data and dec().decode(stream) == data
            print("%-8s %-8s %7s %9.1f %9.1f %9.1f %9.1f %7.3f" % (
                backend, name,
                "%.1f" % rate(crc, data, args.min_time) if crc else "-",
                rate(compress, data, args.min_time),
                rate(decompress, block, args.min_time) * len(data) / len(block),
                rate(in_flushes(enc), data, args.min_time),
                rate(decode_all(dec), stream, args.min_time) * len(data) / len(stream),
                len(stream) / len(data)))


if __name__ == "__main__":
    main()
