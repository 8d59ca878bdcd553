"""``python -m kustos``: the ``kustos`` command (``kustos run`` is the operator)."""

from kustos.entry import main

main()
