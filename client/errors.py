"""The client library's one error."""


class ClientError(Exception):
    """A problem the operator can fix; printed as one line."""
