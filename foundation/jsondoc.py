"""Whole JSON documents (report.json, finding.json, campaign config): written
to a temporary name and renamed, so a reader or a kill -9 never sees half of one."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str, obj: Any, *, indent: int = 2) -> str:
    """Write OBJ to PATH atomically (same directory, then rename); returns PATH."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
