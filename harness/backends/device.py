"""The recorded block device: one interface, one implementation per backend.

A backend makes a block device whose completed writes, flushes and discards
are appended to a log in the dm-log-writes format, and lets callers put
marks into that log in order with the writes. Everything above this
interface (mkfs, mount, workloads, crash checking) is backend agnostic.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from types import TracebackType

from foundation.runstate import RunState


class RecordedDevice(ABC):
    """A block device of SIZE bytes being recorded into LOG_PATH."""

    name: str = ""

    def __init__(self, state: RunState, size_bytes: int, log_path: str, *,
                 sector_size: int = 512, fault: str | None = None,
                 initial_image: str | None = None, tag: str = "") -> None:
        self.state = state
        self.size_bytes = size_bytes
        self.log_path = log_path
        self.sector_size = sector_size
        self.fault = fault
        # Start from this image instead of a zeroed device (recording a
        # recovery mount of a crash image); TAG keeps several devices of one
        # run apart (their files and mount points).
        self.initial_image = initial_image
        self.tag = tag
        self._mark_fd: int | None = None

    @property
    @abstractmethod
    def block_device(self) -> str:
        """Path of the recorded block device (valid between start and stop)."""

    @property
    @abstractmethod
    def mark_file(self) -> str:
        """A file where each write() call adds one mark to the log."""

    @abstractmethod
    def start(self) -> None:
        """Create the device; recording starts now."""

    @abstractmethod
    def stop(self) -> str:
        """Remove the device, finish the log and return its path."""

    def final_image(self) -> str | None:
        """After stop: a file holding the device's final content, if the backend has one."""
        return None

    def scratch_files(self) -> list[str]:
        """After stop: the files the device made in the scratch directory (besides the log),
        for a caller that throws the recording away (the calibration)."""
        image = self.final_image()
        return [image] if image else []

    def mark(self, text: str) -> None:
        """Add a mark to the log, ordered after every write completed so far."""
        if self._mark_fd is None:
            self._mark_fd = os.open(self.mark_file, os.O_WRONLY)
        os.write(self._mark_fd, text.encode())

    def close_mark_fd(self) -> None:
        if self._mark_fd is not None:
            os.close(self._mark_fd)
            self._mark_fd = None

    def __enter__(self) -> "RecordedDevice":
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close_mark_fd()
        if et is None:
            return
        # On failure the run's state journal tears everything down (caller).
