"""One option a plug-in takes, declared beside the plug-in's code (fio's `struct fio_option`:
`.name`, `.lname`, `.help`, `.type`), so the command line and its help come from it.

Backends (harness/backends/engine.py) and fuzz engines (fuzz/engine.py) declare
their options with this shape; the CLI turns each into one argparse argument
(cli/options.py `add_option`) and reads its value back under `key`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    key: str                      # the argparse dest, and the key in a saved config (finding.json, campaign.json)
    flag: str                     # the command-line flag, e.g. "--kernel"
    help: str                     # its line in --help
    default: Any = None           # not given
    type: Callable[[str], Any] | None = None   # argparse's conversion of the text (None: the text)
    metavar: str | None = None
    action: str | None = None     # argparse's: "store_true", "append"
    # The values it takes; a callable when they are only known once every plug-in registered.
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    needs: str = ""               # the one line for a user who gives it where it does not apply
    # Which commands take it: "" every one it belongs to; a tag ("test", "one-run") only those
    # that ask for that tag (cli/options.py add_backend_options).
    scope: str = ""
    # The given value -> the config's value, checked (UsageError); None: as given.
    parse: Callable[[Any], Any] | None = None

    def value(self, given: Any) -> Any:
        return self.parse(given) if self.parse is not None else given

    def argparse_kwargs(self) -> dict[str, Any]:
        """What `ArgumentParser.add_argument(self.flag, ...)` takes."""
        # argparse appends to the default itself: a fresh list each time, never the shared tuple
        default = list(self.default) if self.action == "append" else self.default
        kw: dict[str, Any] = {"dest": self.key, "default": default, "help": self.help}
        if self.action:
            kw["action"] = self.action
        if self.type is not None:
            kw["type"] = self.type
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        if self.choices is not None:
            kw["choices"] = self.choices() if callable(self.choices) else self.choices
        return kw
