"""The operator command line: ``longrun ls | status | history | verify | watch | console | approve | answer | cancel | repair | resume | start | demo``, and a session's ``init | next | exec | checkpoint | done | stop`` (and ``mcp``, which serves them as MCP tools).

The only part of longrun that prints. Every command but ``resume`` and ``demo`` works on a store
named by the operator: a JSON-file store directory, ``sqlite:PATH`` or a ``postgresql://`` URL,
given as the ``STORE`` argument or with ``--store SPEC`` (never created by the CLI). ``ls``,
``status``, ``history``, ``verify`` and ``watch`` (a live view that polls the store) are
read-only; ``approve``, ``answer`` and ``cancel`` write one control record each; ``console``
serves a local web console that shows the store and writes the same records; ``repair --lease``
sets a damaged lease record aside and writes a released lease; ``resume MODULE:FUNCTION`` imports a function that builds a ``Runner`` and runs it
once (the recovery trigger for cron or systemd); ``demo`` runs a fictional task through a real
SIGKILL and resume. ``init``, ``next``, ``exec``, ``checkpoint``, ``done`` and ``stop`` run a
checkpointed session for an agent with only a terminal (``_session``). Every command takes ``--json``.

Exit codes:

====  ==========================================================================================
code  meaning
====  ==========================================================================================
0     ok (``verify``: safe to resume now, or finished; ``resume``: done)
1     the run is not done, or not in the state the command needs (``verify``: resumable only
      after an operator acts; ``resume``: a later run or an operator continues it; ``repair``:
      refused, the lease record is not damaged or its holder is alive; ``demo``: a check failed)
2     usage or bad input: wrong arguments, unknown task, missing store, unsafe task id, a bad
      store spec; ``resume``: a bad ``MODULE:FUNCTION`` target or ``InvalidInputError``
3     storage error or damaged state (``verify``: damaged, with whether the backup validates)
4     ``verify`` and ``resume`` only: the run ended without finishing (cancelled,
      limits-exhausted, deadline-exceeded, blocked); running it again changes nothing
70    an unexpected exception, with its traceback: a bug in longrun, or under ``resume`` the
      task's own code raising inside ``run()``
130   interrupted (Ctrl-C)
====  ==========================================================================================

The per-command tables are in ``longrun verify --help``, ``longrun resume --help`` and
``longrun repair --help`` (and the docstrings of ``_verify`` and ``_resume``).
"""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
