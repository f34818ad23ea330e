"""Append-only JSON-lines journals that survive kill -9: each line is written
and fsync'd on its own, and a reader skips a last line cut short."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any


def append(path: str, obj: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(path: str) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by kill -9
