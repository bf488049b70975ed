"""The CLI's errors, in a module of their own so that every command raises the very classes
`services.cli.main` catches, also when the CLI runs as `python -m services.cli` (where
`services.cli` is loaded a second time, as `__main__`)."""
from __future__ import annotations


class CLIError(Exception):
    """A command-line request that cannot be carried out; the message names the culprit.
    Exit status 1 (a runtime failure)."""

    status = 1


class CLIUsageError(CLIError):
    """A request that is wrong as given (a bad argument, a file that is not what it should
    be): exit status 2, as for usage and configuration errors."""

    status = 2
