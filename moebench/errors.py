"""The one exception type that means "the user asked for something we cannot do".

The CLI turns it into one line on stderr and exit code 2; anything else is a bug and
keeps its traceback.
"""


class UserError(ValueError):
    """A mistake in what the user asked for: bad shape, bad file, bad flag value."""
