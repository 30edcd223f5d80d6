"""Stores: where a task's lease, state and control records live. See ``base`` for the rules they share."""

from .base import BaseStore
from .jsonfile import JsonFileStore

__all__ = ["BaseStore", "JsonFileStore"]
