"""The fuzz engines: importing this registers each (fuzz/engine.py), in this order.

A new engine is one module that ends with `register_engine(...)` and one line here.
"""

from __future__ import annotations

from fuzz.engine import ENGINES, FuzzEngine, default_engine, engine, engine_options, option_groups  # noqa: F401
# Registration, in this order:
from fuzz import engine_hypothesis as _hypothesis  # noqa: F401,E402
from fuzz import engine_exhaustive as _exhaustive  # noqa: F401,E402
from fuzz import engine_mixed as _mixed  # noqa: F401,E402
from fuzz import engine_afl as _afl  # noqa: F401,E402
from fuzz import engine_coverage as _coverage  # noqa: F401,E402
