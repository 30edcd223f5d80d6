"""The machine-readable run contract: a TOML file (``templates/run-contract.toml``) read with ``tomllib``.

A checkpointed session (``longrun init`` ... ``longrun done``) starts from one of these files. It
says what the task is for (goal, non-goals), what it may do (allowed and forbidden actions), when
it is done (completion evidence), its bounded steps in order (each with the artifact it produces,
its one next action, whether it needs approval), its limits and its stop rules. The fields are the
ones ``templates/run-contract.md`` describes for people.

``load_contract(path)`` either returns a fully validated ``SessionContract`` or raises
``ContractFileError`` naming the file and the line that holds the problem: a syntax error, an
unknown key, a value of the wrong type, an action both allowed and forbidden, a step whose action
is not allowed, duplicate step ids, completion evidence naming no step. Nothing is written.

``SessionContract.to_json()`` is the normalized form a task records (paths made absolute, a
command string turned into ``["sh", "-c", string]``, defaults filled in); ``from_json`` reads it
back with the same checks, raising ``CorruptStateError``. Its ``digest`` is what a task's plan
digest, and so every approval, binds to.

Not guaranteed: that a command or path in the contract is safe or exists; the contract only says
what the session may do, and ``longrun exec`` checks each step against it.

The package's modules: ``_records`` (the contract's records and the one validation both the TOML
file and the recorded JSON go through), ``_load`` (reading the file) and ``_lines`` (the line each
key is written on, for the errors).
"""

from __future__ import annotations

from ..errors import ContractFileError
from ._load import load_contract, parse_contract
from ._records import (
    CONTRACT_VERSION,
    DECISION_PREFIX,
    FIELDS as FIELDS,
    MAX_CONTRACT_BYTES,
    ContractLimits,
    ContractStep,
    SessionContract,
)

__all__ = [
    "CONTRACT_VERSION",
    "DECISION_PREFIX",
    "ContractFileError",
    "ContractLimits",
    "ContractStep",
    "MAX_CONTRACT_BYTES",
    "SessionContract",
    "load_contract",
    "parse_contract",
]
