"""User-facing errors.

Every mistake a user can make (a bad flag, a missing file, a malformed dataset)
is raised as :class:`BSIError` with a one-line message that says what to change.
The CLI prints that line and exits with status 2, without a traceback; anything
else escaping is a bug in bsi.
"""


class BSIError(ValueError):
    """A problem with the user's input, explained in one line."""
