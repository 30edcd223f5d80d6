"""The operator command line: ``longrun demo | status | approve | cancel | ls``.

The only part of longrun that prints. Every command works on a ``JsonFileStore`` directory;
``status`` and ``ls`` are read-only, ``approve`` and ``cancel`` write one control record each,
and ``demo`` runs a fictional task through a real SIGKILL and resume. Exit codes: 0 ok, 1 the
run is not done / not as the command needs (demo: a check failed), 2 usage or bad input,
3 storage error or damaged state (see ``longrun --help``).
"""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
