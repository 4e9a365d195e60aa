"""Which `requests` exceptions mean an HTTP transfer broke: the peer could not be reached, did not
answer in time, or stopped in the middle of its answer.

The last kind is easy to miss: requests raises it while reading the body (a connection reset or
closed before the Content-Length was reached, a compressed body that ends early), and it is not a
`requests.ConnectionError`. A WAA server or VM that stops while answering, or a file host that
drops a download, produces it. Every one of them is the network's or the peer's failure, never the
task's (adapters/outcomes.py, R1, R6, R9). Kept apart from adapters/outcomes.py so the WAA client
can use it without importing the outcome vocabulary (and pydantic with it).
"""

from __future__ import annotations

import requests

ANSWER_CUT_SHORT: tuple[type[requests.RequestException], ...] = (
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
)
BROKEN_TRANSFER: tuple[type[requests.RequestException], ...] = (
    requests.ConnectionError,
    requests.Timeout,
    *ANSWER_CUT_SHORT,
)
