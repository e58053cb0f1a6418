"""The one exception type that means "the user asked for something we cannot do".

The CLI turns it into one line on stderr and exit code 2; anything else is a bug and
keeps its traceback.
"""

import re

# C0 and C1 controls (a NEL, \x85, ends a line for str.splitlines) and the Unicode line and
# paragraph separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with each character that could end a line or does not print shown as its escape."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class UserError(ValueError):
    """A mistake in what the user asked for: bad shape, bad file, bad flag value. Its message is
    always one line: a control character quoted from the input (a newline in a file's shape
    name) is shown escaped, so it cannot break the line or forge another."""

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        super().__init__(one_line(text), *args)
