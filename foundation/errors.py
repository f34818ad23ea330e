"""Errors that end a powercut command with a one-line message.

UsageError and EnvError exit 2 (bad input, missing tool, refused target);
anything found in a file system is not an error but a finding (exit 1).
"""


class PowercutError(Exception):
    """Base: printed as one line `powercut: <message>`, exit code 2."""

    exit_code = 2


class UsageError(PowercutError):
    """Bad arguments or malformed input (workload, log, options)."""


class EnvError(PowercutError):
    """The machine lacks something: a tool, a kernel feature, permissions."""


class RefusedError(PowercutError):
    """A target powercut did not create: never touched."""


class Terminated(PowercutError):
    """SIGTERM, turned into an exception so every teardown path runs."""

    exit_code = 143


class KernelFailure(PowercutError):
    """The kernel under test died or hung while running the workload (a vm guest).
    Not an error of the run: the pipeline turns it into a `kernel` finding."""

    def __init__(self, event: dict[str, str]) -> None:
        super().__init__(f"guest kernel {event['event']} during the {event['phase']}: {event['line']}")
        self.event = event
