"""``python -m longrun``: the operator command line (see ``longrun.cli``)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
