"""Errors a user can act on. The CLI prints their message (no traceback) and exits non-zero."""


class PolyrlError(Exception):
    """Base of every error whose message tells the user what is wrong and how to fix it."""


class ConfigError(PolyrlError):
    """The configuration is invalid; the message names the key, the value and the fix."""


class DataError(PolyrlError):
    """A data file is missing, unreadable or malformed; the message names file, row and column."""


class RewardError(PolyrlError):
    """Scoring failed and the run is configured to stop on reward errors."""
