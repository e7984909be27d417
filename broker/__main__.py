"""``python -m broker``: the ``broker`` command (``broker.cli``)."""

from broker.cli import main

if __name__ == "__main__":
    main()
