"""CliError: the error whose message is the whole story for the user.

Its own small module so every command (and dashboard.py) can import it at
module level without importing the package's __init__ back.
"""


class CliError(Exception):
    """An error whose message is the whole story for the user."""
