"""The snappy codec: block and framing formats, pure Python and the compiled backend.

The compiled backend (the optional extra ``snappy``) and the independent
implementations from PyPI are exercised when installed, skipped otherwise.
"""

import os
import random
import struct
import subprocess
import sys

import pytest

from nsqd_threaded.wire.codec import snappy
from nsqd_threaded.wire.codec.crc32c import BYTE_TABLE, crc32c, masked

pytestmark = pytest.mark.timeout(120)

try:
    import cramjam
except ImportError:
    cramjam = None

needs_cramjam = pytest.mark.skipif(cramjam is None, reason="extra 'snappy' (cramjam) not installed")

OK_FRAME = bytes.fromhex("ff060000734e61507059" "010e0000" "26982bcf" "00000006000000004f4b")
OK_PAYLOAD = bytes.fromhex("00000006000000004f4b")  # FrameTypeResponse "OK"


def cramjam_block():
    return (lambda d: bytes(cramjam.snappy.compress_raw(d)),
            lambda d: bytes(cramjam.snappy.decompress_raw(d)))


BLOCK_CODECS = [
    pytest.param((snappy.py_compress, snappy.py_decompress), id="python"),
    pytest.param((snappy.compress, snappy.decompress), id="public"),
]
FRAME_CODECS = [
    pytest.param((snappy.PyFrameEncoder, snappy.PyFrameDecoder), id="python"),
    pytest.param((snappy.FrameEncoder, snappy.FrameDecoder), id="public"),
    pytest.param((snappy.PyFrameEncoder, snappy.FrameDecoder), id="python-to-public"),
    pytest.param((snappy.FrameEncoder, snappy.PyFrameDecoder), id="public-to-python"),
]


def samples():
    """Random, compressible and incompressible inputs around the 64 KiB boundaries."""
    rnd = random.Random(7)
    text = b"".join(b'{"id":%d,"name":"event-%d","ok":true} ' % (i, i % 97) for i in range(6000))
    out = {}
    for size in (0, 1, 2, 3, 4, 5, 14, 15, 16, 17, 60, 61, 255, 256, 257, 1000,
                 65535, 65536, 65537, 2 * 65536 - 1, 2 * 65536 + 1, 200000):
        out["random-%d" % size] = bytes(rnd.getrandbits(8) for _ in range(size)) if size < 4000 \
            else os.urandom(size)
        out["text-%d" % size] = (text * (size // len(text) + 1))[:size]
        out["zeros-%d" % size] = bytes(size)
        out["small-alphabet-%d" % size] = bytes(rnd.choice(b"ab") for _ in range(min(size, 70000)))
    out["mixed"] = os.urandom(30000) + text[:50000] + os.urandom(3000) + bytes(70000)
    out["period-3"] = b"abc" * 50000
    out["period-2047"] = os.urandom(2047) * 40
    out["period-70000"] = os.urandom(70000) * 3  # repeats only across fragments
    # Records of one size with changing fields: the matcher's repeated-offset path.
    out["records-234"] = message_frames(rnd, 1000, os.urandom(100))
    out["records-3000"] = message_frames(rnd, 60, os.urandom(2966))  # offsets past 2047
    out["records-zeros"] = message_frames(rnd, 700, bytes(60) + os.urandom(8) + bytes(20))
    out["records-mixed"] = message_frames(rnd, 300, os.urandom(90)) + os.urandom(5000) \
        + message_frames(rnd, 200, b"x" * 40) + bytes(77)
    return out


def message_frames(rnd, count, body):
    """nsqd MESSAGE frames of one size: timestamp, id and some body bytes change."""
    frames = []
    for n in range(count):
        varied = bytearray(body)
        for _ in range(rnd.randrange(3)):
            varied[rnd.randrange(len(varied))] = rnd.randrange(256)
        msg = struct.pack(">qH", 1700000000000000000 + n * rnd.randrange(1, 5000), 1 + n % 3) \
            + b"%016x" % (0x5f00000000000000 + n * 7) + bytes(varied)
        frames.append(struct.pack(">ii", 4 + len(msg), 2) + msg)
    return b"".join(frames)


SAMPLES = samples()


# CRC-32C ------------------------------------------------------------------

def crc32c_bytewise(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = BYTE_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("data, expected", [
    (b"", 0),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),  # RFC 3720 B.4
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
])
def test_crc32c_known_answers(data, expected):
    assert crc32c(data) == expected
    assert snappy.crc32c(data) == expected


def test_crc32c_wide_path_matches_bytewise():
    rnd = random.Random(3)
    data = os.urandom(5000)
    for size in list(range(0, 80)) + [rnd.randrange(5000) for _ in range(40)]:
        assert crc32c(data[:size]) == crc32c_bytewise(data[:size]), size
        cut = size // 3
        assert crc32c(data[cut:size], crc32c(data[:cut])) == crc32c(data[:size])
    assert crc32c(memoryview(data)[7:4007]) == crc32c_bytewise(data[7:4007])
    assert crc32c(bytearray(data)) == crc32c(data)


def test_crc32c_column_path_matches_bytewise():
    data = os.urandom(70000)
    for size in (767, 768, 769, 800, 2047, 2048, 4095, 4096, 4096 + 127, 8191, 8192, 8192 + 33,
                 65536, 65541, 70000):
        assert crc32c(data[:size]) == crc32c_bytewise(data[:size]), size
    assert crc32c(data[5:], crc32c(data[:5])) == crc32c(data)
    assert crc32c(bytes(100000)) == crc32c_bytewise(bytes(100000))
    assert crc32c(b"\xff" * 100000) == crc32c_bytewise(b"\xff" * 100000)


def test_masked_checksum_of_ok_frame():
    assert masked(crc32c(OK_PAYLOAD)).to_bytes(4, "little") == OK_FRAME[14:18]


# Block format ----------------------------------------------------------------

@pytest.mark.parametrize("codec", BLOCK_CODECS)
def test_block_round_trips(codec):
    compress, decompress = codec
    for name, data in SAMPLES.items():
        block = compress(data)
        assert decompress(block) == data, name
        assert decompress(bytearray(block)) == data
        assert decompress(memoryview(block)) == data
        if name.startswith(("text-", "zeros-")) and len(data) > 1000:
            assert len(block) < len(data) // 4, name
    assert compress(bytearray(b"abc" * 100)) == compress(b"abc" * 100)


def test_python_block_round_trips_fuzz():
    rnd = random.Random(11)
    for _ in range(400):
        alphabet = rnd.randrange(1, 256)
        data = bytes(rnd.randrange(alphabet) for _ in range(rnd.randrange(3000)))
        if rnd.random() < 0.5:
            data = data[: len(data) // 2] * 3
        assert snappy.py_decompress(snappy.py_compress(data)) == data


def test_incompressible_block_is_bounded():
    data = os.urandom(300000)
    assert len(snappy.py_compress(data)) <= 32 + len(data) + len(data) // 6


@needs_cramjam
def test_block_cross_compatible_with_cramjam():
    compress, decompress = cramjam_block()
    for name, data in SAMPLES.items():
        assert decompress(snappy.py_compress(data)) == data, name
        assert snappy.py_decompress(compress(data)) == data, name


def test_block_cross_compatible_with_py_snappy():
    """py-snappy: an independent pure-Python implementation of the block format."""
    py_snappy = pytest.importorskip("py_snappy")
    for name, data in SAMPLES.items():
        if len(data) > 70000:
            continue  # it is slow
        assert py_snappy.decompress(snappy.py_compress(data)) == data, name
        assert snappy.py_decompress(py_snappy.compress(data)) == data, name


def test_message_frames_compress_well_in_output_flushes():
    """A consumer's stream, cut as nsqd's output buffer flushes it: every
    flush decodes (by every decoder at hand) and compresses well."""
    rnd = random.Random(21)
    data = message_frames(rnd, 3000, b"x" * 100 + os.urandom(100))
    flushes = [data[i:i + 16384] for i in range(0, len(data), 16384)]
    for flush in flushes:
        block = snappy.py_compress(flush)
        assert snappy.py_decompress(block) == flush
        if cramjam is not None:
            assert bytes(cramjam.snappy.decompress_raw(block)) == flush
        assert len(block) < len(flush) // 4
    encoder = snappy.PyFrameEncoder()
    stream = b"".join(encoder.encode(f) for f in flushes)
    assert snappy.PyFrameDecoder().decode(stream) == data
    if cramjam is not None:
        assert bytes(cramjam.snappy.decompress(stream)) == data


def test_varied_records_keep_the_plain_matchers_compression():
    """JSON bodies of one padded size: following the record length would leave
    most of each body in literals, so the fragment goes back to plain matching."""
    rnd = random.Random(4)
    frames = b"".join(
        struct.pack(">ii", 234, 2) + struct.pack(">qH", 1700000000000000000 + n, 1) + b"%016x" % n
        + (b'{"event":"page_view","user":%d,"path":"/item/%d","ref":"%s"}'
           % (rnd.randrange(10**6), rnd.randrange(10**4), rnd.choice([b"search", b"home", b"ad"]))).ljust(200)
        for n in range(300))
    block = snappy.py_compress(frames)
    assert snappy.py_decompress(block) == frames
    assert len(block) < len(frames) * 0.19  # 0.21 when the record length is followed throughout


def test_repeated_offset_edges():
    """Records whose differences fall at the gap limits, zero bytes that are
    data (not a match), and a record cut by the fragment's end."""
    rnd = random.Random(5)
    for size in (16, 33, 64, 65, 100, 2047, 2048, 2049):
        base = bytearray(os.urandom(size))
        records = []
        for n in range(70000 // size + 2):
            rec = bytearray(base)
            for _ in range(rnd.randrange(4)):
                at = rnd.randrange(size)
                rec[at:at + rnd.choice((1, 15, 16, 17, 31, 32, 33, 45, 60))] = bytes(rnd.randrange(1, 40))
            records.append(bytes(rec[:size]))
        data = b"".join(records)[:rnd.randrange(65000, 70000)] + bytes(rnd.randrange(40))
        for piece in (data, data[:16384], data[:size * 3 + 7]):
            block = snappy.py_compress(piece)
            assert snappy.py_decompress(block) == piece, size
            if cramjam is not None:
                assert bytes(cramjam.snappy.decompress_raw(block)) == piece, size


def test_block_known_encoding():
    # Hand-assembled: literal "abcd", copy offset 4 length 8 (1-byte offset form), literal "!".
    block = bytes([13, 3 << 2]) + b"abcd" + bytes([1 | ((8 - 4) << 2), 4]) + bytes([0]) + b"!"
    assert snappy.py_decompress(block) == b"abcdabcdabcd!"
    # The same copy with 2- and 4-byte offsets.
    assert snappy.py_decompress(bytes([12, 3 << 2]) + b"abcd" + bytes([2 | (7 << 2), 4, 0])) \
        == b"abcd" * 3
    assert snappy.py_decompress(bytes([12, 3 << 2]) + b"abcd" + bytes([3 | (7 << 2), 4, 0, 0, 0])) \
        == b"abcd" * 3
    # A literal with a 2-byte length.
    data = bytes(range(256)) * 2
    assert snappy.py_decompress(bytes([0x80, 4, 61 << 2, 0xFF, 0x01]) + data) == data


@pytest.mark.parametrize("codec", BLOCK_CODECS)
@pytest.mark.parametrize("block, why", [
    (b"", "empty"),
    (b"\x80\x80\x80\x80\x80\x01", "length overflow: varint too long"),
    (b"\xff\xff\xff\xff\x7f", "length overflow: > 2**32-1"),
    (b"\x80", "truncated length"),
    (b"\xff\xff\xff\xff\x0f\xfeA\x00", "4 GiB claimed by 8 bytes"),
    (b"\x05\x10abc", "truncated literal"),
    (b"\x40\xf0", "truncated literal length"),
    (b"\x05\x00a\x01\x05", "offset beyond output"),
    (b"\x05\x00a\x01\x00", "offset zero"),
    (b"\x05\x00a\x0a", "truncated copy"),
    (b"\x05\x00a\x0b\x01\x00", "truncated 4-byte offset"),
    (b"\x02\x08abc", "output longer than the header"),
    (b"\x05\x00a", "output shorter than the header"),
    (b"\x04\x00a\x05\x01", "copy past the header's length"),
])
def test_corrupt_blocks_raise(codec, block, why):
    with pytest.raises(snappy.SnappyError):
        codec[1](block)


@pytest.mark.parametrize("codec", BLOCK_CODECS)
def test_random_garbage_raises_only_snappy_error(codec):
    rnd = random.Random(5)
    valid = snappy.py_compress(SAMPLES["text-1000"])
    for _ in range(3000):
        if rnd.random() < 0.5:
            block = bytearray(valid)
            for _ in range(rnd.randrange(1, 4)):
                block[rnd.randrange(len(block))] = rnd.randrange(256)
            block = bytes(block[: rnd.randrange(len(block) + 1)])
        else:
            block = bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
        try:
            codec[1](block)
        except snappy.SnappyError:
            pass


# Framing format ---------------------------------------------------------------

def chunks(stream):
    """(type, body) of each chunk of a framed stream."""
    out = []
    pos = 0
    while pos < len(stream):
        size = int.from_bytes(stream[pos + 1:pos + 4], "little")
        out.append((stream[pos], stream[pos + 4:pos + 4 + size]))
        pos += 4 + size
    assert pos == len(stream)
    return out


def frame(kind, body):
    return bytes([kind]) + len(body).to_bytes(3, "little") + body


def data_chunk(data, kind=0x01, crc=None):
    crc = masked(crc32c(data)) if crc is None else crc
    body = data if kind == 0x01 else snappy.py_compress(data)
    return frame(kind, crc.to_bytes(4, "little") + body)


@pytest.mark.parametrize("encoder", [snappy.PyFrameEncoder, snappy.FrameEncoder])
def test_encoder_writes_observed_ok_frame(encoder):
    assert encoder().encode(OK_PAYLOAD) == OK_FRAME


@pytest.mark.parametrize("decoder", [snappy.PyFrameDecoder, snappy.FrameDecoder])
def test_decoder_reads_observed_ok_frame(decoder):
    assert decoder().decode(OK_FRAME) == OK_PAYLOAD
    d = decoder()
    assert b"".join(d.decode(OK_FRAME[i:i + 1]) for i in range(len(OK_FRAME))) == OK_PAYLOAD


@pytest.mark.parametrize("encoder", [snappy.PyFrameEncoder, snappy.FrameEncoder])
def test_encoder_stream_identifier_once(encoder):
    e = encoder()
    assert e.encode(b"") == b""
    first = e.encode(b"hello")
    assert first.startswith(snappy.STREAM_IDENTIFIER)
    second = e.encode(b"world")
    assert not second.startswith(b"\xff")
    assert snappy.PyFrameDecoder().decode(first + second) == b"helloworld"


@pytest.mark.parametrize("encoder", [snappy.PyFrameEncoder, snappy.FrameEncoder])
def test_encoder_chunking_and_types(encoder):
    for name in ("random-200000", "text-200000", "mixed"):
        data = SAMPLES[name]
        parts = chunks(encoder().encode(data))
        assert parts[0] == (0xFF, b"sNaPpY")
        decoded = []
        for kind, body in parts[1:]:
            payload = body[4:] if kind == 0x01 else snappy.py_decompress(body[4:])
            assert len(payload) <= 65536
            assert masked(crc32c(payload)) == int.from_bytes(body[:4], "little")
            if kind == 0x00:  # compressed only when it saves at least 12.5%
                assert len(body) - 4 < len(payload) - len(payload) // 8
            else:
                assert kind == 0x01
            decoded.append(payload)
        assert b"".join(decoded) == data
        assert [len(p) for p in decoded[:-1]] == [65536] * (len(decoded) - 1)
        if name.startswith("random"):
            assert {k for k, _ in parts[1:]} == {0x01}
        if name.startswith("text"):
            assert {k for k, _ in parts[1:]} == {0x00}


@pytest.mark.parametrize("codec", FRAME_CODECS)
def test_frame_round_trips(codec):
    encoder, decoder = codec
    e, d = encoder(), decoder()
    for name, data in SAMPLES.items():
        assert d.decode(e.encode(data)) == data, name
        assert d.decode(e.encode(memoryview(data))) == data, name


@pytest.mark.parametrize("codec", FRAME_CODECS)
def test_frame_decoding_in_one_byte_pieces(codec):
    encoder, decoder = codec
    data = SAMPLES["mixed"][:3000] + SAMPLES["text-1000"] + b"x" * 70000
    e = encoder()
    stream = e.encode(data) + e.encode(b"tail")
    stream = stream[:10] + frame(0xFE, bytes(3)) + frame(0x80, b"skip me") + stream[10:]
    d = decoder()
    out = bytearray()
    for i in range(len(stream)):
        out += d.decode(stream[i:i + 1])
    assert out == data + b"tail"


@pytest.mark.parametrize("codec", FRAME_CODECS)
def test_frame_decoding_random_splits(codec):
    encoder, decoder = codec
    rnd = random.Random(9)
    e = encoder()
    payloads = [SAMPLES[name] for name in ("text-65537", "random-1000", "zeros-200000", "mixed")]
    stream = b"".join(e.encode(p) for p in payloads)
    for _ in range(5):
        d = decoder()
        out = bytearray()
        pos = 0
        while pos < len(stream):
            step = rnd.choice((1, 3, 4, 5, 100, 4096, 70000))
            out += d.decode(stream[pos:pos + step])
            pos += step
        assert out == b"".join(payloads)


@pytest.mark.parametrize("decoder", [snappy.PyFrameDecoder, snappy.FrameDecoder])
def test_decoder_skips_skippable_padding_and_repeated_identifiers(decoder):
    big_skip = frame(0xFD, os.urandom(100000))
    stream = (snappy.STREAM_IDENTIFIER + frame(0x80, b"x") + data_chunk(b"one")
              + frame(0xFE, bytes(10)) + big_skip + snappy.STREAM_IDENTIFIER
              + data_chunk(b"two" * 100, kind=0x00) + frame(0x9A, b""))
    assert decoder().decode(stream) == b"one" + b"two" * 100
    d = decoder()
    out = bytearray()
    for i in range(0, len(stream), 7):
        out += d.decode(stream[i:i + 7])
    assert out == b"one" + b"two" * 100
    assert d._buf == b""  # a skippable chunk is dropped, not buffered


def corrupt_streams():
    ident = snappy.STREAM_IDENTIFIER
    good = data_chunk(b"hello")
    body = b"hello" * 10
    return [
        pytest.param(ident + data_chunk(b"hello", crc=123), id="bad-crc-uncompressed"),
        pytest.param(ident + data_chunk(body, kind=0x00, crc=masked(crc32c(body)) ^ 1),
                     id="bad-crc-compressed"),
        pytest.param(ident + frame(0x02, b"abcd"), id="reserved-0x02"),
        pytest.param(ident + frame(0x7F, b"abcd"), id="reserved-0x7f"),
        pytest.param(good, id="no-identifier"),
        pytest.param(frame(0x80, b"") + ident + good, id="skippable-before-identifier"),
        pytest.param(b"\xff\x06\x00\x00sNaPpZ" + good, id="bad-identifier"),
        pytest.param(b"\xff\x07\x00\x00sNaPpYx" + good, id="identifier-length"),
        pytest.param(ident + frame(0x01, b"abc"), id="chunk-shorter-than-crc"),
        pytest.param(ident + b"\x00\xff\xff\xff", id="chunk-length-over-max"),
        pytest.param(ident + data_chunk(bytes(65537)), id="uncompressed-over-64k"),
        pytest.param(ident + frame(0x00, masked(crc32c(bytes(65537))).to_bytes(4, "little")
                                   + snappy.py_compress(bytes(65537))), id="compressed-over-64k"),
        pytest.param(ident + frame(0x00, b"\0\0\0\0" + b"\x05\x10abc"), id="truncated-literal"),
        pytest.param(ident + frame(0x00, b"\0\0\0\0" + b"\x05\x00a\x01\x05"), id="offset-beyond-output"),
        pytest.param(ident + frame(0x00, b"\0\0\0\0" + b"\xff\xff\xff\xff\xff\x01"),
                     id="length-overflow"),
    ]


@pytest.mark.parametrize("decoder", [snappy.PyFrameDecoder, snappy.FrameDecoder])
@pytest.mark.parametrize("stream", corrupt_streams())
def test_corrupt_streams_raise(decoder, stream):
    with pytest.raises(snappy.SnappyError):
        decoder().decode(stream)
    with pytest.raises(snappy.SnappyError):
        d = decoder()
        for i in range(len(stream)):
            d.decode(stream[i:i + 1])


@pytest.mark.parametrize("decoder", [snappy.PyFrameDecoder, snappy.FrameDecoder])
def test_oversized_chunk_rejected_from_its_header(decoder):
    # A hostile length is refused as soon as the header is in, not buffered for.
    with pytest.raises(snappy.SnappyError):
        decoder().decode(snappy.STREAM_IDENTIFIER + b"\x00\x00\x00\x10")
    with pytest.raises(snappy.SnappyError):
        decoder(max_chunk=100).decode(snappy.STREAM_IDENTIFIER + b"\x01\x65\x00\x00")


@needs_cramjam
@pytest.mark.skipif(os.environ.get("NSQD_SNAPPY_BACKEND", "auto").lower() not in ("", "auto", "cramjam"),
                    reason="NSQD_SNAPPY_BACKEND forces another backend")
def test_public_names_use_cramjam_when_installed():
    assert snappy.BACKEND == "cramjam"
    stream = bytes(cramjam.snappy.compress(SAMPLES["mixed"]))
    assert snappy.PyFrameDecoder().decode(stream) == SAMPLES["mixed"]
    assert bytes(cramjam.snappy.decompress(snappy.PyFrameEncoder().encode(SAMPLES["mixed"]))) \
        == SAMPLES["mixed"]


def test_frames_cross_compatible_with_pysnappy():
    """pysnappy: Google's C++ snappy with its own framing and CRC-32C."""
    framing = pytest.importorskip("pysnappy.framing")
    for name in ("mixed", "text-200000", "random-65537", "zeros-65536", "random-1"):
        data = SAMPLES[name]
        theirs = framing.Compressor().compress(data)
        assert snappy.PyFrameDecoder().decode(theirs) == data, name
        assert snappy.FrameDecoder().decode(theirs) == data, name
        for encoder in (snappy.PyFrameEncoder, snappy.FrameEncoder):
            assert framing.Decompressor().decompress(encoder().encode(data)) == data, name
    assert framing.Compressor().compress(OK_PAYLOAD) == OK_FRAME


@pytest.mark.parametrize("decoder", [snappy.PyFrameDecoder, snappy.FrameDecoder])
def test_mutated_streams_raise_only_snappy_error(decoder):
    rnd = random.Random(13)
    e = snappy.PyFrameEncoder()
    valid = e.encode(SAMPLES["text-1000"]) + e.encode(SAMPLES["random-256"])
    for _ in range(1500):
        stream = bytearray(valid)
        for _ in range(rnd.randrange(1, 4)):
            stream[rnd.randrange(len(stream))] = rnd.randrange(256)
        try:
            decoder().decode(bytes(stream[: rnd.randrange(len(stream) + 1)]))
        except snappy.SnappyError:
            pass


def test_pure_python_backend_without_the_extra():
    """Without cramjam the public names are the pure-Python ones."""
    code = ("import sys; sys.modules['cramjam'] = None\n"
            "from nsqd_threaded.wire.codec import snappy\n"
            "assert snappy.FrameEncoder is snappy.PyFrameEncoder\n"
            "assert snappy.FrameDecoder is snappy.PyFrameDecoder\n"
            "assert snappy.compress is snappy.py_compress\n"
            "print(snappy.BACKEND)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    assert out.stdout.strip() == b"python"


@pytest.mark.parametrize("decoder", [snappy.PyFrameDecoder, snappy.FrameDecoder])
def test_decoder_accepts_any_bytes_like(decoder):
    stream = snappy.PyFrameEncoder().encode(SAMPLES["text-1000"])
    d = decoder()
    half = len(stream) // 2
    assert d.decode(bytearray(stream[:half])) + d.decode(memoryview(stream)[half:]) \
        == SAMPLES["text-1000"]


def _backend_in_subprocess(setting, hide_cramjam=False):
    code = ("import sys\n" + ("sys.modules['cramjam'] = None\n" if hide_cramjam else "")
            + "from nsqd_threaded.wire.codec import snappy\n"
            "assert (snappy.FrameEncoder is snappy.PyFrameEncoder) == (snappy.BACKEND == 'python')\n"
            "print(snappy.BACKEND)\n")
    env = dict(os.environ)
    env.pop("NSQD_SNAPPY_BACKEND", None)
    if setting is not None:
        env["NSQD_SNAPPY_BACKEND"] = setting
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, env=env)


def test_backend_forced_by_environment():
    installed = b"cramjam" if cramjam is not None else b"python"
    for setting, expected in ((None, installed), ("", installed), ("auto", installed), ("python", b"python"),
                              (" Python ", b"python")):
        out = _backend_in_subprocess(setting)
        assert out.returncode == 0 and out.stdout.strip() == expected, (setting, out.stderr)
    out = _backend_in_subprocess("python", hide_cramjam=True)
    assert out.stdout.strip() == b"python"
    # Requiring cramjam without it, or a misspelt choice, fails the import loudly.
    out = _backend_in_subprocess("cramjam", hide_cramjam=True)
    assert out.returncode != 0 and b"cramjam" in out.stderr.splitlines()[-1]
    out = _backend_in_subprocess("rust")
    assert out.returncode != 0 and b"NSQD_SNAPPY_BACKEND" in out.stderr
    if cramjam is not None:
        assert _backend_in_subprocess("cramjam").stdout.strip() == b"cramjam"
