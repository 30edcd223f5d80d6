"""Reading a run-contract file: ``load_contract(path)`` and ``parse_contract(text)``."""

import os
import re
import tomllib
from typing import NoReturn

from ..errors import ContractFileError
from ._lines import key_lines, line_of
from ._records import MAX_CONTRACT_BYTES, Path, SessionContract, build_contract

__all__ = ["load_contract", "parse_contract"]


def load_contract(path: str) -> SessionContract:
    """Read and validate the run-contract file at ``path`` (``ContractFileError`` if it cannot be used)."""
    source = os.path.basename(path) or path
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONTRACT_BYTES + 1)
    except OSError as exc:
        raise ContractFileError(source, None, f"cannot read the contract file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONTRACT_BYTES:
        raise ContractFileError(source, None, f"the contract file is larger than {MAX_CONTRACT_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ContractFileError(source, line, "the contract file is not UTF-8 text") from None
    return parse_contract(text, source=source, base_dir=os.path.dirname(os.path.abspath(path)))


def parse_contract(text: str, *, source: str = "<contract>", base_dir: str) -> SessionContract:
    """Validate a run contract given as TOML text; relative paths start at ``base_dir``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(found.group(1)) if found else None
        raise ContractFileError(source, line, f"not valid TOML: {re.sub(r' [(]at line .*[)]$', '', message)}") from None
    lines = key_lines(text)

    def fail(path: Path, message: str) -> NoReturn:
        raise ContractFileError(source, line_of(lines, path), message)

    return build_contract(data, os.path.abspath(base_dir), fail)
