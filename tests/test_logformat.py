"""dm-log-writes log format, replayer and the replay-log / log dump commands."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
from pathlib import Path

import pytest

from cli import main as cli
from foundation.errors import RefusedError, UsageError
from foundation.ownership import create_file
from replay.logformat import DISCARD, END_MARK, FLUSH, FUA, MARK, METADATA, LogReader, LogWriter, flags_str
from replay.replayer import Replayer, find_mark

POWERCUT = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "powercut"
SS = 512

# --- golden fixture: the kernel's layout, spelled out without LogWriter ----


def _block(raw: bytes) -> bytes:
    return raw.ljust(SS, b"\0")


def _header(sector: int, nr_sectors: int, flags: int, text: bytes = b"") -> bytes:
    return _block(struct.pack("<QQQQ", sector, nr_sectors, flags, len(text)) + text)


def _super(nr_entries: int, magic: int = 0x6A736677736872, version: int = 1, sectorsize: int = SS) -> bytes:
    return struct.Struct("<QQQI").pack(magic, version, nr_entries, sectorsize).ljust(sectorsize, b"\0")


GOLDEN = b"".join(
    [
        _super(6),
        _header(8, 1, 0), b"A" * SS,  # plain write
        _header(0, 0, 1),  # empty flush
        _header(16, 2, 2 | 16), b"B" * SS + b"C" * SS,  # FUA|METADATA write
        _header(32, 8, 4),  # discard: no data follows
        _header(0, 0, 8, b"synced"),
        _header(0, 0, 8, b"dm-log-writes-end"),
    ]
)
# (index, sector, nr_sectors, flags, data_len, mark, header_offset, data_offset)
GOLDEN_ENTRIES = [
    (0, 8, 1, 0, 0, None, 512, 1024),
    (1, 0, 0, 1, 0, None, 1536, 2048),
    (2, 16, 2, 18, 0, None, 2048, 2560),
    (3, 32, 8, 4, 0, None, 3584, 4096),
    (4, 0, 0, 8, 6, "synced", 4096, 4608),
    (5, 0, 0, 8, 17, "dm-log-writes-end", 4608, 5120),
]


def _write_golden(w: LogWriter) -> None:
    w.write(8, b"A" * SS)
    w.flush()
    w.write(16, b"B" * SS + b"C" * SS, FUA | METADATA)
    w.discard(32, 8)
    w.mark("synced")


# --- helpers -----------------------------------------------------------------


def _plain(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _owned_image(path: Path, size: int, fill: bytes = b"\0") -> Path:
    fd = create_file(str(path), size)
    os.pwrite(fd, fill * size, 0)
    os.close(fd)
    return path


def _marks_log(path: Path) -> Path:
    """0 write s0, 1 mark m1, 2 write s1, 3 flush, 4 mark m2, 5 write s2, 6 end mark."""
    with LogWriter(str(path), SS) as w:
        w.write(0, b"A" * SS)
        w.mark("m1")
        w.write(1, b"B" * SS)
        w.flush()
        w.mark("m2")
        w.write(2, b"C" * SS)
    return path


def _sectors(image: Path) -> list[bytes]:
    data = image.read_bytes()
    return [data[i : i + SS] for i in range(0, len(data), SS)]


def _powercut(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(POWERCUT), *map(str, args)], capture_output=True, text=True, timeout=60)


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("powercut: "), proc.stderr
    assert fragment in lines[0]


def _main(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


# --- format ------------------------------------------------------------------


def test_golden_log_parses_exactly(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    with LogReader(str(log)) as reader:
        assert (reader.version, reader.sectorsize, reader.nr_entries) == (1, SS, 6)
        entries = list(reader)
        assert [dataclasses.astuple(e) for e in entries] == GOLDEN_ENTRIES
        assert [reader.read_data(e) for e in entries] == [b"A" * SS, b"", b"B" * SS + b"C" * SS, b"", b"", b""]
    assert [flags_str(e.flags) for e in entries] == ["NONE", "FLUSH", "FUA|METADATA", "DISCARD", "MARK", "MARK"]
    assert [(e.is_write, e.is_flush, e.is_fua, e.is_discard, e.is_mark) for e in entries[:4]] == [
        (True, False, False, False, False),
        (False, True, False, False, False),
        (True, False, True, False, False),
        (False, False, False, True, False),
    ]
    assert entries[3].byte_range(SS) == (32 * SS, 40 * SS)


def test_writer_reproduces_golden_bytes(tmp_path: Path) -> None:
    with LogWriter(str(tmp_path / "w.log"), SS) as w:
        _write_golden(w)
    assert (tmp_path / "w.log").read_bytes() == GOLDEN


def test_round_trip_4k(tmp_path: Path) -> None:
    path = str(tmp_path / "rt.log")
    payload = bytes(range(256)) * 32
    with LogWriter(path, 4096) as w:
        assert w.write(3, payload, FLUSH | FUA) == 0
        w.mark("x" * (4096 - 33))  # the longest mark the kernel keeps
        w.discard(1, 2)
    with LogReader(path) as reader:
        write, mark, discard, end = reader
        assert (write.sector, write.nr_sectors, write.flags, reader.read_data(write)) == (3, 2, FLUSH | FUA, payload)
        assert mark.mark == "x" * 4063 and mark.data_len == 4063
        assert (discard.sector, discard.nr_sectors, discard.flags) == (1, 2, DISCARD)
        assert (end.flags, end.mark) == (MARK, END_MARK)


def test_writer_rejects_unloggable_input(tmp_path: Path) -> None:
    with LogWriter(str(tmp_path / "w.log"), SS) as w:
        with pytest.raises(UsageError):
            w.mark("x" * (SS - 32))
        with pytest.raises(ValueError):
            w.write(0, b"short")
        with pytest.raises(ValueError):
            w.write(0, b"\0" * SS, DISCARD)


def test_super_block_counts_only_through_last_fua_or_mark(tmp_path: Path) -> None:
    """Like the kernel: plain writes after the last FUA/mark are not counted until close."""
    path = str(tmp_path / "w.log")
    w = LogWriter(path, SS)
    w.write(0, b"\0" * SS, FUA)
    w.write(1, b"\0" * SS)
    with LogReader(path) as reader:
        assert reader.nr_entries == 1
    w.close(end_mark=False)
    with LogReader(path) as reader:
        assert reader.nr_entries == 2


def test_unterminated_mark_text_is_replaced_not_fatal(tmp_path: Path) -> None:
    log = _plain(tmp_path / "m.log", _super(1) + _header(0, 0, MARK, b"ok\xff"))
    with LogReader(str(log)) as reader:
        assert next(iter(reader)).mark == "ok\ufffd"


def test_reads_100k_entries(tmp_path: Path) -> None:
    # (how fast is `make bench`'s business, not a test's)
    log = _plain(tmp_path / "big.log", _super(100_000) + _header(0, 0, FLUSH) * 100_000)
    with LogReader(str(log)) as reader:
        assert sum(1 for e in reader if e.flags == FLUSH) == 100_000


# --- malformed logs ------------------------------------------------------------

MALFORMED = {
    "bad magic": (_super(1, magic=0x1234) + _header(0, 0, FLUSH), "not a dm-log-writes log (magic 0x1234)"),
    "bad version": (_super(1, version=2) + _header(0, 0, FLUSH), "unsupported dm-log-writes version 2"),
    "bad sectorsize": (_super(1, sectorsize=1000)[:SS], "bad sectorsize 1000"),
    "truncated header": (GOLDEN[: 1536 + 100], "truncated at entry 1 (byte offset 1536)"),
    "truncated data": (GOLDEN[: 2560 + SS], "truncated at entry 2 (byte offset 2048)"),
    "zeroed entry": (_super(1) + _block(b""), "malformed entry 0 (byte offset 512)"),
    "unpadded header": (_super(1) + _header(0, 0, FLUSH)[:32] + b"\x01".ljust(SS - 32, b"\0"), "malformed entry 0"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_log_is_a_usage_error(tmp_path: Path, case: str) -> None:
    data, message = MALFORMED[case]
    log = _plain(tmp_path / "bad.log", data)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        with LogReader(str(log)) as reader:
            list(reader)


@pytest.mark.parametrize("case", ["bad magic", "truncated header", "truncated data"])
def test_malformed_log_through_cli(tmp_path: Path, case: str) -> None:
    data, message = MALFORMED[case]
    log = _plain(tmp_path / "bad.log", data)
    _assert_one_line_error(_powercut("log", "dump", log) if case == "bad magic" else _powercut("replay-log", "--log", log, "--replay", tmp_path / "img"), message)


def test_entry_past_device_end(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    image = _owned_image(tmp_path / "small.img", 12 * SS)
    with LogReader(str(log)) as reader, Replayer(reader, str(image)) as replayer:
        replayer.replay_through(1)
        with pytest.raises(UsageError, match=r"entry 2 writes sectors 16\.\.17 past the device end \(12 sectors\)"):
            replayer.apply_next()
    proc = _powercut("replay-log", "--log", log, "--replay", tmp_path / "new.img", "--size", 20 * SS)
    _assert_one_line_error(proc, "entry 3 discards sectors 32..39 past the device end (20 sectors)")


# --- replayer -------------------------------------------------------------------


def test_full_replay_writes_and_punches(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    image = _owned_image(tmp_path / "img", 40 * SS, fill=b"\xff")
    with LogReader(str(log)) as reader, Replayer(reader, str(image)) as replayer:
        replayer.replay_through(reader.nr_entries - 1)
        assert replayer.position == 6 and replayer.apply_next() is None
    sectors = _sectors(image)
    assert sectors[8] == b"A" * SS and sectors[16:18] == [b"B" * SS, b"C" * SS]
    assert sectors[32:40] == [b"\0" * SS] * 8
    assert sectors[0] == b"\xff" * SS


def test_incremental_replay_equals_full_replay(tmp_path: Path) -> None:
    log = str(tmp_path / "mixed.log")
    with LogWriter(log, SS) as w:
        for i in range(40):
            w.write((i * 7) % 23, bytes([i]) * SS * (1 + i % 3), FUA if i % 5 == 0 else 0)
            if i % 6 == 0:
                w.discard((i * 3) % 20, 1 + i % 4)
            if i % 9 == 0:
                w.flush()
    with LogReader(log) as reader:
        size = reader.device_bytes_needed()
        last = reader.nr_entries - 1
        incremental = Replayer(reader, str(_owned_image(tmp_path / "inc.img", size)))
        for n, checkpoint in enumerate([0, 5, 6, 30, last]):
            incremental.replay_through(checkpoint)
            with LogReader(log) as fresh_reader, Replayer(fresh_reader, str(_owned_image(tmp_path / f"full{n}.img", size))) as full:
                full.replay_through(checkpoint)
            assert (tmp_path / "inc.img").read_bytes() == (tmp_path / f"full{n}.img").read_bytes(), checkpoint
        with pytest.raises(ValueError):
            incremental.replay_through(3)
        incremental.close()


def test_replayer_refuses_a_file_it_did_not_create(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    image = _plain(tmp_path / "user.img", b"\0" * 40 * SS)
    with LogReader(str(log)) as reader, pytest.raises(RefusedError):
        Replayer(reader, str(image))


def test_find_mark(tmp_path: Path) -> None:
    log = _marks_log(tmp_path / "marks.log")
    with LogReader(str(log)) as reader:
        assert find_mark(reader, "m2") == 4
        assert find_mark(reader, END_MARK, start=5) == 6
        with pytest.raises(UsageError, match="no mark 'm3'"):
            find_mark(reader, "m3")


# --- replay-log -------------------------------------------------------------------


def test_find_end_mark_and_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _marks_log(tmp_path / "marks.log")
    proc = _powercut("replay-log", "--log", log, "--find", "--end-mark", "m2")
    assert (proc.returncode, proc.stdout) == (0, "4@8\n")
    assert _main(capsys, "replay-log", "--log", log, "--find", "--limit", "3", "--start-entry", "1")[:2] == (0, "3@7\n")


def test_find_flag_stops_and_the_end_mark_quirk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _marks_log(tmp_path / "marks.log")
    assert _main(capsys, "replay-log", "--log", log, "--find", "--next-flush")[:2] == (0, "3@7\n")
    # replay-log's should_stop: with an end mark, a flush alone does not stop.
    assert _main(capsys, "replay-log", "--log", log, "--find", "--next-flush", "--end-mark", "m2")[:2] == (0, "4@8\n")
    assert _main(capsys, "replay-log", "--log", log, "--find", "--start-mark", "m2", "--limit", "0x1")[:2] == (0, "5@10\n")
    assert _main(capsys, "replay-log", "--log", log, "--num-entries")[:2] == (0, "7\n")
    assert _main(capsys, "replay-log", "--log", log)[:2] == (0, "Log version=1, sectorsize=512, entries=7\n")



def test_replay_limit_start_mark_end_mark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _marks_log(tmp_path / "marks.log")
    empty = b"\0" * SS
    assert _main(capsys, "replay-log", "--log", log, "--replay", tmp_path / "limit.img", "--limit", "2")[0] == 0
    assert _sectors(tmp_path / "limit.img") == [b"A" * SS, empty, empty]
    proc = _powercut("replay-log", "--log", log, "--replay", tmp_path / "marks.img", "--start-mark", "m1", "--end-mark", "m2")
    assert proc.returncode == 0 and _sectors(tmp_path / "marks.img") == [empty, b"B" * SS, empty]
    # The same target continues where it was: replay-log's incremental use.
    rc, out, _ = _main(capsys, "replay-log", "--log", log, "--replay", tmp_path / "marks.img", "--start-mark", "m2", "-v")
    assert rc == 0 and _sectors(tmp_path / "marks.img") == [empty, b"B" * SS, b"C" * SS]
    assert out.splitlines() == [
        "replaying 5@9: sector 2, size 512, flags 0x0(NONE)",
        "replaying 6@11: sector 0, size 0, flags 0x8(MARK)",
    ]


def test_no_discard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    image = _owned_image(tmp_path / "img", 40 * SS, fill=b"\xff")
    assert _main(capsys, "replay-log", "--log", log, "--replay", image, "--no-discard")[0] == 0
    assert _sectors(image)[32] == b"\xff" * SS


def test_refuses_file_not_created_by_powercut(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    with open(tmp_path / "user.img", "wb") as f:
        f.write(b"precious")
    _assert_one_line_error(_powercut("replay-log", "--log", log, "--replay", tmp_path / "user.img"), "not created by powercut")
    assert (tmp_path / "user.img").read_bytes() == b"precious"


def test_refuses_to_replay_onto_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _marks_log(tmp_path / "marks.log")  # LogWriter made it: powercut-owned
    rc, _, err = _main(capsys, "replay-log", "--log", log, "--replay", log)
    assert rc == 2 and "it is the log" in err


def test_refuses_dev_null(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    _assert_one_line_error(_powercut("replay-log", "--log", log, "--replay", "/dev/null"), "not a regular file")


def test_fsck_failure_exits_1_at_first_check(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    image = tmp_path / "img"
    proc = _powercut("replay-log", "--log", log, "--replay", image, "--check", "1", "--fsck", "false")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["powercut: fsck failed after entry 0 (exit status 1)"]
    sectors = _sectors(image)
    assert sectors[8] == b"A" * SS and sectors[16] == b"\0" * SS  # stopped right after entry 0


def test_fsck_runs_at_every_check_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    calls = tmp_path / "calls"
    fsck = f"echo x >> {calls}"
    assert _main(capsys, "replay-log", "--log", log, "--replay", tmp_path / "a.img", "--check", "flush", "--fsck", fsck)[0] == 0
    assert calls.read_text().count("x") == 1
    assert _main(capsys, "replay-log", "--log", log, "--replay", tmp_path / "b.img", "--check", "2", "--fsck", fsck)[0] == 0
    assert calls.read_text().count("x") == 1 + 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--check", "0", "--fsck", "true"], "--check takes a number >= 1"),
        (["--check", "1"], "--fsck and --check go together"),
        (["--limit", "ten"], "--limit 'ten' is not a number"),
        (["--start-sector", "x"], "--start-sector 'x' is not a number"),
    ],
)
def test_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    rc, _, err = _main(capsys, "replay-log", "--log", log, *args)
    assert rc == 2 and err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--start-entry", "6"], "--start-entry 6: the log has 6 entries"),
        (["--start-mark", "nope"], "no mark 'nope'"),
        (["--start-mark", "nope", "--replay", "never.img"], "no mark 'nope'"),
        (["--find", "--end-mark", "nope"], "no entry from 0 on meets the stop condition"),
        (["--find", "--next-flush", "--start-entry", "2"], "no entry from 2 on meets the stop condition"),
    ],
)
def test_not_in_the_log_exits_1_like_replay_log(tmp_path: Path, args: list[str], message: str) -> None:
    """xfstests' replay-log exits 1 when a mark or entry is missing or nothing meets --find's condition."""
    log = _plain(tmp_path / "golden.log", GOLDEN)
    proc = subprocess.run([str(POWERCUT), "replay-log", "--log", str(log), *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1 and message in proc.stderr
    assert not (tmp_path / "never.img").exists()


def test_start_and_end_sector_skip_writes_outside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """log_should_skip: a write ending at or before --start-sector or starting after --end-sector is skipped;
    discards are not (replay-log zeroes them before it looks at the range)."""
    with LogWriter(str(tmp_path / "s.log"), SS) as w:
        w.write(0, b"A" * SS)            # 0: ends at sector 1 <= start 1: skipped
        w.write(1, b"B" * 2 * SS)        # 1: sectors 1-2: replayed
        w.write(3, b"C" * SS)            # 2: starts at 3 = end: replayed (the end is inclusive)
        w.write(4, b"D" * SS)            # 3: starts after 3: skipped
        w.discard(0, 1)                  # 4: outside, still zeroes sector 0
        w.mark("m")                      # 5: no sectors: never skipped
    image = _owned_image(tmp_path / "img", 6 * SS, fill=b"\xee")
    rc, out, _ = _main(capsys, "replay-log", "--log", tmp_path / "s.log", "--replay", image,
                       "--start-sector", "1", "--end-sector", "0x3", "-vv")
    assert rc == 0
    assert _sectors(image) == [b"\0" * SS, b"B" * SS, b"B" * SS, b"C" * SS, b"\xee" * SS, b"\xee" * SS]
    assert out.splitlines() == [
        "skipping 0@2: sector 0, size 512, flags 0x0(NONE)",
        "replaying 1@4: sector 1, size 1024, flags 0x0(NONE)",
        "replaying 2@7: sector 3, size 512, flags 0x0(NONE)",
        "skipping 3@9: sector 4, size 512, flags 0x0(NONE)",
        "skipping 4@11: sector 0, size 512, flags 0x4(DISCARD)",
        "replay device doesn't support discard, switching to writing zeros",
        "replaying 5@12: sector 0, size 0, flags 0x8(MARK)",
        "replaying 6@13: sector 0, size 0, flags 0x8(MARK)",
    ]
    # --limit counts skipped entries too: the first two entries are entry 0 (skipped) and entry 1.
    image2 = _owned_image(tmp_path / "img2", 6 * SS)
    assert _main(capsys, "replay-log", "--log", tmp_path / "s.log", "--replay", image2, "--start-sector", "1",
                 "--limit", "2", "-v")[:2] == (0, "replaying 1@4: sector 1, size 1024, flags 0x0(NONE)\n")


def test_a_discard_chunk_over_128_mib_is_not_zeroed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """replay-log on a target that cannot discard zeroes 1 GiB chunks and leaves those over 128 MiB alone."""
    mib = 1 << 20
    sectors = lambda n: n // SS  # noqa: E731
    with LogWriter(str(tmp_path / "d.log"), SS) as w:
        w.discard(0, sectors(128 * mib))                       # 0: exactly 128 MiB: zeroed
        w.discard(sectors(200 * mib), sectors(129 * mib))      # 1: 129 MiB: left alone
        w.discard(sectors(400 * mib), sectors(1024 * mib + mib))  # 2: 1 GiB chunk left alone, 1 MiB tail zeroed
    size = 1500 * mib
    image = tmp_path / "img"
    fd = create_file(str(image), size)
    for off in (0, 128 * mib - SS, 200 * mib, 329 * mib - SS, 400 * mib, 1424 * mib - SS, 1424 * mib, 1425 * mib - SS):
        os.pwrite(fd, b"\xab" * SS, off)
    os.close(fd)
    rc, out, _ = _main(capsys, "replay-log", "--log", tmp_path / "d.log", "--replay", image, "-v")
    assert rc == 0
    assert out.splitlines()[1:2] == ["replay device doesn't support discard, switching to writing zeros"]
    assert [line for line in out.splitlines() if line.startswith("discard len")] == [
        f"discard len {129 * mib} larger than max {128 * mib}", f"discard len {1024 * mib} larger than max {128 * mib}"]
    with open(image, "rb") as f:
        def at(off: int) -> bytes:
            f.seek(off)
            return f.read(SS)
        assert at(0) == at(128 * mib - SS) == b"\0" * SS                       # zeroed
        assert at(200 * mib) == at(329 * mib - SS) == b"\xab" * SS             # too big: kept
        assert at(400 * mib) == at(1424 * mib - SS) == b"\xab" * SS            # the 1 GiB chunk: kept
        assert at(1424 * mib) == at(1425 * mib - SS) == b"\0" * SS             # its 1 MiB tail: zeroed
    # The crash walk's replayer (no zero limit) zeroes everything.
    fd = create_file(str(tmp_path / "walk.img"), size)
    os.pwrite(fd, b"\xab" * SS, 200 * mib)
    with LogReader(str(tmp_path / "d.log")) as reader, Replayer(reader, fd) as replayer:
        while replayer.apply_next():
            pass
    assert os.pread(fd, SS, 200 * mib) == b"\0" * SS
    os.close(fd)


def test_log_dump(tmp_path: Path) -> None:
    log = _plain(tmp_path / "golden.log", GOLDEN)
    proc = _powercut("log", "dump", log, "--data")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0] == f"log {log}: version=1 sectorsize=512 nr_entries=6"
    assert lines[1].startswith("0 sector=8 nr_sectors=1 flags=NONE sha256=")
    assert lines[3:] == [
        "2 sector=16 nr_sectors=2 flags=FUA|METADATA sha256=" + lines[3].rsplit("=", 1)[1],
        "3 sector=32 nr_sectors=8 flags=DISCARD",
        '4 sector=0 nr_sectors=0 flags=MARK mark="synced"',
        '5 sector=0 nr_sectors=0 flags=MARK mark="dm-log-writes-end"',
    ]


def test_sparse_replay_of_large_writes_equals_plain_replay(tmp_path: Path) -> None:
    """Writes of 1 MiB and more go from the log to a sparse target in the kernel, the log's
    holes (a recorder stores zeros as holes) punched: the same bytes as reading them."""
    from foundation.sparse import data_extents, punch_hole
    log = str(tmp_path / "big.log")
    mib = 1 << 20
    zeros, junk = bytes(2 * mib), bytes(range(256)) * (mib // 256)
    with LogWriter(log, SS) as w:
        w.write(0, zeros + junk, 0)                       # 3 MiB: 2 of zeros, then data
        w.write(mib // SS, junk[: mib // 2] + bytes(mib // 2) + junk, FUA)   # over both
        w.write(8 * mib // SS, bytes(mib), 0)             # all zeros
        w.write(9 * mib // SS, junk[:SS], 0)              # a small one, the old way
    with LogReader(log) as reader, open(log, "r+b") as f:  # the zeros of the data as holes
        for e in reader.entries():
            data = reader.read_data(e)
            first = -(-e.data_offset // 4096) * 4096
            for at in range(first, e.data_offset + len(data) - 4095, 4096):
                if data[at - e.data_offset:at - e.data_offset + 4096] == bytes(4096):
                    punch_hole(f.fileno(), at, 4096)
        assert sum(n for _, n in data_extents(f.fileno(), os.fstat(f.fileno()).st_size)) < 4 * mib
    images = {}
    for sparse in (False, True):
        image = _owned_image(tmp_path / f"img{sparse}", 10 * mib, fill=b"\xaa")
        with LogReader(log) as reader, Replayer(reader, str(image), sparse=sparse) as replayer:
            replayer.replay_through(reader.nr_entries - 1)
        images[sparse] = image.read_bytes()
        if sparse:   # the zeros written became holes, the untouched junk stayed data
            with open(image, "rb") as f:
                held = sum(n for _, n in data_extents(f.fileno(), 10 * mib))
            assert held <= 10 * mib - 5 * mib // 2 + (64 << 10)   # [0,1M), [1.5M,2M), [8M,9M) (+ fs rounding)
    assert images[True] == images[False]
    assert images[True][:mib] == images[True][3 * mib // 2:2 * mib] * 2 == bytes(mib)
    assert images[True][mib:mib + 16] == junk[:16] and images[True][8 * mib:9 * mib] == bytes(mib)
