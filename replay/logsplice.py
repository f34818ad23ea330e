"""Logs built from pieces: a file system made elsewhere, then a kernel's own log.

A live vm guest (harness/backends/vm/live.py) does not run mkfs for every workload:
the host makes the file system once per configuration and the guest starts
each recording on a copy of it. The recording's log must still rebuild
every state from a zeroed device, so the host writes the fresh image as log
entries (`image_prefix`: its data extents, a flush, the mkfs mark) and
`splice` puts the guest's entries after them. The result reads, replays
and re-checks like any other log.

`splice` can also drop the flushes of the kernel's log (FLUSH/FUA bits
cleared, empty flushes left out): the `drop-flush` test fault of the fuse
recorder, applied to the kernel's log, which makes crash states that the
replayer may reorder beyond what the file system waited for.
"""

from __future__ import annotations

import os

from foundation.errors import EnvError
from foundation.sparse import data_extents
from replay.logformat import FLUSH, FUA, HEADER, MAGIC, SUPER, VERSION, LogReader, LogWriter

CHUNK = 1 << 20  # entries of at most 1 MiB, like the block layer's requests


def image_prefix(image: str, out: str, mark: str, sectorsize: int = 512) -> int:
    """Write OUT: a log that writes IMAGE's data onto a zeroed device, flushes and marks MARK
    (no end mark). Returns its number of entries."""
    with open(image, "rb") as f, LogWriter(out, sectorsize) as w:
        size = os.fstat(f.fileno()).st_size
        for off, n in data_extents(f.fileno(), size, 0):
            for start in range(off, off + n, CHUNK):
                data = os.pread(f.fileno(), min(CHUNK, off + n - start), start)
                data += b"\0" * (-len(data) % sectorsize)
                w.write(start // sectorsize, data)
        w.flush()
        w.mark(mark)
        w.close(end_mark=False)
        return w.nr_entries


def _entries_end(reader: LogReader) -> int:
    last = None
    for last in reader.entries():
        pass
    return reader.sectorsize if last is None else last.next_offset(reader.sectorsize)


def splice(prefix: str | None, guest_log: str, out: str, *, drop_flush: bool = False) -> int:
    """Write OUT = PREFIX's entries (if any) followed by GUEST_LOG's; returns the entry count.
    The caller has checked that the kernel closed GUEST_LOG (harness/backends/dm/logdisk.py)."""
    with LogReader(guest_log) as reader, open(guest_log, "rb") as g:
        ss = reader.sectorsize
        n_guest, end = reader.nr_entries, _entries_end(reader)
        fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            n, offset = 0, ss
            if prefix is not None:
                with LogReader(prefix) as p:
                    if p.sectorsize != ss:
                        raise EnvError(f"{prefix}: sectorsize {p.sectorsize}, the guest's log has {ss}")
                    n, p_end = p.nr_entries, _entries_end(p)
                with open(prefix, "rb") as src:
                    _copy(src.fileno(), fd, ss, p_end - ss, offset)
                offset = p_end
            if not drop_flush:
                with open(guest_log, "rb") as src:
                    _copy(src.fileno(), fd, ss, end - ss, offset)
                n += n_guest
            else:
                for e in reader.entries():
                    flags = e.flags & ~(FLUSH | FUA)
                    if flags == 0 and e.nr_sectors == 0:
                        continue  # an empty flush: left out
                    header = bytearray(os.pread(g.fileno(), ss, e.header_offset))
                    HEADER.pack_into(header, 0, e.sector, e.nr_sectors, flags, e.data_len)
                    data = os.pread(g.fileno(), e.log_bytes(ss), e.data_offset)
                    os.pwrite(fd, bytes(header) + data, offset)
                    offset += ss + len(data)
                    n += 1
            os.pwrite(fd, SUPER.pack(MAGIC, VERSION, n, ss).ljust(ss, b"\0"), 0)
        finally:
            os.close(fd)
    return n


def _copy(src: int, dst: int, src_off: int, length: int, dst_off: int) -> None:
    # pread/pwrite, not copy_file_range: the guest's disks and the run directory
    # are usually on different file systems (tmpfs scratch, the output dir).
    done = 0
    while done < length:
        data = os.pread(src, min(CHUNK * 8, length - done), src_off + done)
        if not data:
            raise EnvError("short read while splicing a log")
        os.pwrite(dst, data, dst_off + done)
        done += len(data)
