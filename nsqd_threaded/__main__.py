"""``python -m nsqd_threaded``: the ``nsqd-threaded`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="nsqd-threaded")
