"""The one error a user can fix: a file, a line or a setting, said in one line.

Training, pretraining, export and the sweep raise `UserFacingError` for everything a user causes (a bad row,
undecodable bytes, a missing column, a base that is not a checkpoint, a setting the base cannot honour, a full
disk). The command line prints its message as one line and exits 2, without a traceback; `BERTH_DEBUG=1` shows
the traceback too. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserFacingError(ValueError):
    """A problem the user can fix; its message names the file, line or setting and what to do."""


class TrainingDiverged(UserFacingError):
    """A loss or a gradient norm that is not finite (nan, inf), more often than the settings allow."""
